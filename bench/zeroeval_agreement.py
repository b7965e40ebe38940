"""Agreement of our grader with ZeroEval's own scoring rules, per agent and source, on the bundled recordings.

    python bench/zeroeval_agreement.py [--pool demo_wide] [--show N] [--source zeroeval_crux]
    python bench/zeroeval_agreement.py --dump new.jsonl [--old-rev main] [--mmlu-pro]
    python bench/zeroeval_agreement.py --diff old.jsonl new.jsonl

Reads only bundled files: the tasks of the three ZeroEval sources (`pipeline.tasks.sources.load_source`) and
`data/replay/zeroeval_outputs.parquet`, whose `score_upstream_rules` column is the snapshot's re-computation of the
upstream rules (first complete JSON object -> "answer"; GSM8K / MATH: first number equal; CRUXEval: exact string).
Prints one row per agent (agreement = share of replies where our 0/1 equals upstream's), then with --show N the
first N disagreements per source (reply tail, our extraction, gold, both verdicts) for reading by hand.

`--dump` writes every verdict, one JSON line each, to check that a grading change moves no real grade: each reply's
grade (extracted, correct), each task's agreement verdict for every pair of distinct answers and for each answer with
itself, and with `--mmlu-pro` the letter grades of the bundled MMLU-Pro replies. `--old-rev` grades with grading.py
as it was at that git revision. `--diff` prints the counts per kind and every verdict that differs.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.collect import grading  # noqa: E402
from pipeline.collect.agents import load_agents  # noqa: E402
from pipeline.collect.replay import data_dir  # noqa: E402
from pipeline.core.prompts import prompt_hash  # noqa: E402
from pipeline.tasks.sources import load_source  # noqa: E402

SOURCES = ["zeroeval_gsm8k", "zeroeval_math_l5", "zeroeval_crux"]


def graded_frame(pool: str, g=grading) -> pd.DataFrame:
    tasks = pd.concat([load_source(s) for s in SOURCES], ignore_index=True)
    tasks["prompt_hash"] = tasks["prompt"].map(prompt_hash)
    rec = pd.read_parquet(data_dir() / "replay" / "zeroeval_outputs.parquet")
    agents = {a.model: a.name for a in load_agents(ROOT / "config" / "agents.yaml", pool)}
    rec = rec[rec["model"].isin(agents)].assign(agent=lambda d: d["model"].map(agents))
    df = rec.merge(tasks[["prompt_hash", "task_id", "source", "gold", "grader"]], on="prompt_hash", how="inner")
    graded = [g.grade(t, gold, gr) for t, gold, gr in zip(df["text"], df["gold"], df["grader"])]
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


def verdicts(pool: str, g, mmlu_pro: bool):
    """Every verdict of grading module `g` on the bundled recordings: (kind, key, value) rows."""
    df = graded_frame(pool, g)
    for t, m, e, c in zip(df["task_id"], df["model"], df["extracted"], df["ours"]):
        yield "grade", [t, m], [e, bool(c)]
    for (t, grader), d in df.groupby(["task_id", "grader"]):
        answers = sorted({a for a in d["extracted"] if a is not None})
        for i, a in enumerate(answers):
            for b in answers[i:]:  # each answer with itself, then with every other
                yield "agree", [t, a, b], g.answers_agree(a, b, grader)
    if mmlu_pro:
        tasks = load_source("mmlu_pro").assign(prompt_hash=lambda d: d["prompt"].map(prompt_hash))
        rec = pd.read_parquet(data_dir() / "replay" / "mmlu_pro_outputs.parquet").merge(
            tasks[["prompt_hash", "task_id", "gold"]], on="prompt_hash")
        for t, m, text, gold in zip(rec["task_id"], rec["model"], rec["text"], rec["gold"]):
            e, c = g.grade(text, gold, "mcq_letter")
            yield "mmlu_pro", [t, m], [e, bool(c)]


def diff(old_file: str, new_file: str) -> int:
    """Counts per kind and every verdict that differs between two dumps; 1 when any differs."""
    def load(f):
        with open(f) as fh:
            return {(r[0], json.dumps(r[1])): r[2] for r in map(json.loads, fh)}
    old, new = load(old_file), load(new_file)
    changed = 0
    for kind in sorted({k for k, _ in old} | {k for k, _ in new}):
        keys = {k for k in old if k[0] == kind} | {k for k in new if k[0] == kind}
        moved = sorted(k for k in keys if old.get(k, "absent") != new.get(k, "absent"))
        print(f"{kind}: {sum(k in old for k in keys)} old, {sum(k in new for k in keys)} new, {len(moved)} differ")
        for k in moved:
            print(f"  {k[1]}: {json.dumps(old.get(k, 'absent'))} -> {json.dumps(new.get(k, 'absent'))}")
        changed += len(moved)
    return int(changed > 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", default="demo_wide", help="pool in config/agents.yaml (default: all 10 models)")
    ap.add_argument("--show", type=int, default=0, help="print N disagreements per source")
    ap.add_argument("--source", choices=SOURCES, help="only show disagreements of this source")
    ap.add_argument("--dump", metavar="FILE", help="write every verdict to FILE (JSON lines) instead")
    ap.add_argument("--old-rev", help="with --dump: grade with grading.py at this git revision")
    ap.add_argument("--mmlu-pro", action="store_true", help="with --dump: the MMLU-Pro letter grades too")
    ap.add_argument("--diff", nargs=2, metavar=("OLD", "NEW"), help="compare two dumps")
    args = ap.parse_args(argv)
    if args.diff:
        return diff(*args.diff)
    if args.dump:
        from grading_budget import old_grading

        g = old_grading(args.old_rev) if args.old_rev else grading
        with open(args.dump, "w") as fh:
            for row in verdicts(args.pool, g, args.mmlu_pro):
                fh.write(json.dumps(row) + "\n")
        return 0
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
