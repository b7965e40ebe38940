"""Collection under injected provider faults (tests/fault_server.py on 127.0.0.1).

Every fault is either retried to success or recorded with the right status/error_kind; an error is never graded as
a wrong answer; a SIGKILLed collection resumes with 0 lost calls and 0 duplicated rows; the API key never leaks.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import openai
import pandas as pd
import pytest

from pipeline.collect.agents import AgentSpec, load_agents
from pipeline.collect.call_log import CallLog, call_key
from pipeline.collect.calls import collect
from pipeline.collect.client import call_once
from pipeline.collect.settings import CollectionSettings
from pipeline.core.errors import RouterLiteError

sys.path.insert(0, str(Path(__file__).parent))
from fault_server import FaultServer, phash  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SENTINEL = "sk-or-v1-SENTINEL-0123456789abcdef-DO-NOT-LEAK"
AGENT = AgentSpec("a1", "m1", "local", None, 1.0, 2.0, "test")
AGENT2 = AgentSpec("a2", "m2", "local", None, 0.5, 0.5, "test")
FAST = CollectionSettings(timeout_s=0.4, max_retries=2, backoff_base_s=0.01, backoff_max_s=0.05, concurrency=8)


@pytest.fixture(scope="module")
def server():
    with FaultServer(hang_s=1.5, retry_after="0.1") as srv:
        yield srv


@pytest.fixture(autouse=True)
def _clean(server):
    with server._lock:
        server._queues.clear()
        server._always.clear()
    yield


def client_for(server, key="sk-test"):
    return lambda agent: openai.AsyncOpenAI(base_url=server.base_url, api_key=key, max_retries=0)


def one(server, prompt, settings=FAST, key="sk-test"):
    async def run():
        client = client_for(server, key)(AGENT)
        try:
            return await call_once(client, AGENT, prompt, settings)
        finally:
            await client.close()
    return asyncio.run(run())


RETRIED = [("rate_limit", 2), ("rate_limit_date", 1), ("server_error", 2), ("timeout", 1), ("reset", 2),
           ("malformed", 2)]


@pytest.mark.parametrize("fault,times", RETRIED)
def test_transient_fault_is_retried_to_success(server, fault, times):
    prompt = f"retry {fault}"
    server.script(fault, times=times, model="m1", prompt=prompt)
    t0 = time.monotonic()
    r = one(server, prompt)
    elapsed = time.monotonic() - t0
    assert r["status"] == "ok" and r["attempts"] == times + 1, r
    assert server.hit_counts()[("m1", phash(prompt))] == times + 1
    if fault == "rate_limit":
        assert elapsed >= 0.2 * 0.9  # Retry-After: 0.1 s honoured twice
    if fault == "rate_limit_date":
        assert elapsed >= 0.0  # HTTP-date Retry-After parsed (<= ~1 s wait)


@pytest.mark.parametrize("fault,kind", [("server_error", "server_error"), ("rate_limit", "rate_limit"),
                                        ("timeout", "timeout"), ("reset", "connection"),
                                        ("malformed", "bad_response")])
def test_persistent_fault_is_recorded_as_error(server, fault, kind):
    prompt = f"persistent {fault}"
    server.script(fault, times=FAST.max_retries + 1, model="m1", prompt=prompt)
    r = one(server, prompt)
    assert r["status"] == "error" and r["error_kind"] == kind and r["attempts"] == FAST.max_retries + 1
    assert r["response_text"] is None and r["cost_usd"] is None


@pytest.mark.parametrize("fault,kind", [("not_found", "not_found"), ("auth_echo", "auth")])
def test_permanent_fault_not_retried(server, fault, kind):
    prompt = f"permanent {fault}"
    server.script(fault, times=5, model="m1", prompt=prompt)
    r = one(server, prompt)
    assert (r["status"], r["error_kind"], r["attempts"]) == ("error", kind, 1)
    assert server.hit_counts()[("m1", phash(prompt))] == 1


def test_long_retry_after_is_not_waited(server):
    prompt = "long retry-after"
    server.script("rate_limit", times=1, model="m1", prompt=prompt)
    settings = CollectionSettings(timeout_s=0.4, max_retries=2, max_retry_after_s=0.05)
    t0 = time.monotonic()
    r = one(server, prompt, settings)
    assert time.monotonic() - t0 < 1.0
    assert r["status"] == "error" and r["error_kind"] == "rate_limit" and "not waited" in r["error_message"]


def test_content_faults_statuses(server):
    for fault in ("empty", "null_content", "length", "no_usage", "cost"):
        server.script(fault, times=1, model="m1", prompt=f"content {fault}")
    got = {f: one(server, f"content {f}") for f in ("empty", "null_content", "length", "no_usage", "cost")}
    assert got["empty"]["status"] == "empty" and got["null_content"]["status"] == "empty"
    assert got["empty"]["attempts"] == 1  # an empty answer is an answer: not retried
    assert got["length"]["status"] == "ok" and got["length"]["finish_reason"] == "length"
    nu = got["no_usage"]
    assert nu["status"] == "ok" and nu["usage_source"] == "estimated" and nu["completion_tokens"] > 0
    assert nu["cost_usd"] == pytest.approx(AGENT.cost(nu["prompt_tokens"], nu["completion_tokens"]))
    assert got["cost"]["cost_usd"] == pytest.approx(0.0123) and got["cost"]["usage_source"] == "provider"


def tasks_frame(n, prefix="q"):
    return pd.DataFrame({"task_id": [f"fault/test/{i:06d}" for i in range(n)],
                         "prompt": [f"{prefix} {i}" for i in range(n)], "gold": "A", "grader": "mcq_letter"})


def test_collect_errors_are_logged_never_graded_and_retried_next_time(server, tmp_path):
    tasks = tasks_frame(6, "collect")
    server.script("server_error", times=FAST.max_retries + 1, model="m1", prompt="collect 1")
    server.script("timeout", times=FAST.max_retries + 1, model="m2", prompt="collect 2")
    server.script("empty", times=1, model="m1", prompt="collect 3")
    server.script("length", times=1, model="m2", prompt="collect 4")
    log = CallLog(tmp_path)
    df = asyncio.run(collect(tasks, [AGENT, AGENT2], 0, log, client_for(server), FAST))
    assert len(df) == 12 and df["call_key"].is_unique
    err = df[df.status == "error"]
    assert sorted(err.error_kind) == ["server_error", "timeout"]
    assert err["correct"].isna().all() and err["extracted"].isna().all()  # never a wrong answer
    ok = df[df.status != "error"]
    assert ok["correct"].map(lambda v: isinstance(v, bool)).all()
    assert not df.loc[df.status == "empty", "correct"].any()
    cut = df.finish_reason == "length"  # the cut answer lost its "(A)": graded wrong, as it should be
    assert cut.sum() == 1 and not df.loc[cut, "correct"].any()
    assert df[(df.status == "ok") & ~cut]["correct"].all()  # the server answers (A), gold A
    # errors are in the log but not done
    assert len(log.read()) == 12 and len(log.keys()) == 10
    before = server.total_hits
    df2 = asyncio.run(collect(tasks, [AGENT, AGENT2], 0, log, client_for(server), FAST))
    assert server.total_hits - before == 2  # only the two error calls are re-made
    assert (df2.status != "error").all() and len(df2) == 12 and len(log.read()) == 14
    assert len(log.keys()) == 12


def test_unknown_agent_and_empty_pool_are_clear_errors(tmp_path):
    with pytest.raises(RouterLiteError, match="empty agent pool"):
        asyncio.run(collect(tasks_frame(1), [], 0, CallLog(tmp_path), lambda a: None, FAST))
    with pytest.raises(RouterLiteError, match="no_such_agent"):
        load_agents(REPO / "config" / "agents.yaml", "demo", only=["no_such_agent"])
    cfg = tmp_path / "agents.yaml"
    cfg.write_text("pools:\n  hollow:\n    provider: x\n    agents: []\n")
    with pytest.raises(RouterLiteError, match="'hollow'.*no agents"):
        load_agents(cfg, "hollow")
    with pytest.raises(RouterLiteError, match="unknown pool 'nope'"):
        load_agents(cfg, "nope")


def test_api_key_never_leaks(server, tmp_path, caplog, capfd, monkeypatch):
    caplog.set_level(logging.DEBUG)
    tasks = tasks_frame(4, "secret")
    server.script("auth_echo", times=1, model="m1", prompt="secret 0")
    server.script("server_error", times=FAST.max_retries + 1, model="m1", prompt="secret 1")
    server.script("reset", times=FAST.max_retries + 1, model="m2", prompt="secret 2")
    log = CallLog(tmp_path / "calls")
    df = asyncio.run(collect(tasks, [AGENT, AGENT2], 0, log, client_for(server, SENTINEL), FAST))
    assert f"Bearer {SENTINEL}" in server.auth_seen  # the key was really sent ...
    assert (df.error_kind == "auth").sum() == 1
    # ... and is nowhere else: log records, stderr/stdout, call-log files, recorded error texts
    assert SENTINEL not in caplog.text
    out, err = capfd.readouterr()
    assert SENTINEL not in out and SENTINEL not in err
    for path in (tmp_path / "calls").iterdir():
        assert SENTINEL not in path.read_text()
    assert not df.astype(str).apply(lambda c: c.str.contains(SENTINEL, regex=False)).any().any()
    # the resource: repr, missing-key message
    from resources.pool import PoolResource

    res = PoolResource(kind="openrouter", api_key=SENTINEL)
    assert SENTINEL not in repr(res) and SENTINEL not in str(res)
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(RouterLiteError, match="OPENROUTER_API_KEY") as exc:
        PoolResource(kind="openrouter").client_for(AGENT)
    assert SENTINEL not in str(exc.value)


KILL_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, sys.argv[4])
    import openai, pandas as pd
    from pipeline.collect.call_log import CallLog
    from pipeline.collect.agents import AgentSpec
    from pipeline.collect.calls import collect
    from pipeline.collect.settings import CollectionSettings
    base_url, log_dir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    agents = [AgentSpec("a1", "m1", "local", None, 1.0, 2.0), AgentSpec("a2", "m2", "local", None, 0.5, 0.5)]
    tasks = pd.DataFrame({"task_id": [f"kill/test/{i:06d}" for i in range(n)],
                          "prompt": [f"kill {i}" for i in range(n)], "gold": "A", "grader": "mcq_letter"})
    settings = CollectionSettings(concurrency=8, timeout_s=5, max_retries=1, backoff_base_s=0.01)
    asyncio.run(collect(tasks, agents, 0, CallLog(log_dir), lambda a: openai.AsyncOpenAI(
        base_url=base_url, api_key="sk-test", max_retries=0), settings))
""")


