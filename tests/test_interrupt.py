"""Ctrl-C of `router-lite run` during the collection: one line and the shell's code for SIGINT, no traceback (the
mirroring helpers of Dagster's compute-log capture take no Ctrl-C: resources/compute_logs.py); the rerun resumes
from the call logs, no call lost or made twice."""
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(tmp: Path, dagster_home: Path, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTER_LITE_PROFILE", "ROUTER_LITE_LOG_LEVEL")}
    env.update({"ROUTER_LITE_HOME": str(tmp / "home"), "DAGSTER_HOME": str(dagster_home),
                "PYTHONPATH": str(REPO), "PYTHONFAULTHANDLER": "1"})  # SIGABRT: every thread's stack
    # its own process group, as a terminal's foreground job: the SIGINT below reaches every process of it
    return subprocess.Popen([sys.executable, "-m", "cli.main", "run", "--profile", "smoke", "--upto", "graded_calls",
                             *args], cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _call_keys(home: Path) -> list[str]:
    return [json.loads(line)["call_key"] for f in (home / "calls").rglob("*.jsonl") for line in f.open()]


class _Interrupt(BaseException):
    """An orchestrator's own interrupt (Dagster's DagsterExecutionInterruptedError is such a BaseException)."""


@pytest.mark.parametrize("taken", [False, True], ids=["cancel propagates", "cancel taken"])
def test_an_interrupt_raised_inside_a_loop_callback_stops_run_sync(taken):
    """A SIGINT handler that raises inside one of the loop's own callbacks (its wake-up read, as in a CI run) stops
    the coroutine with that interrupt instead of being logged and dropped while the collection runs to its end."""
    from pipeline.collect.calls import run_sync

    def interrupt():
        raise _Interrupt()

    async def collection():
        asyncio.get_running_loop().call_later(0.05, interrupt)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            if not taken:
                raise
        return "ran to its end"

    started = time.monotonic()
    with pytest.raises(_Interrupt):
        run_sync(collection())
    assert time.monotonic() - started < 10


@pytest.mark.slow
def test_ctrl_c_during_collection_is_one_line_and_the_rerun_resumes(tmp_path, temp_instance_dir):
    proc = _run(tmp_path, temp_instance_dir)
    err: list[str] = []
    deadline = time.monotonic() + 300
    for line in proc.stderr:  # the first partition's calls have started: Ctrl-C lands inside the collection (an idle
        err.append(line)      # replay pool makes a partition's 1,500 calls in about a second, faster than a sleep)
        if "collect: 1/" in line or time.monotonic() > deadline:
            break
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    try:
        rest = proc.communicate(timeout=120)[1]
    except subprocess.TimeoutExpired:  # a hang fails here, with where each thread waits, instead of blocking the run
        os.killpg(proc.pid, signal.SIGABRT)
        rest = proc.communicate(timeout=30)[1]
        pytest.fail("router-lite run still ran 120 s after Ctrl-C; its threads:\n" + rest[-12000:])
    after = [ln for ln in rest.splitlines() if " INFO " not in ln]  # the log lines the run printed before it stopped
    assert proc.returncode == 130, "".join(err) + rest
    assert "Traceback" not in rest and len(after) <= 3, rest
    assert after[-1].startswith("router-lite: interrupted; rerun resumes: ") and after[-1].endswith(" calls logged")
    logged = len(_call_keys(tmp_path / "home"))
    assert f"{logged:,} calls logged" in after[-1]

    again = _run(tmp_path, temp_instance_dir)
    out, err2 = again.communicate(timeout=600)
    assert again.returncode == 0, err2[-3000:]
    keys = _call_keys(tmp_path / "home")
    assert len(keys) == len(set(keys)) > logged  # nothing twice, the rest made
    assert "already done" in err2


def test_without_dagster_home_the_repositorys_instance_records_the_runs(tmp_path, monkeypatch):
    """`router-lite run` in the repository root without DAGSTER_HOME records its runs in the root's instance (what
    `make run` and `make ui` use), saying so in one line; elsewhere an ephemeral instance, said too."""
    import cli.run

    repo = tmp_path / "repo"
    (repo / "dagster.yaml").parent.mkdir()
    (repo / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setattr(cli.run, "REPO", repo)
    monkeypatch.delenv("DAGSTER_HOME")
    said = []
    monkeypatch.chdir(repo)
    with cli.run._instance(said.append) as instance:
        assert instance.root_directory == str(repo) and not instance.is_ephemeral
    assert said == [f"Dagster instance: {repo} (DAGSTER_HOME unset: the repository's, which `make ui` shows)"]
    monkeypatch.delenv("DAGSTER_HOME")
    monkeypatch.chdir(tmp_path)
    with cli.run._instance(said.append) as instance:
        assert instance.is_ephemeral
    assert said[-1].startswith("Dagster instance: ephemeral (DAGSTER_HOME unset)")
