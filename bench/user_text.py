"""What learning from the user text saves in embedding: the demo's texts as the router embedded them before (the
benchmark's prompt, template included) and now (`pipeline.core.prompts.task_texts`, what `prompt_embeddings` and
`serve` embed), side by side on the profile's backbone: word pieces per text and wall time, round-robin rounds on the
same texts (the ratio per round, then its median), with the machine's load.

    python bench/user_text.py [--n 512] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    import numpy as np
    import pandas as pd

    from assets.definitions import build_resources
    from pipeline.core.prompts import task_texts
    from pipeline.profile import load_profile
    from pipeline.tasks.sources import load_source

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=512, help="demo tasks (a seeded sample over the three sources)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    prof = load_profile("demo")
    tasks = pd.concat([load_source(s) for s in prof.sources]).sample(args.n, random_state=0)
    texts = {"prompt (before)": tasks["prompt"].tolist(), "user text (now)": task_texts(tasks)}
    bb = build_resources(profile=prof)["backbone"].get_backbone()  # the lineage's own backbone resource
    bb.encode(texts["user text (now)"][:8])  # warm (and load the tokenizer)
    tok = bb.tokenizer
    pieces = {k: (float(np.mean([len(tok(t)["input_ids"]) for t in v])) if tok else None) for k, v in texts.items()}
    secs: dict[str, list[float]] = {k: [] for k in texts}
    for _ in range(args.rounds):
        for k, v in texts.items():
            t0 = time.perf_counter()
            bb.encode(v)
            secs[k].append(time.perf_counter() - t0)
    ratio = float(np.median(np.array(secs["user text (now)"]) / np.array(secs["prompt (before)"])))
    out = {"n": args.n, "rounds": args.rounds, "backbone": {"backend": bb.backend, "precision": bb.precision},
           "load_average": os.getloadavg()[0],
           **{k: {"word_pieces_mean": pieces[k], "seconds_median": float(np.median(s)),
                  "texts_per_s": args.n / float(np.median(s))} for k, s in secs.items()},
           "time_ratio_now_over_before": ratio}
    for k in texts:
        print(f"{k:18s} {pieces[k] or float('nan'):7.1f} word pieces/text  {np.median(secs[k]):7.2f} s  "
              f"{args.n / np.median(secs[k]):7.1f} texts/s")
    print(f"now / before: {ratio:.2f}x the time ({bb.backend} {bb.precision}, load {out['load_average']:.1f})")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
