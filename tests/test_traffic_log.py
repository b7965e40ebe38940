"""The served traffic log (`serve --record-traffic`; pipeline/serve/traffic.py, resources/traffic.py): off by default
(nothing about a prompt in the home), on: one schema-valid line per request with the key's name and never the key,
one file per worker process, the retention sweep, `router-lite traffic ls / delete`, and a log that cannot be
written never failing a request. The app is the one `router-lite serve` builds (cli/main.py `_serve_setup` and
`_serve_app`, in process) over a head on a tiny static backbone and the mmlu_pro replay pool, asked prompts it has
recorded for every agent."""
from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from cli import main as cli
from pipeline.core.prompts import routed_text
from pipeline.serve.server import serve_in_thread
from resources import traffic

ROOT = Path(__file__).resolve().parents[1]
KEY = "rl-test-traffic-key-0123456789abcdef"
CALL_FIELDS = {"agent": str, "model": str, "reply": (str, type(None)), "cost_usd": (float, type(None)),
               "latency_ms": float, "finish_reason": (str, type(None)), "error": (str, type(None))}


def assert_schema(line: dict) -> None:
    """Every field of /work/notes TRAFFIC_SCHEMA.md v1, with its type, and nothing else."""
    common = {"v", "record", "request_id", "ts", "day"}
    assert line["v"] == 1 and len(line["request_id"]) == 32 and int(line["request_id"], 16) >= 0
    ts = datetime.datetime.fromisoformat(line["ts"].replace("Z", "+00:00"))
    assert line["ts"].endswith("Z") and ts.utcoffset() == datetime.timedelta(0) and line["day"] == line["ts"][:10]
    calls = line["calls"]
    for c in calls:
        assert set(c) == set(CALL_FIELDS) and all(isinstance(c[k], t) for k, t in CALL_FIELDS.items()), c
    if line["record"] == "exploration":
        assert set(line) == common | {"calls", "complete", "usd"}
        assert isinstance(line["complete"], bool) and isinstance(line["usd"], float)
        return
    assert line["record"] == "request"
    assert set(line) == common | {"router", "target", "pool", "agent_models", "routed_text", "messages",
                                  "conversation_hash", "decision", "calls", "explore", "key_name"}
    assert set(line["agent_models"]) == set(line["pool"]) and all(c["agent"] in line["pool"] for c in calls)
    assert all(set(m) == {"role", "content"} for m in line["messages"])
    want = hashlib.sha256(json.dumps(line["messages"], sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    assert line["conversation_hash"] == want
    d = line["decision"]
    assert set(d) == {"agent", "policy", "ood", "format"} and isinstance(d["ood"], bool)
    assert isinstance(d["policy"], str)
    assert isinstance(line["explore"], bool) and isinstance(line["key_name"], (str, type(None)))


def lines_of(home) -> list[dict]:
    return [r for d in traffic.days(home) for r in traffic.read_day(home, d)[0]]


@pytest.fixture
def serving(static_head_dir, tmp_path, monkeypatch):
    """A factory: the app `router-lite serve --head ... --profile mmlu_pro [extra]` builds, on loopback, in a home of
    its own (ROUTER_LITE_HOME); with the recorded prompts."""
    head_dir, prompts = static_head_dir
    home = tmp_path / "home"
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def start(*extra: str):
        args = cli.build_parser().parse_args(["serve", "--head", str(head_dir), "--profile", "mmlu_pro", "--port", "0",
                                              "--workers", "2", "--access-log", "off", *extra])
        cli._check_serve_args(args)
        served = cli._serve_setup(args)
        app, lines = cli._serve_app(args, served, 0)
        return serve_in_thread(app), lines

    return start, home, prompts


def ask(srv, prompt: str, key: str | None = None, **body):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(srv.base_url + "/chat/completions", headers=headers, timeout=60,
                      json={"messages": [{"role": "user", "content": prompt}], **body})


def test_off_by_default_no_prompt_is_kept_in_the_home(serving):
    start, home, prompts = serving
    srv, lines = start()
    with srv:
        assert ask(srv, prompts[0]).status_code == 200
    assert "recording traffic" not in lines[-1]
    assert not traffic.traffic_root(home).exists()
    probe = routed_text([prompts[0]])[:60].encode()
    files = [f for f in home.rglob("*") if f.is_file()] if home.exists() else []
    assert not any(probe in f.read_bytes() for f in files)


def test_a_request_is_one_schema_valid_line_with_the_key_name_never_the_key(serving, tmp_path):
    start, home, prompts = serving
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"name": "team-a", "key": KEY}]}))
    srv, lines = start("--record-traffic", "--api-keys", str(keys))
    with srv:
        whole = ask(srv, prompts[0], KEY)
        streamed = ask(srv, prompts[1], KEY, stream=True)
    assert whole.status_code == 200 and streamed.status_code == 200
    assert f"recording traffic in {traffic.traffic_root(home)} (kept 30 days)" in lines[-1]
    rows = lines_of(home)
    assert len(rows) == 2 and [r["record"] for r in rows] == ["request", "request"]
    for r in rows:
        assert_schema(r)
    first, second = sorted(rows, key=lambda r: r["ts"])
    body = whole.json()
    assert first["request_id"] == whole.headers["x-request-id"] and first["routed_text"] == routed_text([prompts[0]])
    assert first["messages"] == [{"role": "user", "content": prompts[0]}] and first["key_name"] == "team-a"
    assert first["decision"] == {"agent": body["router"]["agent"], "policy": "head", "ood": body["router"]["ood_guard"],
                                 "format": None}
    (call,) = first["calls"]
    assert call["reply"] == body["choices"][0]["message"]["content"] and call["cost_usd"] == body["usage"]["cost"]
    assert call["model"] == body["model"] and call["latency_ms"] > 0 and not first["explore"]
    text = "".join(json.loads(ln[6:])["choices"][0]["delta"].get("content") or "" for ln in
                   streamed.text.splitlines() if ln.startswith("data: {") and json.loads(ln[6:]).get("choices"))
    assert second["calls"][0]["reply"] == text and second["calls"][0]["finish_reason"] == "stop"
    files = list(traffic.traffic_root(home).rglob("*.jsonl"))
    assert [f.name for f in files] == [f"{os.getpid()}.jsonl"]
    assert oct(files[0].stat().st_mode & 0o777) == oct(0o600)
    everything = b"".join(f.read_bytes() for f in home.rglob("*") if f.is_file())
    assert KEY.encode() not in everything  # the ledger and the log hold the key's name only


