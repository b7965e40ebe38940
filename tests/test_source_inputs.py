"""Malformed task sources: one RouterLiteError naming file, row and field, never a raw
KeyError / TypeError / AttributeError; and `router-lite run` shows it as one line, exit 2, no Dagster trace."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import RouterLiteError
from pipeline.tasks.sources import load_source

REPO = Path(__file__).resolve().parents[1]
GOOD_PRO = {"question": "q?", "options": ["x", "y", "z"], "answer": "B", "question_id": 7, "category": "math"}


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("bad, needle", [
    ({k: v for k, v in GOOD_PRO.items() if k != "options"}, "row 1: field 'options' must be a non-empty list"),
    ({**GOOD_PRO, "options": None}, "row 1: field 'options' must be a non-empty list of options, got NoneType"),
    ({**GOOD_PRO, "options": ["x", None]}, "row 1: field 'options' has a null option"),
    ({k: v for k, v in GOOD_PRO.items() if k != "question_id"}, "row 1: no 'question_id'"),
    ([1, 2, 3], "row 1 is not an object with named fields (got list"),
    ("just text", "row 1 is not an object with named fields (got str"),
])
def test_malformed_mmlu_pro_rows_name_file_row_field(tmp_path, bad, needle):
    f = jsonl(tmp_path / "pro.jsonl", [GOOD_PRO, bad])
    with pytest.raises(RouterLiteError) as exc:
        load_source("mmlu_pro", path=f)
    assert "pro.jsonl" in str(exc.value) and needle in str(exc.value), str(exc.value)


def test_malformed_rows_of_other_sources(tmp_path):
    arc = {"question": "q", "options": [{"label": "A", "text": "x"}, {"label": "B", "text": "y"}], "answer": "A"}
    f = jsonl(tmp_path / "arc.jsonl", [arc, {**arc, "options": ["x", "y"]}])
    with pytest.raises(RouterLiteError, match=r"arc.jsonl: row 1: field 'options' must be a list of \{label, text\}"):
        load_source("arc_challenge", path=f)
    f = jsonl(tmp_path / "arc2.jsonl", [{"question": "q", "answer": "A"}])
    with pytest.raises(RouterLiteError, match=r"arc2.jsonl: row 0: no 'options' list and no 'choices' object"):
        load_source("arc_challenge", path=f)
    mm = {"question": "q", "A": "1", "B": "2", "C": "3", "D": "4", "answer": "A"}
    f = jsonl(tmp_path / "mmlu.jsonl", [mm, {**mm, "C": None}])
    with pytest.raises(RouterLiteError, match=r"mmlu.jsonl: row 1: no 'C'"):
        load_source("mmlu", path=f)
    # a wrong type deep in a field the source has no explicit check for: still file + row, no raw TypeError
    f = jsonl(tmp_path / "math.jsonl", [{"problem": "1+1", "answer": "2", "level": 1},
                                        {"problem": "2+2", "answer": "4", "level": "Level 5"}])
    with pytest.raises(RouterLiteError, match=r"math.jsonl: row 1: a field has the wrong type or value \(ValueError"):
        load_source("math500", path=f)


@pytest.mark.slow
def test_run_prints_a_step_failure_as_one_line(tmp_path, temp_instance_dir):
    """A user error inside a Dagster step of `router-lite run`: one line, exit 2, no stack trace; --debug shows it."""
    config = tmp_path / "config"
    shutil.copytree(REPO / "config", config)
    bad = jsonl(tmp_path / "bad.jsonl", [{**GOOD_PRO, "options": None}])
    prof = config / "profiles" / "smoke.yaml"
    prof.write_text(prof.read_text().replace("mmlu_pro: {}", f"mmlu_pro: {{path: {bad}}}"))
    env = {**os.environ, "ROUTER_LITE_CONFIG": str(config), "ROUTER_LITE_HOME": str(tmp_path / "home"),
           "DAGSTER_HOME": str(temp_instance_dir), "PYTHONPATH": str(REPO)}
    env.pop("ROUTER_LITE_LOG_LEVEL", None)
    env.pop("ROUTER_LITE_DEBUG", None)
    cmd = [sys.executable, "-m", "cli.main", "run", "--profile", "smoke", "--upto", "source_tasks"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO,
                       check=False)
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert p.returncode == 2, p.stderr
    assert len(lines) == 1, lines
    assert lines[0] == ("router-lite: error: source tasks (partition mmlu_pro): " + bad
                        + ": row 0: field 'options' must be a non-empty list of options, got NoneType 'None'")
    p = subprocess.run([sys.executable, "-m", "cli.main", "--debug", *cmd[3:]], env=env, capture_output=True,
                       text=True, timeout=300, cwd=REPO, check=False)
    assert p.returncode != 0 and "Traceback" in p.stderr


@pytest.mark.slow
def test_run_replays_step_warnings_and_finds_the_user_error():
    """With Dagster's console silenced, a step's own warnings are still printed, and the RouterLiteError that failed
    the run is found in its failure event (a bug is not taken for a user error)."""
    from dagster import DagsterInstance, asset, materialize

    from cli.run import _print_warnings, user_error

    @asset
    def shaky(context):
        context.log.warning("pre-flight failed for agent x")
        raise RouterLiteError("profile.yaml: bad thing\nsecond line")

    @asset
    def buggy():
        return {}["missing"]

    with DagsterInstance.ephemeral() as inst:
        res = materialize([shaky], instance=inst, raise_on_error=False,
                          run_config={"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}})
        printed = []
        _print_warnings(inst, res.run_id, printed.append)
        assert printed == ["  warning: shaky: pre-flight failed for agent x"]
        assert user_error(res) == "profile.yaml: bad thing\nsecond line"
        assert user_error(materialize([buggy], instance=inst, raise_on_error=False)) is None
