"""The cluster router's k search on the bundled MMLU-Pro recordings, side by side: its k-means on one thread (what
`ClusterRouter.fit` does) against the default BLAS / OpenMP threads, in wall and CPU seconds, with the k chosen.

    python bench/select_kinds.py [--rows 4000] [--backbone static]

Rows: the `mmlu_pro` pool's five replayed models graded on the first `rows` MMLU-Pro questions, split 60/20/20
(seeded); the router is fitted on the training rows. On a few shared cores the default threads spin more than they
compute: that gap is what the one-thread search removes. Quote `uptime` with the figures.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.collect.grading import grade  # noqa: E402
from pipeline.route import cluster  # noqa: E402
from pipeline.tasks.sources import load_source  # noqa: E402
from resources.pool import PoolResource  # noqa: E402


def matrix(rows: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(prompts, rewards (n, 5), split) of the first `rows` MMLU-Pro questions every mmlu_pro model answered."""
    pool = PoolResource(kind="replay", pool="mmlu_pro")
    agents, store = pool.agents(), pool.store()
    prompts, R = [], []
    for t in load_source("mmlu_pro").itertuples():
        texts = [store.text_for(a.model, t.prompt) for a in agents]
        if all(texts):
            prompts.append(t.prompt)
            R.append([float(grade(x, t.gold, t.grader)[1]) for x in texts])
        if len(prompts) >= rows:
            break
    split = np.random.default_rng(0).choice(["train", "validation", "test"], len(R), p=[0.6, 0.2, 0.2])
    return prompts, np.asarray(R, np.float32), split


def timed(X: np.ndarray, R: np.ndarray) -> tuple[float, float, int]:
    w, c = time.perf_counter(), time.process_time()
    k = cluster.ClusterRouter().fit(X, R).k_
    return time.perf_counter() - w, time.process_time() - c, int(k)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--backbone", default="static")
    a = ap.parse_args(argv)
    from pipeline.embed.backbone import Backbone, EmbeddingCache
    from resources.storage import default_home

    prompts, R, split = matrix(a.rows)
    X = EmbeddingCache(Path(default_home()) / "embeddings").get_or_compute(prompts, Backbone(a.backbone))
    tr = split == "train"
    one = timed(X[tr], R[tr])

    class Unlimited:  # the default threads: threadpool_limits(1) made a no-op
        def __init__(self, *_):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *_):
            return False

    with mock.patch.object(cluster, "threadpool_limits", Unlimited):
        default = timed(X[tr], R[tr])
    print(f"cluster router k search on {int(tr.sum())} MMLU-Pro training rows ({a.backbone} backbone)")
    for name, (wall, cpu, k) in (("one thread (shipped)", one), ("default threads", default)):
        print(f"  {name:22s} wall {wall:7.1f} s  cpu {cpu:7.1f} s  k={k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
