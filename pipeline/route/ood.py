"""Out-of-distribution guard: send queries unlike anything in training to the best single agent.

Distance of a query = mean cosine distance (1 − cos) to its `k` nearest training embeddings.  The threshold is
the `quantile` (default 0.99) of the same distance over the validation rows, which are in-distribution by
construction: so about 1 % of in-distribution queries trip the guard, and they merely fall back to the best single
agent (a safe choice).  `fire_rate(X)` reports the share of queries that would fall back.
"""
from __future__ import annotations

import numpy as np

from pipeline.core.errors import RouterLiteError
from pipeline.route.knn import _normalise, top_k_neighbours


class OODGuard:
    def __init__(self, k: int = 10, quantile: float = 0.99):
        if k < 1 or not 0 < quantile <= 1:
            raise RouterLiteError(f"OODGuard needs k >= 1 and 0 < quantile <= 1, got k={k}, quantile={quantile}")
        self.k, self.quantile = int(k), float(quantile)
        self.threshold: float | None = None

    def fit(self, X_train: np.ndarray, X_val: np.ndarray) -> OODGuard:
        X_train = np.asarray(X_train, dtype=np.float32)
        if X_train.ndim != 2 or len(X_train) == 0 or np.asarray(X_val).ndim != 2 or len(X_val) == 0:
            raise RouterLiteError("OODGuard.fit needs non-empty (n, d) training and validation embeddings")
        if np.asarray(X_val).shape[1] != X_train.shape[1]:
            raise RouterLiteError(f"OODGuard: validation dim {np.asarray(X_val).shape[1]} != training dim "
                                  f"{X_train.shape[1]}")
        self.X = _normalise(X_train)
        self.threshold = float(np.quantile(self.distance(X_val), self.quantile))
        return self

    def distance(self, X: np.ndarray) -> np.ndarray:
        """(n,) mean cosine distance of each query to its k nearest training embeddings."""
        _, sim = top_k_neighbours(X, self.X, self.k)
        return (1.0 - sim).mean(axis=1)

    def fires(self, X: np.ndarray) -> np.ndarray:
        if self.threshold is None:
            raise RouterLiteError("OODGuard is not fitted: call fit(X_train, X_val) first")
        return self.distance(X) > self.threshold

    def fire_rate(self, X: np.ndarray) -> float:
        return float(self.fires(X).mean()) if len(X) else 0.0

    def route(self, picks: np.ndarray, X: np.ndarray, fallback: int) -> np.ndarray:
        """Copy of `picks` with the guarded rows sent to agent index `fallback` (the best single agent)."""
        out = np.asarray(picks).copy()
        out[self.fires(X)] = int(fallback)
        return out
