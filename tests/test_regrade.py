"""Regrading stored completions: zero calls, and a changed grader changes the grades."""
import json

import pandas as pd
import pytest
from dagster import DagsterInstance

from assets.definitions import build_definitions
from cli.main import main
from pipeline.collect.regrade import regrade
from resources.storage import asset_path


def _calls():
    return pd.DataFrame([
        {"task_id": "t1", "status": "ok", "response_text": "so the answer is (B).", "extracted": "A", "correct": False},
        {"task_id": "t1", "status": "empty", "response_text": "", "extracted": None, "correct": False},
        {"task_id": "t1", "status": "error", "response_text": None, "extracted": None, "correct": None},
    ])


def test_regrade_recomputes_ok_rows_only():
    tasks = pd.DataFrame({"task_id": ["t1"], "gold": ["B"], "grader": ["mcq_letter"]})
    out, changed = regrade(_calls(), tasks)
    assert changed == 1
    assert out.loc[0, "extracted"] == "B" and out.loc[0, "correct"] is True
    assert out.loc[1, "correct"] is False and out.loc[2, "correct"] is None  # empty stays wrong, error ungraded


@pytest.mark.slow
def test_regrade_cli_rewrites_stored_grades(smoke_home_copy, monkeypatch, capsys):
    home = smoke_home_copy("regrade-cli")
    f = sorted(asset_path(home, "graded_calls").parent.glob("*.parquet"))[0]
    calls = pd.read_parquet(f)
    truth = calls["correct"].copy()
    calls["correct"] = ~calls["correct"].astype(bool)  # plant wrong grades
    calls.to_parquet(f)
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    assert main(["regrade"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["changed"] == len(calls)
    assert pd.read_parquet(f)["correct"].tolist() == truth.tolist()


@pytest.mark.slow
def test_regrade_job_makes_zero_calls(smoke_home_copy, tmp_path):
    home = smoke_home_copy("regrade-job")
    defs = build_definitions(home=str(home), profile="smoke")
    job = defs.resolve_job_def("regrade_calls")
    log_dir = home / "calls" / "replay" / "mmlu_pro" / "rep0"
    sizes = {p.name: p.stat().st_size for p in log_dir.glob("*.jsonl")}
    result = job.execute_in_process(partition_key="0|mmlu_pro", instance=DagsterInstance.ephemeral())
    assert result.success
    md = result.asset_materializations_for_node("graded_calls")[0].metadata
    assert md["new_calls"].value == 0 and md["calls"].value == 300 * 5
    assert {p.name: p.stat().st_size for p in log_dir.glob("*.jsonl")} == sizes  # the log was not touched
