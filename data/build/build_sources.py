"""Build the bundled task sources in data/sources/ from the public copies in ../shared/data/sources.

Run once by a maintainer (`python data/build/build_sources.py [--shared PATH]`); the pipeline never reads
../shared at run time. Outputs are compressed, byte-faithful (gzip of the original JSONL) or lossless
derivations (Parquet of the CSV/JSON rows); NOTICE.md in data/ keeps repo, commit and licence per source.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import shutil
import zipfile
from pathlib import Path

import pandas as pd

OUT = Path(__file__).resolve().parents[1] / "sources"


def gzip_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fi, gzip.GzipFile(dst, "wb", mtime=0) as fo:
        shutil.copyfileobj(fi, fo)


def build_mmlu(shared: Path) -> None:
    rows = []
    with zipfile.ZipFile(shared / "mmlu" / "mmlu.zip") as z:
        for name in sorted(n for n in z.namelist() if n.startswith("data/test/") and n.endswith("_test.csv")):
            subject = Path(name).name[: -len("_test.csv")]
            text = z.read(name).decode("utf-8")
            for i, rec in enumerate(csv.reader(io.StringIO(text))):
                q, a, b, c, d, ans = rec
                rows.append({"subject": subject, "row": i, "question": q, "A": a, "B": b, "C": c, "D": d,
                             "answer": ans})
    out = OUT / "mmlu" / "test.parquet"
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(out, index=False, compression="zstd")


def build_mmlu_pro(shared: Path) -> None:
    zpath = shared / "mmlu_pro" / "model_outputs_jamba-1.5-large_5shots.zip"
    with zipfile.ZipFile(zpath) as z:
        records = json.loads(z.read(z.namelist()[0]))
    keep = ["question_id", "question", "options", "answer", "answer_index", "category", "src"]
    df = pd.DataFrame([{k: r[k] for k in keep} for r in records if isinstance(r, dict)])
    df = df.sort_values("question_id").reset_index(drop=True)
    out = OUT / "mmlu_pro" / "test.parquet"
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(out, index=False, compression="zstd")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[3] / "shared" / "data" / "sources"))
    shared = Path(ap.parse_args().shared)
    gzip_copy(shared / "math500" / "test.jsonl", OUT / "math500" / "test.jsonl.gz")
    gzip_copy(shared / "gsm8k" / "test.jsonl", OUT / "gsm8k" / "test.jsonl.gz")
    gzip_copy(shared / "arc_challenge" / "arc_challenge_test.jsonl", OUT / "arc_challenge" / "test.jsonl.gz")
    gzip_copy(shared / "aime2025_i" / "aime25.jsonl", OUT / "aime2025" / "aime25.jsonl.gz")
    build_mmlu(shared)
    build_mmlu_pro(shared)
    for p in sorted(OUT.rglob("*.*")):
        print(f"{p.relative_to(OUT)}\t{p.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
