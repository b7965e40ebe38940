"""Routers: backbone embeddings, heads and kNN, sep-CMA-ES training, fitting, OOD guard, targets, registry."""
