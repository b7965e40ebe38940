"""Agreement of our grader with ZeroEval's own scoring rules, per agent and source, on the bundled recordings.

    python bench/zeroeval_agreement.py [--pool demo_wide] [--show N] [--source zeroeval_crux]

Reads only bundled files: the tasks of the three ZeroEval sources (`pipeline.tasks.sources.load_source`) and
`data/replay/zeroeval_outputs.parquet`, whose `score_upstream_rules` column is the snapshot's re-computation of the
upstream rules (first complete JSON object -> "answer"; GSM8K / MATH: first number equal; CRUXEval: exact string).
Prints one row per agent (agreement = share of replies where our 0/1 equals upstream's), then with --show N the
first N disagreements per source (reply tail, our extraction, gold, both verdicts) for reading by hand.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.collect.agents import load_agents  # noqa: E402
from pipeline.collect.grading import grade  # noqa: E402
from pipeline.collect.replay import data_dir  # noqa: E402
from pipeline.core.prompts import prompt_hash  # noqa: E402
from pipeline.tasks.sources import load_source  # noqa: E402

SOURCES = ["zeroeval_gsm8k", "zeroeval_math_l5", "zeroeval_crux"]


def graded_frame(pool: str) -> pd.DataFrame:
    tasks = pd.concat([load_source(s) for s in SOURCES], ignore_index=True)
    tasks["prompt_hash"] = tasks["prompt"].map(prompt_hash)
    rec = pd.read_parquet(data_dir() / "replay" / "zeroeval_outputs.parquet")
    agents = {a.model: a.name for a in load_agents(ROOT / "config" / "agents.yaml", pool)}
    rec = rec[rec["model"].isin(agents)].assign(agent=lambda d: d["model"].map(agents))
    df = rec.merge(tasks[["prompt_hash", "task_id", "source", "gold", "grader"]], on="prompt_hash", how="inner")
    graded = [grade(t, g, gr) for t, g, gr in zip(df["text"], df["gold"], df["grader"])]
    df["extracted"] = [e for e, _ in graded]
    df["ours"] = [int(c) for _, c in graded]
    df["upstream"] = df["score_upstream_rules"].astype(int)
    df["agree"] = df["ours"] == df["upstream"]
    return df


def agreement_table(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (agent, model), g in df.groupby(["agent", "model"], sort=False):
        row = {"agent": agent, "model": model, "n": len(g), "ours": g["ours"].mean(), "upstream": g["upstream"].mean(),
               "agreement": g["agree"].mean(), "ours_only": int(((g.ours == 1) & (g.upstream == 0)).sum()),
               "upstream_only": int(((g.ours == 0) & (g.upstream == 1)).sum())}
        row.update({f"agree_{s.removeprefix('zeroeval_')}": g.loc[g.source == s, "agree"].mean() for s in SOURCES})
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", default="demo_wide", help="pool in config/agents.yaml (default: all 10 models)")
    ap.add_argument("--show", type=int, default=0, help="print N disagreements per source")
    ap.add_argument("--source", choices=SOURCES, help="only show disagreements of this source")
    args = ap.parse_args(argv)
    df = graded_frame(args.pool)
    table = agreement_table(df)
    print(table.to_markdown(index=False, floatfmt=".4f"))
    print(f"\nall agents: n={len(df)}, agreement {df['agree'].mean():.4f}, minimum per agent "
          f"{table['agreement'].min():.4f}")
    for source in [args.source] if args.source else SOURCES:
        bad = df[(df.source == source) & ~df.agree]
        for _, r in bad.head(args.show).iterrows():
            print(f"\n--- {r.task_id} {r.agent} ours={r.ours} upstream={r.upstream} gold={r.gold!r} "
                  f"extracted={r.extracted!r}\n{r.text[-400:]}")


if __name__ == "__main__":
    main()
