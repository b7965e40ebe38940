"""The prompt-router ablation (issue 28): router kind x pool x selection method, measured on held-out test rows.

Pools:
  * complementary -- tests/test_complementary.py's 1,200 RouterBench rows and 4-agent pool (rows and pool from
    scripts/complementary_spread.py), embedded by the bundled MiniLM (max_seq_length 128) in float32 and bf16 (bf16
    needs a CPU or GPU with bf16 units; elsewhere the backbone runs float32 and says so in the precision column),
    sep-CMA-ES seeds 42 and 1-4, 30 generations (the test's setting);
  * routerbench -- the RouterBench replication (`pipeline.report.replication.replicate`, the lineage's table: AIQ and
    quality at lambda 0 on its test split), embedded like the lineage (max_seq_length 256);
  * demo -- the default lineage's $ROUTER_LITE_HOME/reports/router_value.json (`router-lite run` first).

Selection methods: "validation" = the lineage's choice among kinds (pipeline/route/select.py; AIQ on validation in the
replication); the head with the early-stopping guard (keep_confidence 0.9, the default) and without it (0: any
validation gain replaces the start, the old rule). Test rows choose nothing.

    python scripts/router_kinds.py                 # prints the tables
    python scripts/router_kinds.py --write         # and writes them into docs/training.md between the markers

Embeddings are cached under $ROUTER_LITE_HOME/embeddings (a rerun embeds nothing). `--backend torch` embeds the
complementary pool through PyTorch, whose CPU autocast computes in bf16 on any CPU (OpenVINO needs bf16 units).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from complementary_spread import complementary_rows  # noqa: E402

from pipeline.embed.backbone import Backbone, EmbeddingCache, Runtime  # noqa: E402
from pipeline.route.fit import fit_router  # noqa: E402
from pipeline.route.train import TrainConfig  # noqa: E402

BEGIN, END = "<!-- router-kinds:begin (scripts/router_kinds.py) -->", "<!-- router-kinds:end -->"
SEEDS = (42, 1, 2, 3, 4)


def home() -> Path:
    from resources.storage import default_home

    return Path(os.environ.get("ROUTER_LITE_HOME") or default_home())


def embed(texts: list[str], **kw) -> tuple[np.ndarray, Backbone]:
    bb = Backbone(None, **kw)
    return EmbeddingCache(home() / "embeddings").get_or_compute(texts, bb), bb


def ci(c: dict) -> str:
    return f"{c['gain']:+.4f} [{c['low']:+.4f}, {c['high']:+.4f}]"


def complementary(seeds=SEEDS, generations: int = 30, backend: str = "auto") -> str:
    texts, rewards, split, evals, _ = complementary_rows()
    rows = ["| embeddings | seed | best single | label router | kNN | cluster (k) | head, guard 0.9 (gain CI) | "
            "head, no guard (gain CI) | shipped → test (the choice) |", "|---|---|---|---|---|---|---|---|---|"]
    worst, done, notes = {}, set(), []
    for dtype in ("float32", "bfloat16"):
        X, bb = embed(texts, max_seq_length=128, dtype=dtype, runtime=Runtime(backend=backend))
        if bb.cache_key in done:  # no bf16 units here: the backbone ran float32 again, the same rows
            notes.append(f"{dtype} asked, {bb.backend} {bb.precision} ran (no bf16 units on this machine): "
                         f"identical embeddings, rows not repeated")
            continue
        done.add(bb.cache_key)
        for seed in seeds:
            fit = fit_router(X, rewards, split, TrainConfig(generations=generations, log_every=0, seed=seed),
                             labels=evals)
            old = fit_router(X, rewards, split, TrainConfig(generations=generations, log_every=0, seed=seed,
                                                            keep_confidence=0.0, router="head", ship_gate=False),
                             labels=evals)
            k, s, m = fit.extra["kinds"], fit.extra["shipped"], fit.metrics
            head_ci = k["head"]
            rows.append(
                f"| {bb.backend} {bb.precision} | {seed} | {m['best_single']:.4f} | "
                f"{fit.value['label_router']['quality']:.4f} | {k['knn']['test']:.4f} | "
                f"{k['cluster']['test']:.4f} ({k['cluster']['k']}) | {head_ci['test']:.4f} "
                f"[{head_ci['test_gain_low']:+.4f}, {head_ci['test_gain_high']:+.4f}] | "
                f"{old.extra['kinds']['head']['test']:.4f} [{old.extra['kinds']['head']['test_gain_low']:+.4f}, "
                f"{old.extra['kinds']['head']['test_gain_high']:+.4f}] | {s['kind']} → {s['test']:.4f} (cross-fitted: "
                + ", ".join(f"{n} {v['crossfit']:.4f}" for n, v in k.items()) + "; validation: "
                + ", ".join(f"{n} {v['validation']:.4f}" for n, v in k.items()) + ") |")
            for name, q, low in (("head (guard)", head_ci["test"], head_ci["test_gain_low"]),
                                 ("shipped", s["test"], fit.extra["head_gain_ci"]["low"])):
                w = worst.get(name)
                if w is None or low < w[1]:
                    worst[name] = (q - m["best_single"], low)
            print(rows[-1], flush=True)
    summary = "; ".join([f"{n}: lowest test gain CI low {v[1]:+.4f}" for n, v in worst.items()] + notes)
    return (f"**Complementary pool** (tests/test_complementary.py's rows, test n={int((split == 'test').sum())}; "
            f"{generations} generations; test quality, the paired 95 % CI of the gain over the best single agent in "
            f"brackets; the label router knows each query's eval). {summary}.\n\n" + "\n".join(rows) + "\n")


def routerbench(guard_ablation: bool = True) -> str:
    from pipeline.report.replication import replicate
    from pipeline.report.suites import build_suite

    suite = build_suite("routerbench")
    X, bb = embed(suite.query_text, max_seq_length=256)
    out = []
    configs = [("guard 0.9 (default)", TrainConfig(log_every=0)),
               ("no guard", TrainConfig(log_every=0, keep_confidence=0.0))]
    for name, cfg in configs[:2 if guard_ablation else 1]:
        table, _ = replicate(suite, X, cfg)
        t = table.set_index("policy")
        val = table.attrs["validation_aiq"]
        shipped = next(p for p in t.index if p.startswith("shipped prompt router"))
        head = next(p for p in ("trained head", "trained head (score sweep)") if p in t.index)
        row = {"head": t.loc[head], "kNN": t.loc["kNN router"], "cluster": t.loc["cluster router"],
               "label router": t.loc["label router (per source)"], "shipped": t.loc[shipped]}
        out.append(f"| {name} | " + " | ".join(f"{r['aiq']:.4f} / {r['quality']:.4f}" for r in row.values())
                   + f" | {shipped.split('(')[1].split(',')[0]} (validation AIQ "
                   + ", ".join(f"{k.split()[0]} {v:.4f}" for k, v in val.items()) + ") |")
        print(out[-1], flush=True)
    return (f"**RouterBench replication** (test n={table.attrs['n_test']}, {bb.backend} {bb.precision}; test AIQ / "
            "quality at λ = 0; the shipped prompt router is the kind with the best validation AIQ):\n\n"
            "| trainer | head | kNN | cluster | label router (per source) | shipped | chosen |\n"
            "|---|---|---|---|---|---|---|\n" + "\n".join(out) + "\n")


def demo() -> str:
    f = home() / "reports" / "router_value.json"
    if not f.is_file():
        return f"**Demo**: no {f} (run `router-lite run` first).\n"
    rv = json.loads(f.read_text())
    if not rv.get("prompt_routers"):
        return f"**Demo**: {f} predates the prompt-router kinds (rerun `router-lite run`).\n"
    from pipeline.report.value import prompt_routers_markdown

    return (f"**Demo** (`router-lite run`, profile {rv['profile']}, test n={rv['n_test']}; best single "
            f"{rv['best_single']['agent']} {rv['best_single']['quality']:.4f}, label router "
            f"{rv['label_router'] if rv['label_router'] is None else round(rv['label_router'], 4)}):\n\n"
            + prompt_routers_markdown(rv["prompt_routers"], rv.get("shipped_prompt_router")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pools", default="demo,routerbench,complementary")
    ap.add_argument("--write", action="store_true", help="write the tables into docs/training.md")
    ap.add_argument("--no-guard-ablation", action="store_true", help="routerbench: the default trainer only")
    ap.add_argument("--backend", default="auto", help="the complementary pool's backbone backend (auto, torch)")
    args = ap.parse_args()
    run = {"demo": demo, "routerbench": lambda: routerbench(not args.no_guard_ablation),
           "complementary": lambda: complementary(backend=args.backend)}
    parts = [run[p]() for p in args.pools.split(",")]
    text = "\n".join(parts)
    print(text)
    if args.write:
        doc = ROOT / "docs" / "training.md"
        s = doc.read_text()
        if BEGIN not in s:
            raise SystemExit(f"{doc} has no {BEGIN} marker")
        s = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: f"{BEGIN}\n{text}\n{END}", s, flags=re.S)
        doc.write_text(s)


if __name__ == "__main__":
    main()
