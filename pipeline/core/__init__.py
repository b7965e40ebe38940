"""Shared plumbing: errors, atomic IO, prompts, profiles (typed config), progress, secrets, input guards."""
