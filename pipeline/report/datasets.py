"""Publish a table as a Hugging Face dataset: DatasetDict saved to disk, Parquet per split, and a dataset card."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pandas as pd

SOURCE_LICENCES = {
    "math500": "MIT (openai/prm800k, hendrycks/math) — via ZubinGou/math-evaluation-harness @ db77bc6",
    "gsm8k": "MIT (openai/grade-school-math @ 3101c7d)",
    "aime2025_i": "MAA AIME 2025 problems (MAA copyright; no licence stated) — "
                  "via yukangZhuu/basic_evaluator @ a85b668",
    "aime2025_ii": "MAA AIME 2025 problems (MAA copyright; no licence stated) — "
                   "via yukangZhuu/basic_evaluator @ a85b668",
    "arc_challenge": "CC-BY-SA-4.0 (allenai/ai2_arc) — reformatted copy via yukangZhuu/basic_evaluator @ a85b668",
    "mmlu": "MIT (hendrycks/test) — via hiyouga/LLaMA-Factory @ 65ea7a0",
    "mmlu_pro": "Apache-2.0 (TIGER-AI-Lab/MMLU-Pro @ f418b11)",
    "rlpr": "Apache-2.0 code (OpenBMB/RLPR); data from the user's own copy",
    "zeroeval_gsm8k": "Apache-2.0 prompts (yuchenlin/ZeroEval @ 570c626); GSM8K MIT (openai/grade-school-math)",
    "zeroeval_math_l5": "Apache-2.0 prompts (yuchenlin/ZeroEval @ 570c626); MATH level-5 problems MIT (hendrycks/math)",
    "zeroeval_crux": "Apache-2.0 prompts (yuchenlin/ZeroEval @ 570c626); CRUXEval-O MIT (facebookresearch/cruxeval)",
}


def _counts_table(df: pd.DataFrame, col: str) -> str:
    counts = df.groupby([col, "split"]).size().unstack(fill_value=0) if "split" in df else df[col].value_counts()
    return counts.to_markdown() if hasattr(counts, "to_markdown") else str(counts)


def dataset_card(df: pd.DataFrame, title: str, description: str) -> str:
    lines = [f"# {title}", "", description, "", f"Rows: {len(df)}", ""]
    if "source" in df:
        lines += ["## Sources and licences", ""]
        lines += [f"- `{s}` ({n} rows): {SOURCE_LICENCES.get(s, 'see data/NOTICE.md')}"
                  for s, n in df["source"].value_counts().sort_index().items()]
        lines.append("")
    for col in ("domain", "difficulty", "category", "split"):
        if col in df and col != "split":
            lines += [f"## Counts by {col} and split", "", _counts_table(df, col), ""]
    if "split" in df:
        lines += ["## Counts by split", "", df["split"].value_counts().sort_index().to_frame("rows").to_markdown(), ""]
    return "\n".join(lines)


def publish_dataset(df: pd.DataFrame, out_dir: Path, title: str, description: str) -> Path:
    """Write `out_dir/hf` (DatasetDict.save_to_disk), `out_dir/<split>.parquet`, `out_dir/README.md`, atomically."""
    import datasets

    datasets.disable_progress_bars()
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        splits = sorted(df["split"].unique()) if "split" in df else ["all"]
        parts = {s: (df[df["split"] == s] if "split" in df else df).reset_index(drop=True) for s in splits}
        datasets.DatasetDict({s: datasets.Dataset.from_pandas(p, preserve_index=False) for s, p in parts.items()}
                             ).save_to_disk(str(tmp / "hf"))
        for s, p in parts.items():
            p.to_parquet(tmp / f"{s}.parquet", index=False, compression="zstd")
        (tmp / "README.md").write_text(dataset_card(df, title, description), encoding="utf-8")
        old = out_dir.with_name(f".{out_dir.name}.old")
        if out_dir.exists():
            out_dir.rename(old)
        tmp.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


TASKS_TITLE = "BenchGen Router Lite tasks ({profile})"
REWARDS_TITLE = "BenchGen Router Lite rewards ({profile})"
REWARDS_DESCRIPTION = "Mean reward per task and agent over repetitions; no prompt text (join tasks by task_id)."


def rewards_table(reward_matrix: pd.DataFrame, task_pool: pd.DataFrame) -> pd.DataFrame:
    """The rewards dataset: the reward matrix with each task's source and split (no prompt text)."""
    return reward_matrix.merge(task_pool[["task_id", "source", "split"]], on="task_id", how="left")


def publish_datasets(task_pool: pd.DataFrame, reward_matrix: pd.DataFrame, out_dir: Path, profile: str,
                     description: str) -> Path:
    """Both local datasets, `out_dir/tasks` and `out_dir/rewards`, from the assets' frames (the Hub release takes
    them as its inputs and writes them here first)."""
    publish_dataset(task_pool, Path(out_dir) / "tasks", TASKS_TITLE.format(profile=profile), description)
    publish_dataset(rewards_table(reward_matrix, task_pool), Path(out_dir) / "rewards",
                    REWARDS_TITLE.format(profile=profile), REWARDS_DESCRIPTION)
    return Path(out_dir)
