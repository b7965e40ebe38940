"""`router-lite train` with `answers` and `grader`: cascades are fitted from the user's own matrix (real
ZeroEval recordings of the demo pool) and printed like the head's targets; `route` prints the plan, and the
registered entry's standalone reference code tells the same first step."""
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from cli.main import main
from pipeline.collect.grading import grade
from pipeline.tasks.sources import load_source
from resources.pool import PoolResource

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cascade_train")
    pool = PoolResource(kind="replay", pool="demo")
    agents, store = pool.agents(), pool.store()
    names = [a.name for a in agents]
    tasks = pd.concat([load_source("zeroeval_gsm8k").iloc[:500], load_source("zeroeval_crux").iloc[:300]])
    rng = np.random.default_rng(0)
    rows, trows = [], []
    for t in tasks.itertuples():
        texts = [store.text_for(a.model, t.prompt) for a in agents]
        if not all(texts):
            continue
        graded = [grade(x, t.gold, t.grader) for x in texts]
        cost = [a.cost(len(t.prompt) // 4, len(x) // 4) for a, x in zip(agents, texts)]
        rows.append({"task_id": t.task_id, "agent_order": names, "mean_reward": [float(c) for _, c in graded],
                     "mean_cost": cost, "answers": [a for a, _ in graded]})
        trows.append({"task_id": t.task_id, "prompt": t.prompt, "grader": t.grader,
                      "split": rng.choice(["train", "validation", "test"], p=[0.6, 0.2, 0.2])})
    pd.DataFrame(rows).to_json(d / "rewards.jsonl", orient="records", lines=True)
    pd.DataFrame(trows).to_parquet(d / "tasks.parquet")
    return d, trows


def test_train_fits_and_registers_cascades(files, tmp_path, monkeypatch, capsys):
    d, trows = files
    monkeypatch.setenv("ROUTER_LITE_HOME", str(tmp_path))
    rc = main(["train", "--rewards", str(d / "rewards.jsonl"), "--tasks", str(d / "tasks.parquet"),
               "--generations", "3", "--out", str(tmp_path / "reg")])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    out = json.loads(captured.out)
    c = out["cascade"]
    assert {"max-quality", "parity", "quality>=0.98"} <= set(c["targets"])
    for t in c["targets"].values():
        assert t["cost_ratio"] is not None and 0 < t["quality_ratio"] and t["plan"]
    assert "## Cascade (cascade;" in captured.err and c["registered"].split("/")[-1].startswith("cascade-")
    gsm = next(t["prompt"] for t in trows if t["grader"] == "integer" and t["split"] == "test")
    assert main(["route", "--head", c["registered"], "--grader", "integer", "--target", "parity", gsm]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("plan[integer]\t") and printed[1].split("\t")[0] in ("stages", "alone")
    ref = subprocess.run([sys.executable, "reference.py", "--grader", "integer", "--target", "parity", gsm],
                         cwd=c["registered"], capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    assert ref.stdout.split("\t")[0] == printed[1].split("\t")[0]
    assert main(["route", "--head", out["registered"], "--grader", "integer", gsm]) == 2  # a head has no plan
    assert "--grader applies to cascade routers" in capsys.readouterr().err
