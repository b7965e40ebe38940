"""Cross-check the project's baselines against an independent count from the raw MMLU-Pro recordings.

Independent count: correctness = the official `pred` field == gold, straight from TIGER-Lab's zips (no replay, no
our grading), over the same task pool. Differences come only from answer extraction (bench/extraction_agreement.py
explains them). Usage (maintainers; needs the public zips):
    python scripts/independent_count.py --home .router-lite \
        --zips ../shared/data/reward-matrices/mmlu-pro-tiger-eval-results
"""
import argparse
import json
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from pipeline.collect.rewards import to_arrays
from resources.storage import asset_path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--home", default=".router-lite")
    ap.add_argument("--zips", default=str(Path(__file__).resolve().parents[2]
                                          / "shared/data/reward-matrices/mmlu-pro-tiger-eval-results"))
    ap.add_argument("--pool", default="mmlu_pro")
    a = ap.parse_args()
    home = Path(a.home)
    pool = pd.read_parquet(asset_path(home, "task_pool"))
    rewards = pd.read_parquet(asset_path(home, "reward_matrix"))
    agents, R, _, _ = to_arrays(rewards)
    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "config/agents.yaml").read_text())
    model_of = {x["name"]: x["model"] for x in cfg["pools"][a.pool]["agents"]}
    qid = pool.set_index("task_id").loc[rewards["task_id"], "question_id"].astype(int).to_numpy()
    official = np.zeros_like(R)
    for j, agent in enumerate(agents):
        with zipfile.ZipFile(Path(a.zips) / f"model_outputs_{model_of[agent]}_5shots.zip") as z:
            recs = {r["question_id"]: r for r in json.loads(z.read(z.namelist()[0])) if isinstance(r, dict)}
        official[:, j] = [float(recs[q]["pred"] == recs[q]["answer"]) for q in qid]
    test = pool.set_index("task_id").loc[rewards["task_id"], "split"].eq("test").to_numpy()
    for name, M in (("project (replay + our grading, mean of 3 reps)", R),
                    ("independent (official pred == gold)", official)):
        best = int(np.argmax(M.mean(axis=0)))
        print(f"{name}:\n  per agent {dict(zip(agents, M.mean(axis=0).round(4).tolist()))}\n"
              f"  best single {agents[best]} {M[:, best].mean():.4f} | oracle {M.max(axis=1).mean():.4f} | "
              f"random {M.mean():.4f} | test best single {M[test, best].mean():.4f}")
    diff = (R != official)
    print(f"cells that differ: {int(diff.sum())} of {diff.size} ({diff.mean():.2%}); per agent "
          f"{dict(zip(agents, diff.sum(axis=0).tolist()))}")


if __name__ == "__main__":
    main()
