"""Build the bundled graded ZeroEval pool (`data/zeroeval_graded/`): every ZeroEval model with a reply to all 2,840
questions of the `demo` profile, graded once, for the refresh benchmark (`bench/refresh.py`, issue 29 item 6).

Source: the same flattened snapshot of `yuchenlin/ZeroEval` (Apache-2.0) @ 570c6269a2e4930ee06a17e713fece1ba52cf1dd
that `data/build/build_zeroeval.py` reads (`/work/shared/data/reward-matrices/zeroeval/records.parquet`, override
with `--source FILE`). This script is the only code that reads it; the benchmark reads the file it writes:

- `data/zeroeval_graded/graded.parquet`, one row per (model, question) of the complete models (all 2,840 questions):
  `model`, `question_id` (= the task pool's `question_id`, e.g. `gsm:gsm8k-main-test-#0`), `status` (ok | empty: an
  empty upstream reply), `extracted` (the project grader's extracted answer, null when none), `correct` (bool, the
  project's grader on the raw reply), `prompt_tokens` / `completion_tokens`
  (ceil(characters / 4), as the replay counts them) and `cost_usd` (estimated: tokens x the list price below). The
  raw replies are not copied (they are in the snapshot; 10 of these models' replies are in data/replay/).

Grading runs through `pipeline.collect.bounded.grade` with a generous budget (20 s per sympy evaluation, not the
collection's 250 ms), so the result does not depend on the machine's load. Deterministic: the same snapshot gives
the same bytes.

    python data/build/build_zeroeval_graded.py [--source FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

DEFAULT_SOURCE = Path("/work/shared/data/reward-matrices/zeroeval/records.parquet")
OUT = ROOT / "data" / "zeroeval_graded" / "graded.parquet"

# List prices, USD per 1M tokens (input, output), for the models config/prices.yaml does not price. Remembered offline
# from the providers' 2024 price pages (no network on the build machine): approximate, for the benchmark's cost
# column only (SOURCE.md lists them with their basis). Open-weight models: a serverless host's tier price.
EXTRA_PRICES = {
    "Athene-70B": (0.88, 0.88, "open weights (Llama-3-70B fine-tune): priced as a 70B model, Together AI tier (2024)"),
    "Llama-3.1-405B-Inst@sambanova": (3.50, 3.50, "Together AI Llama-3.1-405B-Instruct-Turbo (2024)"),
    "Meta-Llama-3-70B-Instruct": (0.88, 0.88, "Together AI Llama-3-70B-Instruct (2024)"),
    "Meta-Llama-3-8B-Instruct": (0.18, 0.18, "Together AI Llama-3-8B-Instruct-Turbo (2024)"),
    "Phi-3.5-mini-instruct": (0.13, 0.52, "Azure AI Phi-3.5-mini (2024)"),
    "Qwen2-7B-Instruct": (0.20, 0.20, "open weights: a 7B model, Together AI 4-8B tier (2024)"),
    "Yi-1.5-34B-Chat": (0.80, 0.80, "open weights: Together AI 21-41B tier (2024)"),
    "Yi-1.5-9B-Chat": (0.30, 0.30, "open weights: Together AI 8-21B tier (2024)"),
    "claude-3-haiku-20240307": (0.25, 1.25, "Anthropic API Claude 3 Haiku (2024)"),
    "claude-3-opus-20240229": (15.00, 75.00, "Anthropic API Claude 3 Opus (2024)"),
    "gemini-1.5-flash": (0.075, 0.30, "Gemini API 1.5 Flash, prompts <= 128k (2024-10)"),
    "gemma-2-2b-it": (0.10, 0.10, "open weights: Together AI up-to-4B tier (2024)"),
    "gemma-2-9b-it": (0.30, 0.30, "Together AI Gemma-2-9B (2024)"),
    "gpt-3.5-turbo-0125": (0.50, 1.50, "OpenAI API gpt-3.5-turbo-0125 (2024)"),
    "gpt-4o-2024-05-13": (5.00, 15.00, "OpenAI API gpt-4o-2024-05-13 (2024)"),
    "reka-core-20240501": (10.00, 25.00, "Reka API Reka Core (2024-05)"),
}


def prices() -> dict[str, tuple[float, float]]:
    """(input, output) USD per 1M tokens per model: config/prices.yaml, then EXTRA_PRICES."""
    import yaml

    doc = yaml.safe_load((ROOT / "config" / "prices.yaml").read_text(encoding="utf-8"))["models"]
    out = {m: (float(p["input"]), float(p["output"])) for m, p in doc.items()}
    out.update({m: (p[0], p[1]) for m, p in EXTRA_PRICES.items()})
    return out


def build(source: Path) -> dict:
    from pipeline.collect import bounded
    from pipeline.collect.replay import approx_tokens

    budget = bounded.Budget(budget_ms=20_000)

    from cli.forecast import profile_task_pool
    from pipeline.profile import load_profile

    df = pd.read_parquet(source, columns=["qid", "model", "prompt", "response"])
    pool = profile_task_pool(load_profile("demo"))  # the default's questions: gold and grader as the lineage has them
    gold, grader = dict(zip(pool["question_id"], pool["gold"])), dict(zip(pool["question_id"], pool["grader"]))
    n_q = len(pool)
    df = df[df["qid"].isin(gold)]
    counts = df.groupby("model")["qid"].nunique()
    complete = sorted(counts[counts == n_q].index)
    pr = prices()
    unpriced = [m for m in complete if m not in pr]
    if unpriced:
        raise SystemExit(f"no list price for {unpriced}: add it to EXTRA_PRICES")
    df = df[df["model"].isin(complete)].sort_values(["model", "qid"]).reset_index(drop=True)
    df["gold"], df["grader"] = df["qid"].map(gold), df["qid"].map(grader)
    rows = []
    for m, q, prompt, text, gold, g in df[["model", "qid", "prompt", "response", "gold", "grader"]].itertuples(
            index=False):
        text = text or ""
        status = "ok" if text.strip() else "empty"
        extracted, correct = (bounded.grade(text, str(gold), g, budget)[:2] if status == "ok" else (None, False))
        pt, ct = approx_tokens(prompt), approx_tokens(text)
        pin, pout = pr[m]
        rows.append((m, q, status, extracted, bool(correct), pt, ct, (pt * pin + ct * pout) / 1e6))
    out = pd.DataFrame(rows, columns=["model", "question_id", "status", "extracted", "correct", "prompt_tokens",
                                      "completion_tokens", "cost_usd"])
    table = pa.table({
        "model": pa.array(out["model"], pa.string()), "question_id": pa.array(out["question_id"], pa.string()),
        "status": pa.array(out["status"], pa.string()), "extracted": pa.array(out["extracted"], pa.string()),
        "correct": pa.array(out["correct"], pa.bool_()),
        "prompt_tokens": pa.array(out["prompt_tokens"], pa.int32()),
        "completion_tokens": pa.array(out["completion_tokens"], pa.int32()),
        "cost_usd": pa.array(out["cost_usd"], pa.float64()),
    })
    OUT.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, OUT, compression="zstd", compression_level=19,
                   use_dictionary=["model", "question_id", "status"], row_group_size=table.num_rows)
    acc = out.assign(task=out["question_id"].str.split(":").str[0]).pivot_table(
        index="model", columns="task", values="correct", aggfunc="mean").round(3)
    return {"models": len(complete), "rows": table.num_rows, "bytes": OUT.stat().st_size,
            "accuracy": acc.to_dict(orient="index")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    args = ap.parse_args(argv)
    print(json.dumps(build(args.source), indent=2))


if __name__ == "__main__":
    main()
