"""A complementary pool: four RouterBench models that lead different evals (claude-v1 on
ARC-Challenge, gpt-3.5-turbo on MBPP, Yi-34B on Winogrande; mixtral nowhere). Here routing pays on quality: the head
must beat the best single agent and reach the per-eval label router (which knows each query's eval; the head sees
only the prompt)."""
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.embed.backbone import Backbone
from pipeline.route.fit import fit_router
from pipeline.route.train import TrainConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
try:  # the rows and the pool live with the script that measures their spread, so the two cannot drift apart
    from complementary_spread import POOL, complementary_rows
finally:
    sys.path.pop(0)

pytestmark = pytest.mark.slow


def test_head_reaches_the_label_router_on_a_complementary_pool():
    texts, rewards, split, ev, Q = complementary_rows()
    # float32, not the CPU's default precision: on bf16 embeddings two of five sep-CMA-ES seeds keep a validation
    # pick that loses on test (scripts/complementary_spread.py; docs/training.md, "The complementary pool")
    X = Backbone(None, max_seq_length=128, dtype="float32").encode(texts)
    fit = fit_router(X, rewards, split, TrainConfig(generations=30, log_every=0), labels=ev)
    te = (split == "test").to_numpy()
    leaders = {e: POOL[int(np.argmax(Q[~te & (ev == e)].mean(axis=0)))] for e in sorted(set(ev))}
    assert len(set(leaders.values())) == 3, leaders  # complementary: three different leaders
    head, best, label = fit.metrics["head"], fit.metrics["best_single"], fit.value["label_router"]["quality"]
    kinds, shipped = fit.extra["kinds"], fit.extra["shipped"]["chosen"]
    vs_label = fit.value["label_router"]["head_minus_label_router"]
    gaps = ", ".join(f"{k} {d['gain']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"
                     for k, d in ((k, v["minus_shipped"]) for k, v in kinds.items() if "minus_shipped" in v))
    print(f"complementary pool (test n={int(te.sum())}): head {head:.4f} | label router {label:.4f} | "
          f"kNN {fit.metrics['knn']:.4f} | best single {best:.4f}; shipped {shipped}; paired 95 % CI of each kind "
          f"minus the shipped one: {gaps}; shipped minus label router {vs_label['gain']:+.4f} "
          f"[{vs_label['low']:+.4f}, {vs_label['high']:+.4f}]")
    assert fit.extra["gate"]["shipped"] == "head"
    assert fit.extra["head_gain_ci"]["low"] > 0  # the head beats the best single agent beyond row noise
    assert head >= label - 0.015  # and reaches the label router (within a point and a half)
    # no other kind, and not the label router, is better than the shipped router beyond row noise (paired 95 % CI)
    assert all(v["minus_shipped"]["low"] <= 0 for v in kinds.values() if "minus_shipped" in v), gaps
    assert vs_label["high"] >= 0
