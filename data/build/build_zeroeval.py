"""Build the bundled ZeroEval task table and replay recordings from the ZeroEval snapshot.

Source: `yuchenlin/ZeroEval` (Apache-2.0) @ 570c6269a2e4930ee06a17e713fece1ba52cf1dd, folder
`result_dirs/{gsm,math-l5,crux}/<model>.json`, flattened to one row per (question, model) in
`/work/shared/data/reward-matrices/zeroeval/records.parquet` (override with `--source FILE`). This script is the only
code that reads that snapshot; the runtime reads the two files it writes:

- `data/sources/zeroeval/tasks.parquet`, one row per question (2,840): `qid` (`<task>:<upstream id>`), `task`
  (gsm | math-l5 | crux), `index` (position inside its task, in upstream order), `prompt` (the exact zero-shot prompt
  every model was sent), `gold`, `question`, and for GSM8K `solution_steps`: the number of non-empty lines before
  `####` in the reference solution of the bundled GSM8K test copy (`data/sources/gsm8k/test.jsonl.gz`), joined by the
  upstream index and checked equal on the question text (the difficulty rule, docs/tasks.md).
- `data/replay/zeroeval_outputs.parquet`, one row per (model, question) for the 10 models of the `demo` and
  `demo_wide` pools: `model`, `question_id` (= qid), `prompt_hash` (= `prompts.prompt_hash(prompt)`), `text` (the
  raw reply, byte-for-byte), and `score_upstream_rules` (int8, the snapshot's re-computation of upstream scoring:
  only `bench/zeroeval_agreement.py` reads it, to check our grader).

Deterministic: the same snapshot gives the same bytes.

    python data/build/build_zeroeval.py [--source FILE]
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipeline.core.prompts import prompt_hash  # noqa: E402

DEFAULT_SOURCE = Path("/work/shared/data/reward-matrices/zeroeval/records.parquet")
TASKS_OUT = ROOT / "data" / "sources" / "zeroeval" / "tasks.parquet"
REPLAY_OUT = ROOT / "data" / "replay" / "zeroeval_outputs.parquet"
GSM8K = ROOT / "data" / "sources" / "gsm8k" / "test.jsonl.gz"

# config/agents.yaml pools `demo` (first five, by role) and `demo_wide` (all ten)
DEMO_MODELS = ["gpt-4o-2024-08-06", "claude-3-5-sonnet-20240620", "gemini-1.5-pro", "Meta-Llama-3.1-8B-Instruct",
               "deepseek-v2.5-0908"]
WIDE_MODELS = ["gpt-4o-mini-2024-07-18", "o1-mini-2024-09-12", "Meta-Llama-3.1-70B-Instruct", "Mistral-Large-2",
               "Qwen2-72B-Instruct"]
MODELS = DEMO_MODELS + WIDE_MODELS
TASK_ORDER = {"gsm": 0, "math-l5": 1, "crux": 2}


def _upstream_index(qid: str) -> int:
    """'gsm:gsm8k-main-test-#12' -> 12, 'math-l5:7' -> 7, 'crux:crux-test-#3' -> 3."""
    tail = qid.split(":", 1)[1]
    return int(tail.rsplit("#", 1)[-1])


def gsm8k_steps(questions: pd.Series, index: pd.Series) -> list[int]:
    """Reference-solution steps per GSM8K question (the same count as `pipeline.tasks.sources._gsm8k_gold`)."""
    with gzip.open(GSM8K, "rt", encoding="utf-8") as fh:
        ref = [json.loads(line) for line in fh if line.strip()]
    steps = []
    for q, i in zip(questions, index):
        row = ref[i]
        if row["question"].strip() != q.strip():
            raise SystemExit(f"GSM8K test #{i}: question text differs from the bundled copy")
        body = row["answer"].rsplit("####", 1)[0]
        steps.append(len([ln for ln in body.strip().split("\n") if ln.strip()]))
    return steps


def build(source: Path) -> dict:
    df = pd.read_parquet(source)
    missing = set(MODELS) - set(df["model"])
    if missing:
        raise SystemExit(f"{source}: no records for {sorted(missing)}")
    df = df[df["model"].isin(MODELS)].copy()
    per_q = df.groupby("qid")[["prompt", "gold", "question"]].nunique()
    if (per_q > 1).any().any():
        raise SystemExit(f"{source}: a question has different prompts/golds across models")
    counts = df.groupby("model")["qid"].nunique()
    n_questions = df["qid"].nunique()
    if (counts != n_questions).any():
        raise SystemExit(f"{source}: incomplete models {counts[counts != n_questions].to_dict()}")

    tasks = df.drop_duplicates("qid")[["qid", "domain", "prompt", "gold", "question"]]
    tasks = tasks.rename(columns={"domain": "task"})
    tasks["index"] = tasks["qid"].map(_upstream_index)
    tasks = tasks.sort_values(["task", "index"], key=lambda s: s.map(TASK_ORDER) if s.name == "task" else s)
    tasks = tasks.reset_index(drop=True)
    for task, g in tasks.groupby("task"):
        if list(g["index"]) != list(range(len(g))):
            raise SystemExit(f"{task}: upstream ids are not 0..{len(g) - 1}")
    gsm = tasks["task"] == "gsm"
    tasks["solution_steps"] = pd.array([pd.NA] * len(tasks), dtype="Int16")
    tasks.loc[gsm, "solution_steps"] = gsm8k_steps(tasks.loc[gsm, "question"], tasks.loc[gsm, "index"])
    tasks = tasks[["qid", "task", "index", "prompt", "gold", "question", "solution_steps"]]
    TASKS_OUT.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(tasks, preserve_index=False), TASKS_OUT, compression="zstd",
                   compression_level=19)

    order = {m: i for i, m in enumerate(MODELS)}
    rec = df.assign(_m=df["model"].map(order), _q=df["qid"].map(dict(zip(tasks["qid"], tasks.index))))
    rec = rec.sort_values(["_m", "_q"])
    hashes = rec["prompt"].map(prompt_hash)
    if hashes.groupby(rec["model"]).nunique().min() != n_questions:
        raise SystemExit("two questions share a prompt hash")
    table = pa.table({
        "model": pa.array(rec["model"], pa.string()),
        "question_id": pa.array(rec["qid"], pa.string()),
        "prompt_hash": pa.array(hashes, pa.string()),
        "text": pa.array(rec["response"].fillna(""), pa.string()),
        "score_upstream_rules": pa.array(rec["score_upstream_rules"], pa.int8()),
    })
    REPLAY_OUT.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, REPLAY_OUT, compression="zstd", compression_level=19, use_dictionary=["model"],
                   row_group_size=table.num_rows)
    return {"questions": int(n_questions), "by_task": tasks["task"].value_counts().to_dict(),
            "replay_rows": table.num_rows, "tasks_bytes": TASKS_OUT.stat().st_size,
            "replay_bytes": REPLAY_OUT.stat().st_size,
            "empty_replies": {m: int(n) for m, n in rec.groupby("model")["response"].apply(
                lambda s: s.fillna("").str.strip().eq("").sum()).items() if n}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    args = ap.parse_args(argv)
    print(json.dumps(build(args.source), indent=2))


if __name__ == "__main__":
    main()
