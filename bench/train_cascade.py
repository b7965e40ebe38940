"""`router-lite train` at size with cascades: a 12,000-row matrix with `answers` built from the bundled MMLU-Pro
recordings (real replies of the `mmlu_pro_wide` pool's models, graded here; costs chars/4 × list prices), then the
CLI timed end to end. Prints the wall time of the whole command and the cascade targets from its JSON.

    python bench/train_cascade.py [--rows 12000] [--backbone ID] [--generations 60]

The embedding of 12,000 prompts dominates a cold run on a CPU (MiniLM: minutes); the cache under ROUTER_LITE_HOME
makes a second run pay only for fitting, and the script runs the command twice to show both.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.collect.grading import grade  # noqa: E402
from pipeline.tasks.sources import load_source  # noqa: E402
from resources.pool import PoolResource  # noqa: E402


def build(rows: int, out: Path) -> tuple[Path, Path, int]:
    pool = PoolResource(kind="replay", pool="mmlu_pro_wide")
    agents, store = pool.agents(), pool.store()
    names = [a.name for a in agents]
    tasks = load_source("mmlu_pro")
    rng = np.random.default_rng(0)
    rew, tk = [], []
    for t in tasks.itertuples():
        texts = [store.text_for(a.model, t.prompt) for a in agents]
        if not all(texts):
            continue
        graded = [grade(x, t.gold, t.grader) for x in texts]
        rew.append({"task_id": t.task_id, "agent_order": names, "mean_reward": [float(c) for _, c in graded],
                    "mean_cost": [a.cost(len(t.prompt) // 4, len(x) // 4) for a, x in zip(agents, texts)],
                    "answers": [a for a, _ in graded]})
        tk.append({"task_id": t.task_id, "prompt": t.prompt, "grader": t.grader, "category": t.category,
                   "split": rng.choice(["train", "validation", "test"], p=[0.6, 0.2, 0.2])})
        if len(rew) >= rows:
            break
    pd.DataFrame(rew).to_parquet(out / "rewards.parquet")
    pd.DataFrame(tk).to_parquet(out / "tasks.parquet")
    return out / "rewards.parquet", out / "tasks.parquet", len(rew)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=12_000)
    ap.add_argument("--backbone", default=None)
    ap.add_argument("--generations", type=int, default=60)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        r, t, n = build(a.rows, Path(tmp))
        print(f"matrix: {n} rows with answers, built in {time.perf_counter() - t0:.0f} s")
        cmd = [sys.executable, "-m", "cli.main", "train", "--rewards", str(r), "--tasks", str(t),
               "--generations", str(a.generations), "--out", str(Path(tmp) / "reg")]
        if a.backbone:
            cmd += ["--backbone", a.backbone]
        for run in ("cold", "warm (embeddings cached)"):
            t0 = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            wall = time.perf_counter() - t0
            if p.returncode != 0:
                print(p.stderr[-2000:])
                return p.returncode
            out = json.loads(p.stdout)
            print(f"router-lite train, {run}: {wall:.0f} s, rc 0; cascade {out['cascade']['chosen']}, AIQ "
                  + json.dumps(out["cascade"]["aiq"]))
        print(json.dumps(out["cascade"]["targets"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
