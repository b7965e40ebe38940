"""Agreement of our MCQ extraction with the official `pred` of the TIGER-Lab MMLU-Pro recordings.

    python bench/extraction_agreement.py [--zips DIR] [--models M1 M2 ...]

DIR holds model_outputs_<MODEL>_5shots.zip (or the unzipped .json). Where the official regexes found no
"answer is (X)" / "Answer: X", the official harness fell back to the last stray letter (or, for Llama-3.1 and
mathstral, apparently a random letter), so agreement is reported split by whether that pattern is present.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline.collect.grading import extract_answer  # noqa: E402

DEFAULT_DIR = "/work/shared/data/reward-matrices/mmlu-pro-tiger-eval-results"
DEMO_MODELS = ["gemini-1.5-pro-002", "Meta-Llama-3_1-70B-Instruct", "gemini-1.5-flash-002",
               "Mistral-7B-Instruct-v0.2", "mathstral-7B"]
# the first two stages of the official harness (evaluate_from_*.py: "answer is \(?([A-J])\)?", then
# ".*[aA]nswer:\s*([A-J])"; the leading ".*" only picks the last match and makes search quadratic, so it is dropped
# here); its third stage is a stray-letter guess
OFFICIAL_PATTERN = re.compile(r"answer is \(?([A-J])\)?|[aA]nswer:\s*([A-J])")


def load_records(directory: Path, model: str) -> list[dict]:
    stem = f"model_outputs_{model}_5shots"
    if (directory / f"{stem}.json").exists():
        data = json.loads((directory / f"{stem}.json").read_text())
    else:
        with zipfile.ZipFile(directory / f"{stem}.zip") as zf:
            data = json.loads(zf.read(zf.namelist()[0]))
    return [r for r in data if isinstance(r, dict)]  # some files hold stray summary strings


def _rate(hits: int, total: int) -> str:
    return f"{hits / total:.4f} ({total})" if total else "- (0)"


def model_row(model: str, records: list[dict]) -> list[str]:
    n = len(records)
    agree = {True: [0, 0], False: [0, 0]}  # pattern present -> [agreements, preds]
    single = [0, 0]  # pattern present exactly once: first-vs-last occurrence cannot differ
    null_preds = null_extracted = ok_official = ok_ours = 0
    for r in records:
        text = r.get("generated_text") or r.get("model_outputs") or ""
        ours = extract_answer(text, "mcq_letter")
        ok_official += r["pred"] == r["answer"]
        ok_ours += ours == r["answer"]
        if r["pred"] is None:
            null_preds += 1
            null_extracted += ours is not None
            continue
        matches = len(OFFICIAL_PATTERN.findall(text))
        for bucket in [agree[matches > 0]] + ([single] if matches == 1 else []):
            bucket[0] += ours == r["pred"]
            bucket[1] += 1
    n_pred = agree[True][1] + agree[False][1]
    return [model, str(n), _rate(agree[True][0] + agree[False][0], n_pred),
            _rate(*agree[True]), _rate(*single), _rate(*agree[False]), _rate(null_extracted, null_preds),
            f"{ok_official / n:.4f}", f"{ok_ours / n:.4f}"]


HEADER = ["model", "n", "agree (pred set)", "agree, pattern present", "agree, pattern once", "agree, pattern absent",
          "we extract when pred null", "acc official", "acc ours"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zips", type=Path, default=Path(DEFAULT_DIR))
    ap.add_argument("--models", nargs="+", default=DEMO_MODELS)
    args = ap.parse_args(argv)
    rows = [model_row(m, load_records(args.zips, m)) for m in args.models]
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("\nagree: share of records with a non-null official pred where our letter equals it (count in brackets);"
          "\npattern = the official 'answer is (X)' / 'Answer: X' regexes match the raw text.")


if __name__ == "__main__":
    main()
