"""The one row bootstrap every interval of the project uses (pure numpy; below every stage that reports a CI).

A λ path or a cascade search asks for hundreds of intervals over the same rows with the same seed: the resample
indices are drawn once per (rows, resamples, seed) and kept (`_resamples`, up to `CACHED_DRAWS` indices), since
drawing them cost twice the means themselves. The means are the same as drawing them every time."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

CACHED_DRAWS = 16_000_000  # indices kept (128 MB): 1,000 resamples of 16,000 rows


@lru_cache(maxsize=2)
def _resamples(n: int, n_boot: int, seed: int) -> np.ndarray:
    idx = np.random.default_rng(seed).integers(0, n, (n_boot, n))
    idx.setflags(write=False)
    return idx


def bootstrap_means(x: np.ndarray, n_boot: int = 1000, seed: int = 0) -> np.ndarray:
    """Means of `n_boot` resamples (rows drawn with replacement) of `x` (the same seed gives the same resamples as
    drawing them one at a time)."""
    x = np.asarray(x, dtype=np.float64)
    draw = _resamples if x.size * n_boot <= CACHED_DRAWS else _resamples.__wrapped__
    return x[draw(x.size, int(n_boot), int(seed))].mean(axis=1)
