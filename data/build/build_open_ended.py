"""Build the bundled open-ended instructions: AlpacaEval's 805 evaluation instructions, text only.

Source: `tatsu-lab/alpaca_eval` (Apache-2.0) @ cd543a149df89434d8a54582c0151c0b945c3d20, the instructions of
`results/gpt4_1106_preview/model_outputs.json`, flattened with every model's reply in
`/work/shared/data/reward-matrices/alpaca-eval/records.parquet` (override with `--source FILE`). This script is the
only code that reads that snapshot; the runtime reads the file it writes:

- `data/open_ended/instructions.parquet`, one row per instruction (805): `instruction_id` (0..804, upstream order),
  `dataset` (its upstream set: helpful_base, koala, oasst, selfinstruct, vicuna), `instruction` (as a user wrote it).

The phrasing report (`phrasings` asset) sends them to a router as open-ended requests a user types, to measure how
often its OOD guard fires on traffic that has no gold answer. Deterministic: the same snapshot gives the same bytes.

    python data/build/build_open_ended.py [--source FILE]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT.parent / "shared" / "data" / "reward-matrices" / "alpaca-eval" / "records.parquet"
OUT = ROOT / "data" / "open_ended" / "instructions.parquet"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=SOURCE)
    args = ap.parse_args(argv)
    rows = pd.read_parquet(args.source, columns=["instruction_id", "dataset", "instruction"])
    rows = rows.drop_duplicates("instruction_id").sort_values("instruction_id").reset_index(drop=True)
    if len(rows) != 805 or rows["instruction"].isna().any():
        raise SystemExit(f"{args.source}: expected 805 instructions with text, got {len(rows)}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    rows.astype({"instruction_id": "int32"}).to_parquet(OUT, index=False, compression="zstd")
    print(f"wrote {OUT} ({len(rows)} instructions, {OUT.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
