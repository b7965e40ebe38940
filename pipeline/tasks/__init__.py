"""Task sources (normalised benchmark questions) and the task pool (balanced, seeded split)."""
