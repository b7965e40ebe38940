"""Build the replay recordings `data/replay/mmlu_pro_outputs.parquet` from the official TIGER-Lab MMLU-Pro outputs.

Source: per-question model outputs published in https://github.com/TIGER-AI-Lab/MMLU-Pro (Apache-2.0), commit
f418b116db00b065c2aea046518d8fcf74d39872, `eval_results/model_outputs_<MODEL>_5shots.zip` (one JSON list per zip).
A snapshot of those zips lies under `/work/shared/data/reward-matrices/mmlu-pro-tiger-eval-results/` (override with
`--source DIR`); this script is the only code that reads it: the runtime reads the Parquet it writes.

Output columns: `model` (str), `question_id` (int32), `prompt_hash` (16 hex = `prompts.prompt_hash(
prompts.mcq_prompt(question, options))`), `text` (the recorded raw response, byte-for-byte). Rows sorted by
(model, question_id). Items that are not dicts (stray summary strings in some files) and records without text are
skipped. Two questions with an identical prompt (same question + options) share one prompt hash: only the one with
the smallest question_id is kept for that model, so a (model, prompt_hash) pair has exactly one text.

    python data/build/build_replay.py [--source DIR] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
import zipfile
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipeline.core.prompts import mcq_prompt, prompt_hash  # noqa: E402

DEFAULT_SOURCE = Path("/work/shared/data/reward-matrices/mmlu-pro-tiger-eval-results")
DEFAULT_OUT = ROOT / "data" / "replay" / "mmlu_pro_outputs.parquet"

DEMO_MODELS = [
    "gemini-1.5-pro-002",
    "Meta-Llama-3_1-70B-Instruct",
    "gemini-1.5-flash-002",
    "Mistral-7B-Instruct-v0.2",
    "mathstral-7B",
]
WIDE_MODELS = ["Qwen1.5-72B-Chat", "Phi-3-mini-4k-instruct", "jamba-1.5-large"]
MODELS = DEMO_MODELS + WIDE_MODELS
POOL_REFERENCE = "jamba-1.5-large"


def read_records(zip_path: Path) -> list[dict]:
    with zipfile.ZipFile(zip_path) as zf:
        names = [n for n in zf.namelist() if n.endswith(".json")]
        if len(names) != 1:
            raise SystemExit(f"{zip_path}: expected one .json member, found {names}")
        data = json.loads(zf.read(names[0]))
    if not isinstance(data, list):
        raise SystemExit(f"{zip_path}: expected a JSON list")
    return [r for r in data if isinstance(r, dict)]


def build(source: Path, out: Path) -> dict:
    rows: dict[str, list] = {"model": [], "question_id": [], "prompt_hash": [], "text": []}
    report: dict[str, dict] = {}
    # question_id -> prompt hash in the task pool's copy of the questions (the jamba file, which holds all 12032
    # ids: see /work/shared/data/sources/mmlu_pro/SOURCE.md). A few files were made with an older MMLU-Pro revision
    # (a fixed typo or option): those recordings keep the prompt the model really saw, so they are not served for the
    # corrected prompt (a replay 404 = error row, never a wrong answer). Counted as `prompt_differs_from_task_pool`.
    pool_path = source / f"model_outputs_{POOL_REFERENCE}_5shots.zip"
    canonical: dict[int, str] = {
        int(r["question_id"]): prompt_hash(mcq_prompt(r["question"], list(r["options"])))
        for r in read_records(pool_path)
    }
    for model in MODELS:
        zip_path = source / f"model_outputs_{model}_5shots.zip"
        if not zip_path.exists():
            raise SystemExit(f"missing source file {zip_path}")
        recs = read_records(zip_path)
        stats = Counter()
        seen_hash: dict[str, int] = {}
        kept = []
        for r in sorted(recs, key=lambda r: int(r["question_id"])):
            qid = int(r["question_id"])
            text = r.get("generated_text")
            if text is None:
                text = r.get("model_outputs")
            if not isinstance(text, str):
                stats["no_text"] += 1
                continue
            h = prompt_hash(mcq_prompt(r["question"], list(r["options"])))
            if canonical.get(qid) != h:
                stats["prompt_differs_from_task_pool"] += 1
            if h in seen_hash:
                stats["duplicate_prompt_dropped"] += 1
                continue
            seen_hash[h] = qid
            kept.append((qid, h, text))
        for qid, h, text in kept:
            rows["model"].append(model)
            rows["question_id"].append(qid)
            rows["prompt_hash"].append(h)
            rows["text"].append(text)
        stats["records"] = len(recs)
        stats["kept"] = len(kept)
        report[model] = dict(stats)
    table = pa.table(
        {
            "model": pa.array(rows["model"], pa.string()),
            "question_id": pa.array(rows["question_id"], pa.int32()),
            "prompt_hash": pa.array(rows["prompt_hash"], pa.string()),
            "text": pa.array(rows["text"], pa.string()),
        }
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".parquet.tmp")
    pq.write_table(
        table,
        tmp,
        compression="zstd",
        compression_level=19,
        use_dictionary=["model"],
        row_group_size=len(rows["model"]) or 1,
    )
    tmp.replace(out)
    return {"rows": table.num_rows, "bytes": out.stat().st_size, "models": report}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    print(json.dumps(build(args.source, args.out), indent=2))


if __name__ == "__main__":
    main()
