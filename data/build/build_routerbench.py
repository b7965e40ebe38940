"""Build the bundled RouterBench subset: data/routerbench/routerbench.parquet (zstd).

Input: the RouterDC re-split of RouterBench (ARC-Challenge, Winogrande, MBPP; 11 models), as committed under
`/work/shared/data/reward-matrices/routerbench-subset-via-routerdc/` (see SOURCE.md there; override with
`--source DIR`). This script is the only code that reads that folder; runtime code reads `data/routerbench/` only.

What is kept, one row per source CSV row (rows with a missing score are kept here; the `routerbench` profile
builder drops them and counts them):
- `sample_id`, `eval_name`, `split` (train | test, from the CSV file name), `source_file`, `source_row`
  (the CSV's unnamed index column);
- `prompt`: the full prompt string (the source stores a Python-list repr; a few ARC rows hold the same prompt
  twice, all such duplicates are identical, the last element is kept), `prompt_hash` (pipeline.core.prompts);
- per model `<model>` (0/1 score, null when missing) and `<model>|total_cost` (USD for that call).
Dropped: model responses and `oracle_model_to_route_to` (derivable from the scores and costs).

Usage: `python data/build/build_routerbench.py [--source DIR] [--out DIR]`
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pipeline.core.io import atomic_write_parquet  # noqa: E402
from pipeline.core.prompts import prompt_hash  # noqa: E402

DEFAULT_SOURCE = Path("/work/shared/data/reward-matrices/routerbench-subset-via-routerdc")
DEFAULT_OUT = REPO / "data" / "routerbench"
TASK_FILES = {"arc_challenge": "arc-challenge", "winograde": "winogrande", "mbpp": "mbpp"}
META_COLUMNS = {"Unnamed: 0", "sample_id", "prompt", "eval_name", "oracle_model_to_route_to"}


def _unwrap_prompt(raw: str, where: str) -> str:
    value = ast.literal_eval(raw)
    if isinstance(value, str):
        return value
    if not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
        raise ValueError(f"{where}: prompt is not a list of strings")
    if len(set(value)) != 1:
        raise ValueError(f"{where}: prompt list holds {len(value)} different strings")
    return value[-1]


def read_source(source: Path) -> pd.DataFrame:
    frames = []
    models_seen: list[str] | None = None
    for stem in TASK_FILES:
        for split in ("train", "test"):
            path = source / f"{stem}_{split}.csv"
            df = pd.read_csv(path)
            models = [c for c in df.columns if "|" not in c and c not in META_COLUMNS]
            if models_seen is None:
                models_seen = models
            elif sorted(models) != sorted(models_seen):
                raise ValueError(f"{path}: models differ from the other files: {sorted(models)}")
            out = pd.DataFrame(
                {
                    "sample_id": df["sample_id"].astype(str),
                    "eval_name": df["eval_name"].astype(str),
                    "split": split,
                    "source_file": path.name,
                    "source_row": df["Unnamed: 0"].astype("int64"),
                    "prompt": [_unwrap_prompt(p, f"{path.name} row {i}") for i, p in enumerate(df["prompt"])],
                }
            )
            out["prompt_hash"] = out["prompt"].map(prompt_hash)
            for m in sorted(models_seen):
                out[m] = df[m].astype("float64")
                out[f"{m}|total_cost"] = df[f"{m}|total_cost"].astype("float64")
            frames.append(out)
    return pd.concat(frames, ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    df = read_source(args.source)
    path = atomic_write_parquet(df, args.out / "routerbench.parquet")
    counts = df.groupby(["eval_name", "split"]).size().to_dict()
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB, {len(df)} rows): {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
