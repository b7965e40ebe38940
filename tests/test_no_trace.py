"""Tests leave no trace: the suite runs Dagster on a temporary instance, and the session fixture
`no_trace` (tests/conftest.py) fails the run when a file under the repository's instance folders was written or a
process the suite started is still alive. These tests check the two detectors themselves."""
import os
import subprocess
import sys
from pathlib import Path

import _support
from _support import INSTANCE_DIRS, REPO, SESSION_MARK, repo_instance_files, session_processes


def test_dagster_and_the_home_point_at_temporary_folders():
    for var in ("DAGSTER_HOME", "ROUTER_LITE_HOME"):
        path = Path(os.environ[var]).resolve()
        assert REPO not in path.parents and path != REPO, (var, path)
    assert Path(os.environ["DAGSTER_HOME"], "dagster.yaml").exists()


def test_a_process_left_running_is_found():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert any(line.startswith(f"{p.pid}: ") for line in session_processes(os.environ[SESSION_MARK]))
    finally:
        p.kill()
        p.wait()
    assert not any(line.startswith(f"{p.pid}: ") for line in session_processes(os.environ[SESSION_MARK]))


def test_a_file_written_under_an_instance_folder_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(_support, "REPO", tmp_path)
    assert repo_instance_files() == {}
    (tmp_path / INSTANCE_DIRS[0] / "runs").mkdir(parents=True)
    (tmp_path / INSTANCE_DIRS[0] / "runs" / "r.db").write_text("x")
    assert list(repo_instance_files()) == [f"{INSTANCE_DIRS[0]}/runs/r.db"]
