"""The one row bootstrap every interval of the project uses (pure numpy; below every stage that reports a CI)."""
from __future__ import annotations

import numpy as np


def bootstrap_means(x: np.ndarray, n_boot: int = 1000, seed: int = 0) -> np.ndarray:
    """Means of `n_boot` resamples (rows drawn with replacement) of `x` (the same seed gives the same resamples as
    drawing them one at a time)."""
    x = np.asarray(x, dtype=np.float64)
    return x[np.random.default_rng(seed).integers(0, x.size, (n_boot, x.size))].mean(axis=1)
