"""The row bootstrap (pipeline/core/bootstrap.py): the resamples of a (rows, resamples, seed) are drawn once for the
hundreds of intervals a λ path asks for, and give the means that drawing them every time gives."""
from __future__ import annotations

import numpy as np

from pipeline.core import bootstrap
from pipeline.core.bootstrap import bootstrap_means


def test_intervals_over_the_same_rows_draw_their_resamples_once_and_mean_the_same(monkeypatch):
    rng = np.random.default_rng(3)
    x, y = rng.random(500), rng.random(500)
    fresh = [np.random.default_rng(s).integers(0, 500, (200, 500)) for s in (0, 1)]
    draws = []
    real = np.random.default_rng

    def counting(seed):
        draws.append(seed)
        return real(seed)

    monkeypatch.setattr(bootstrap.np.random, "default_rng", counting)
    first, again, other = bootstrap_means(x, 200, 0), bootstrap_means(y, 200, 0), bootstrap_means(x, 200, 1)
    assert np.array_equal(first, x[fresh[0]].mean(axis=1)) and np.array_equal(again, y[fresh[0]].mean(axis=1))
    assert np.array_equal(other, x[fresh[1]].mean(axis=1))
    assert draws.count(0) <= 1 and draws.count(1) <= 1  # x and y share seed 0's resamples
    monkeypatch.setattr(bootstrap, "CACHED_DRAWS", 10)  # too many rows to keep: drawn each time, same means
    assert np.array_equal(bootstrap_means(x, 200, 0), first)
