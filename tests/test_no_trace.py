"""Tests leave no trace: the suite runs Dagster on a temporary instance, and the session fixture
`no_trace` (tests/conftest.py) fails the run when a file under the repository's instance folders was written or a
process the suite started is still alive. These tests check the two detectors themselves."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import _support
import pytest
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


def test_a_session_fixture_built_once_is_built_by_one_worker_and_loaded_by_the_others(tmp_path, monkeypatch):
    """`built_once` under pytest-xdist: two workers (two temp roots under one run folder) get the same result, built
    by the first alone; a build that fails leaves nothing behind, and the next worker builds afresh."""
    from _support import built_once

    class Factory:  # what tmp_path_factory offers `built_once`: a worker's own temp root under the run's folder
        def __init__(self, worker):
            self.root = tmp_path / "run" / f"popen-{worker}"
            self.root.mkdir(parents=True)

        def getbasetemp(self):
            return self.root

    builds = []

    def build(root):
        builds.append(root)
        (root / "made").write_text(str(len(builds)))
        return {"root": root, "n": len(builds)}

    def broken(root):
        builds.append(root)
        raise RuntimeError("no model")

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    with pytest.raises(RuntimeError, match="no model"):
        built_once(Factory("gw0"), "thing", broken)
    first = built_once(Factory("gw1"), "thing", build)
    assert built_once(Factory("gw2"), "thing", build) == first == {"root": builds[1], "n": 2}
    assert len(builds) == 2 and builds[0] != builds[1] and builds[1].parent == tmp_path / "run"
    assert (builds[1] / "made").read_text() == "2"
    monkeypatch.delenv("PYTEST_XDIST_WORKER")  # one process: built every time, under the factory's own folder

    class Plain:
        def mktemp(self, name):
            return Path(tempfile.mkdtemp(prefix=name, dir=tmp_path))

    assert built_once(Plain(), "thing", build)["n"] == 3