def test_a_log_that_cannot_be_written_never_fails_a_request(serving, caplog):
    start, home, prompts = serving
    home.mkdir(parents=True)
    (home / "traffic").write_text("a file where the log's folder should be")
    srv, _ = start("--record-traffic")
    with caplog.at_level(logging.WARNING, logger="resources.traffic"), srv:
        replies = [ask(srv, p) for p in prompts[:3]]
        time.sleep(0.5)  # the writer's thread has tried by now
        metrics = httpx.get(srv.url + "/metrics").text
    assert [r.status_code for r in replies] == [200] * 3
    warned = [r for r in caplog.records if "could not be written" in r.getMessage()]
    assert len(warned) == 1 and "the request was answered" in warned[0].getMessage()  # one line a minute at most
    assert 'router_lite_traffic_lines_total{outcome="failed"} 3.0' in metrics


def test_two_workers_write_two_files(static_head_dir, tmp_path):
    head_dir, prompts = static_head_dir
    home = tmp_path / "home"
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ROUTER_LITE_HOME": str(home), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--head", str(head_dir), "--profile",
                             "mmlu_pro", "--port", str(port), "--workers", "2", "--record-traffic", "--access-log",
                             "off"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 120
        while not any("2 worker processes" in ln for ln in out):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(out)
            time.sleep(0.2)
        pids = {int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
                if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()}
        sent, seen = 0, set()
        while seen != pids and sent < 120:  # each request on a new connection: either worker may take it
            codes = burst(_Base(f"http://127.0.0.1:{port}/v1"), prompts[:6])
            sent += len(codes)
            assert codes == [200] * len(codes)
            time.sleep(0.3)
            seen = {int(f.stem) for f in traffic.traffic_root(home).rglob("*.jsonl")}
    finally:
        proc.terminate()
        proc.wait(60)
    assert len(pids) == 2 and seen == pids, "".join(out)
    rows = lines_of(home)
    assert len(rows) == sent and len({r["request_id"] for r in rows}) == sent
    for r in rows:
        assert_schema(r)


class _Base:  # `ask` takes a server: this one is a bare URL
    def __init__(self, url):
        self.base_url = url


