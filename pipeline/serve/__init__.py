"""The OpenAI-compatible routing endpoint."""