@pytest.mark.slow
def test_sigkill_mid_partition_then_resume(tmp_path, record_property):
    n, agents = 150, [AGENT, AGENT2]
    settings = CollectionSettings(concurrency=8, timeout_s=5, max_retries=1, backoff_base_s=0.01)
    log_dir = tmp_path / "calls"
    script = tmp_path / "collect_once.py"
    script.write_text(KILL_SCRIPT)
    with FaultServer(latency_s=0.03) as srv:
        proc = subprocess.Popen([sys.executable, str(script), srv.base_url, str(log_dir), str(n), str(REPO)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 40
        lines = 0
        while time.monotonic() < deadline and proc.poll() is None:
            lines = sum(p.read_bytes().count(b"\n") for p in log_dir.glob("*.jsonl")) if log_dir.exists() else 0
            if lines >= 100:
                break
            time.sleep(0.005)
        assert proc.poll() is None, f"collector ended before the kill: {proc.communicate()[1][-2000:]!r}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        time.sleep(0.3)  # requests already sent still reach the server: count them
        hits_at_kill = srv.hit_counts()
        done_at_kill = CallLog(log_dir).keys()
        assert 100 <= len(done_at_kill) < 2 * n
        # resume (same settings, same log directory)
        tasks = pd.DataFrame({"task_id": [f"kill/test/{i:06d}" for i in range(n)],
                              "prompt": [f"kill {i}" for i in range(n)], "gold": "A", "grader": "mcq_letter"})
        df = asyncio.run(collect(tasks, agents, 0, CallLog(log_dir), lambda a: openai.AsyncOpenAI(
            base_url=srv.base_url, api_key="sk-test", max_retries=0), settings))
        hits = srv.hit_counts()
    sh = settings.hash()
    wanted = {call_key(a.name, f"kill/test/{i:06d}", 0, sh): (a.model, phash(f"kill {i}"))
              for i in range(n) for a in agents}
    rows = CallLog(log_dir).read()
    done_rows = rows[rows.status.isin(["ok", "empty"])]
    lost = set(wanted) - set(done_rows.call_key)
    duplicated = int(done_rows.call_key.duplicated().sum())
    remade = sum(1 for v in hits.values() if v > 1)
    in_flight_at_kill = sum(hits_at_kill.values()) - len(done_at_kill)
    record_property("remade_after_sigkill", remade)
    print(f"\nSIGKILL after {len(done_at_kill)}/{len(wanted)} logged calls: lost={len(lost)} duplicated={duplicated} "
          f"re-made (in flight at kill)={remade}")
    assert not lost and duplicated == 0 and len(rows) == len(wanted)
    assert len(df) == len(wanted) and set(df.call_key) == set(wanted)
    assert sum(hits.values()) == len(wanted) + remade and max(hits.values()) <= 2
    assert remade == in_flight_at_kill <= settings.concurrency  # only calls in flight at the kill are re-made
    for k in done_at_kill:  # nothing already logged was called again
        assert hits[wanted[k]] == 1