def burst(srv, prompts: list[str]) -> list[int]:
    """The statuses of `prompts` sent at once, each on a connection of its own."""
    codes: list[int] = []
    threads = [threading.Thread(target=lambda p=p: codes.append(ask(srv, p).status_code)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


def test_retention_sweep_deletes_old_days_only(tmp_path):
    home, today = tmp_path, datetime.date(2026, 12, 5)
    for back in (0, 1, 30, 31, 400):
        d = (today - datetime.timedelta(days=back)).isoformat()
        traffic.traffic_day_dir(home, d).mkdir(parents=True)
        (traffic.traffic_day_dir(home, d) / "1.jsonl").write_text("{}\n")
    (traffic.traffic_root(home) / "notes").mkdir()  # not a day: left alone
    gone = traffic.sweep(home, 30, today.isoformat())
    assert gone == ["2025-10-31", "2026-11-04"]
    assert traffic.days(home) == ["2026-11-05", "2026-12-04", "2026-12-05"]
    assert (traffic.traffic_root(home) / "notes").is_dir()
    # a writer sweeps when it starts (today: the real day, so every folder above is older than 1 day but today's)
    w = traffic.TrafficWriter(home, retention_days=1)
    w.flush()
    w.close()
    assert traffic.days(home) == [d for d in ["2026-12-04", "2026-12-05"] if
                                  (datetime.date.today() - datetime.date.fromisoformat(d)).days <= 1]


def _write(home, day: str, n: int) -> None:
    w = traffic.TrafficWriter(home)
    for i in range(n):
        w.write({"v": 1, "record": "request", "request_id": f"{i:032x}", "ts": f"{day}T00:00:00.000Z", "day": day})
    w.close()


def test_traffic_ls_and_delete(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROUTER_LITE_HOME", str(tmp_path))
    for day, n in (("2026-11-01", 2), ("2026-11-02", 3), ("2026-11-03", 1), ("2026-11-04", 4)):
        _write(tmp_path, day, n)
    assert cli.main(["traffic", "ls", "--profile", "demo", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["days"]
    assert [(d["day"], d["rows"], d["files"]) for d in listed] == [("2026-11-01", 2, 1), ("2026-11-02", 3, 1),
                                                                  ("2026-11-03", 1, 1), ("2026-11-04", 4, 1)]
    assert all(d["bytes"] > 0 and d["torn"] == 0 for d in listed)
    assert cli.main(["traffic", "delete", "--day", "2026-11-03", "--profile", "demo"]) == 0
    assert "deleted 2026-11-03: 1 requests" in capsys.readouterr().out
    assert cli.main(["traffic", "delete", "--before", "2026-11-02", "--profile", "demo"]) == 0
    assert traffic.days(tmp_path) == ["2026-11-02", "2026-11-04"]
    assert cli.main(["traffic", "delete", "--before", "11/02/2026", "--profile", "demo"]) == 2
    assert cli.main(["traffic", "delete", "--profile", "demo"]) == 2
    err = capsys.readouterr().err
    assert "'11/02/2026' is not a day: write it YYYY-MM-DD" in err and "one of --day DAY, --before DAY or --all" in err
    assert cli.main(["traffic", "delete", "--all", "--profile", "demo"]) == 0
    assert traffic.days(tmp_path) == []


def test_a_torn_line_is_taken_back_and_the_next_process_of_the_pid_starts_whole(tmp_path, monkeypatch):
    day = "2026-12-05"
    f = traffic.traffic_day_dir(tmp_path, day) / f"{os.getpid()}.jsonl"
    f.parent.mkdir(parents=True)
    f.write_bytes(b'{"v":1,"record":"request"}\n{"v":1,"rec')  # an earlier process of this pid died mid-line
    assert traffic.read_day(tmp_path, day) == ([{"v": 1, "record": "request"}], 1)
    _write(tmp_path, day, 2)
    rows, torn = traffic.read_day(tmp_path, day)
    assert torn == 0 and len(rows) == 3
    # a write that fails part way (a full disk) is truncated away: the file still ends on a whole line
    w = traffic.TrafficWriter(tmp_path)
    calls = []
    real = os.write

    def half(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            real(fd, bytes(data)[:10])
            raise OSError(28, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(traffic.os, "write", half)
    for i in range(2):
        w.write({"v": 1, "record": "request", "request_id": f"{i}", "day": day})
    w.close()
    rows, torn = traffic.read_day(tmp_path, day)
    assert torn == 0 and len(rows) == 4 and rows[-1]["request_id"] == "1" and w.failed == 1 and w.written == 1


def test_profile_and_options_validate(capsys):
    from pipeline.core.errors import RouterLiteError
    from pipeline.serve.traffic import TrafficSettings

    for bad, msg in (({"explore": 0.5, "record": True}, "--explore needs its cap"),
                     ({"explore": 0.5, "explore_usd_per_day": 1.0}, "pass --record-traffic too"),
                     ({"explore": 1.5, "record": True, "explore_usd_per_day": 1.0}, "must be a share in [0, 1]"),
                     ({"retention_days": 0}, "must be >= 1 day")):
        with pytest.raises(RouterLiteError, match=msg.replace("[", r"\[").replace("]", r"\]")):
            TrafficSettings(**bad)
    assert cli.main(["serve", "--profile", "demo", "--explore", "0.5", "--record-traffic"]) == 2  # before loading
    assert "router-lite: error: --explore needs its cap" in capsys.readouterr().err
    from pipeline.profile import ServeProfileSettings

    with pytest.raises(RouterLiteError, match="serve.explore > 0 needs its cap"):
        ServeProfileSettings(explore=0.5)
