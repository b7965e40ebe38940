"""How robust is the complementary-pool result of tests/test_complementary.py? The same 1,200 RouterBench rows and
4-agent pool, embedded by the bundled MiniLM in float32 and in bf16 (OpenVINO; bf16 needs a CPU with bf16 units, else
it runs float32 and the two rows agree), sep-CMA-ES seeds 42 (the default) and 1-4, 30 and 100 generations. Prints the
shipped prompt router (the head, or the kind the choice among kinds ships; scripts/router_kinds.py shows the head
beside it) against the best single agent with the paired 95 % CI of the gain (docs/training.md, "The complementary
pool").

    python scripts/complementary_spread.py
    python scripts/complementary_spread.py --backend torch --generations 30   # real bf16 math on any CPU

`--backend torch` embeds through PyTorch, whose CPU autocast computes in bfloat16 whether or not the CPU has bf16
units (slower without them): the bf16 rows then differ from the float32 ones on every machine.
"""
import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline.embed.backbone import Backbone, Runtime  # noqa: E402
from pipeline.report.suites import build_suite  # noqa: E402
from pipeline.route.fit import fit_router  # noqa: E402
from pipeline.route.train import TrainConfig  # noqa: E402

POOL = ["claude-v1", "gpt-3.5-turbo-1106", "zero-one-ai/Yi-34B-Chat", "mistralai/mixtral-8x7b-chat"]


def complementary_rows():
    """The rows of tests/test_complementary.py: up to 400 RouterBench queries per eval (seeded), the 4-agent pool.
    -> (prompts, rewards frame, split, each row's eval, quality matrix)."""
    s = build_suite("routerbench")
    ev = np.array(s.meta["per_query"]["eval_name"])
    rng = np.random.default_rng(0)
    keep = np.sort(np.concatenate([rng.choice(np.flatnonzero(ev == e), min(400, int((ev == e).sum())), replace=False)
                                   for e in sorted(set(ev))]))
    idx = [s.models.index(m) for m in POOL]
    Q, C = s.quality[keep][:, idx], s.cost[keep][:, idx]
    rewards = pd.DataFrame({"task_id": [s.query_ids[i] for i in keep], "agent_order": [POOL] * len(keep),
                            "mean_reward": list(Q), "mean_cost": list(C)})
    return [s.query_text[i] for i in keep], rewards, pd.Series(np.array(s.split)[keep]), ev[keep], Q


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="auto", help="the backbone's backend: auto (OpenVINO where installed), torch")
    ap.add_argument("--generations", default="30,100", help="sep-CMA-ES generations to try (comma-separated)")
    ap.add_argument("--seeds", default="42,1,2,3,4")
    args = ap.parse_args(argv)
    texts, rewards, split, evals, _ = complementary_rows()
    print("| embeddings | seed | generations | shipped router (kind) | best single | label router | kNN | "
          "gain CI (shipped − best) |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype in ("float32", "bfloat16"):
        bb = Backbone(None, max_seq_length=128, dtype=dtype, runtime=Runtime(backend=args.backend))
        X = bb.encode(texts)
        for seed in [int(x) for x in args.seeds.split(",")]:
            for gens in [int(x) for x in args.generations.split(",")]:
                fit = fit_router(X, rewards, split, TrainConfig(generations=gens, log_every=0, seed=seed),
                                 labels=evals)
                m, ci = fit.metrics, fit.extra["head_gain_ci"]
                print(f"| {bb.backend} {bb.precision} | {seed} | {gens} | {m['head']:.4f} "
                      f"({fit.extra['shipped']['kind']}) | {m['best_single']:.4f} | "
                      f"{fit.value['label_router']['quality']:.4f} | {m['knn']:.4f} | "
                      f"[{ci['low']:+.4f}, {ci['high']:+.4f}] |", flush=True)


if __name__ == "__main__":
    main()
