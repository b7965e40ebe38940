"""Build `data/alpaca_eval/records.parquet`: AlpacaEval's 805 open-ended instructions, 12 models' recorded replies and
the recorded GPT-4-turbo judgment of each reply against the reference model's (gpt4_1106_preview) reply.

Source: tatsu-lab/alpaca_eval (Apache-2.0) @ cd543a149df89434d8a54582c0151c0b945c3d20, `results/<model>/
model_outputs.json` and `results/<model>/weighted_alpaca_eval_gpt4_turbo/annotations.json`, flattened into
`/work/shared/data/reward-matrices/alpaca-eval/records.parquet` (override with `--source FILE`); this script is the only
code that reads it: the runtime reads the Parquet it writes (data/alpaca_eval/SOURCE.md).

Output, one row per (instruction, model), sorted by (model, instruction_id): `instruction_id` (int16), `dataset`
(AlpacaEval's five instruction sets), `instruction`, `model`, `output` (the recorded reply, byte for byte),
`preference` (float64: the judge's probability that `output` is better than the reference's reply, as recorded;
NaN for the reference model's own rows, which upstream never judged: a tie by construction), `judge_price_usd` (what
that judgment cost upstream; NaN where not recorded). The reference's reply is the reference model's `output`, and
the build checks that every row's recorded `reference_output` is that text. `judge_raw` is dropped (the preference is
what it says; the upstream file keeps it).

    python data/build/build_alpaca_eval.py [--source FILE] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SOURCE = Path("/work/shared/data/reward-matrices/alpaca-eval/records.parquet")
DEFAULT_OUT = ROOT / "data" / "alpaca_eval" / "records.parquet"
REFERENCE = "gpt4_1106_preview"


def build(source: Path, out: Path) -> dict:
    d = pd.read_parquet(source)
    ref = d[d["model"] == REFERENCE].set_index("instruction_id")["output"]
    if len(ref) != d["instruction_id"].nunique():
        raise SystemExit(f"{source}: the reference {REFERENCE} has {len(ref)} replies, not one per instruction")
    if not (d["reference_output"].to_numpy() == ref.loc[d["instruction_id"]].to_numpy()).all():
        raise SystemExit(f"{source}: a row's reference_output differs from {REFERENCE}'s reply")
    if set(d["reference_model"]) != {REFERENCE}:
        raise SystemExit(f"{source}: reference models {sorted(set(d['reference_model']))}, expected {REFERENCE}")
    pref = d["preference"].astype(float).where(d["model"] != REFERENCE, np.nan)  # never judged upstream
    table = pa.table({
        "instruction_id": pa.array(d["instruction_id"].astype("int16")),
        "dataset": pa.array(d["dataset"].astype(str)),
        "instruction": pa.array(d["instruction"].astype(str)),
        "model": pa.array(d["model"].astype(str)),
        "output": pa.array(d["output"].astype(str)),
        "preference": pa.array(pref.to_numpy(), pa.float64()),
        "judge_price_usd": pa.array(d["judge_price_usd"].astype(float).to_numpy(), pa.float64()),
    }).sort_by([("model", "ascending"), ("instruction_id", "ascending")])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp, compression="zstd", compression_level=19,
                   use_dictionary=["model", "dataset", "instruction"], row_group_size=table.num_rows)
    tmp.replace(out)
    return {"rows": table.num_rows, "models": sorted(set(d["model"])), "bytes": out.stat().st_size}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    print(json.dumps(build(args.source, args.out), indent=2))


if __name__ == "__main__":
    main()
