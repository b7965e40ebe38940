"""Routers: heads, kNN and cluster routers, cascades, sep-CMA-ES training, fitting, OOD guard, targets, registry."""
