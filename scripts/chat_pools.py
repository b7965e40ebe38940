"""Which five of AlpacaEval's 12 recorded models make a `chat` pool where routing can matter? Every pool of the
reference (gpt4_1106_preview, which the recorded judge compares every reply with: its own reward is a 0.5 tie) and
4 of the other 11 models (330 pools), scored on the rows the `chat` profile puts in train and validation only (its
seeded split; the test rows are never looked at here), by a kNN prompt router (k=25, cross-fitted in 5 folds on
the bundled MiniLM's embeddings of the instruction) against the pool's best single agent:

- headroom: the oracle's judged quality minus the best single's (what a perfect router could add);
- the kNN's gain over the best single with a paired 95 % bootstrap CI (what a prompt router does add);
- the kNN's cost as a ratio of the best single's (costs as the replay prices them: characters / 4).

    python scripts/chat_pools.py            # prints the table and, last, one JSON line with the counts

Rewards are the recorded `preference` (data/alpaca_eval/records.parquet), costs config/prices.yaml's list prices.
"""
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline.core.prompts import task_texts  # noqa: E402
from pipeline.embed.backbone import Backbone  # noqa: E402
from pipeline.profile import load_profile  # noqa: E402
from pipeline.tasks.sources import load_source  # noqa: E402
from pipeline.tasks.task_pool import build_task_pool  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = "gpt4_1106_preview"


def matrices(pool: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(judged reward, estimated cost) per task row x model."""
    rec = pd.read_parquet(ROOT / "data/alpaca_eval/records.parquet")
    prices = {k: v for sec in yaml.safe_load((ROOT / "config/prices.yaml").read_text()).values()
              if isinstance(sec, dict) for k, v in sec.items()}
    rec["cost"] = [(len(i) / 4 * prices[m]["input"] + len(o) / 4 * prices[m]["output"]) / 1e6
                   for i, o, m in zip(rec.instruction, rec.output, rec.model)]
    ids = pool["question_id"].astype(int).to_numpy()
    q = rec.pivot(index="instruction_id", columns="model", values="preference").fillna(0.5).loc[ids]
    c = rec.pivot(index="instruction_id", columns="model", values="cost").loc[ids]
    return q.reset_index(drop=True), c.reset_index(drop=True)


def cross_fitted_knn(X: np.ndarray, Q: np.ndarray, k: int = 25, folds: int = 5, seed: int = 0) -> np.ndarray:
    """Each row's kNN pick, from the rows of the other folds (cosine on normalised embeddings)."""
    fold = np.random.default_rng(seed).integers(0, folds, len(X))
    pick = np.empty(len(X), dtype=int)
    for f in range(folds):
        ev, tr = fold == f, fold != f
        nn = np.argsort(-(X[ev] @ X[tr].T), axis=1)[:, :k]
        pick[ev] = Q[tr][nn].mean(axis=1).argmax(axis=1)
    return pick


def paired_ci(d: np.ndarray, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    boots = [d[rng.integers(0, len(d), len(d))].mean() for _ in range(2000)]
    return float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def main() -> None:
    profile = load_profile("chat")
    tasks = load_source("alpaca_eval")
    pool = build_task_pool(tasks, profile.task_pool)
    seen = pool["split"].isin(["train", "validation"]).to_numpy()
    Qall, Call = matrices(pool)
    X = Backbone(None, max_seq_length=256).encode(task_texts(pool[seen]))
    X = X / np.linalg.norm(X, axis=1, keepdims=True)
    rows, others = [], [m for m in Qall.columns if m != REFERENCE]
    for combo in itertools.combinations(others, 4):
        names = [REFERENCE, *combo]
        Q, C = Qall[names].to_numpy()[seen], Call[names].to_numpy()[seen]
        best = int(Q.mean(axis=0).argmax())
        pick = cross_fitted_knn(X, Q)
        got = Q[np.arange(len(Q)), pick]
        lo, hi = paired_ci(got - Q[:, best])
        rows.append({"pool": ", ".join(combo), "best single": names[best], "best q": Q[:, best].mean(),
                     "oracle": Q.max(axis=1).mean(), "kNN q": got.mean(), "gain": got.mean() - Q[:, best].mean(),
                     "CI low": lo, "CI high": hi,
                     "cost / best": C[np.arange(len(C)), pick].mean() / C[:, best].mean()})
    df = pd.DataFrame(rows).sort_values("gain", ascending=False)
    with pd.option_context("display.width", 250, "display.max_colwidth", 90, "display.float_format", "{:.3f}".format):
        print(f"{len(df)} pools of {REFERENCE} + 4; train+validation rows of the chat profile: n={int(seen.sum())}")
        print(df.head(12).to_string(index=False))
    print(json.dumps({"pools": len(df), "gain_ci_above_0": int((df["CI low"] > 0).sum()),
                      "gain_ci_below_0": int((df["CI high"] < 0).sum()),
                      "max_headroom": round(float((df["oracle"] - df["best q"]).max()), 4),
                      "max_gain": round(float(df["gain"].max()), 4)}))


if __name__ == "__main__":
    main()
