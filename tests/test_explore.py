"""Exploration on a budget (`serve --explore SHARE --explore-usd-per-day CAP`; pipeline/serve/explore.py): an
explored request becomes a full row (every pool agent's reply to its prompt) that the client's key never pays for;
the day's cap stops exploration (never passed, across workers sharing the home's counter); the draw is seeded; a stop
finishes what is in flight and abandons what is queued, without delaying a client's reply; the forecast of a day."""
from __future__ import annotations

import datetime
import hashlib
import json
import logging
import threading
import time
import types

import httpx
import numpy as np
import openai
import pytest
import yaml
from test_serve_keys import HashBackbone, fake_agents_app

from cli import main as cli
from pipeline.collect.agents import AgentSpec
from pipeline.core.http_server import LoopbackServer
from pipeline.route import registry
from pipeline.route.head import Head
from pipeline.route.ood import OODGuard
from pipeline.serve import spend
from pipeline.serve.app import build_app
from pipeline.serve.explore import Explorer, exploration_forecast
from pipeline.serve.server import serve_in_thread
from pipeline.serve.settings import ServeSettings
from pipeline.serve.traffic import TrafficRecorder, TrafficSettings, drawn, record
from resources import traffic
from resources.ledger import SpendLedger
from resources.pool import PoolResource

KEY = "rl-test-explore-key-0123456789abcdef"


@pytest.fixture
def serving(static_head_dir, tmp_path, monkeypatch):
    """A factory: the app `router-lite serve --head ... --profile mmlu_pro [extra]` builds (in process) over the
    mmlu_pro replay pool, in home `name` (ROUTER_LITE_HOME); and the prompts recorded for every agent."""
    head_dir, prompts = static_head_dir
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def start(name: str, *extra: str):
        monkeypatch.setenv("ROUTER_LITE_HOME", str(tmp_path / name))
        args = cli.build_parser().parse_args(["serve", "--head", str(head_dir), "--profile", "mmlu_pro", "--port", "0",
                                              "--workers", "2", "--access-log", "off", "--record-traffic", *extra])
        cli._check_serve_args(args)
        app, _ = cli._serve_app(args, cli._serve_setup(args), 0)
        return serve_in_thread(app), tmp_path / name

    return start, prompts


def ask(srv, prompt: str, key: str | None = None, **body):
    return httpx.post(srv.base_url + "/chat/completions", timeout=60,
                      headers={"Authorization": f"Bearer {key}"} if key else {},
                      json={"messages": [{"role": "user", "content": prompt}], **body})


def rows_of(home) -> list[dict]:
    return [r for d in traffic.days(home) for r in traffic.read_day(home, d)[0]]


def wait_for(home, n_explorations: int, timeout_s: float = 20.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        rows = rows_of(home)
        if sum(r["record"] == "exploration" for r in rows) >= n_explorations or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def test_an_explored_request_is_a_full_row_the_key_never_pays_for(serving, tmp_path):
    start, prompts = serving
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"name": "team-a", "key": KEY, "budget_usd": 1.0}]}))
    srv, home = start("home", "--explore", "1", "--explore-usd-per-day", "1", "--api-keys", str(keys))
    with srv:
        r = ask(srv, prompts[0], KEY)
        assert r.status_code == 200, r.text
        rows = wait_for(home, 1)
        metrics = httpx.get(srv.url + "/metrics").text
    request, exploration = sorted(rows, key=lambda x: x["record"], reverse=True)
    assert request["explore"] and exploration["request_id"] == request["request_id"] == r.headers["x-request-id"]
    asked = {c["agent"] for c in request["calls"]}
    explored = [c["agent"] for c in exploration["calls"]]
    assert asked.isdisjoint(explored) and asked | set(explored) == set(request["pool"]) and len(request["pool"]) == 5
    assert exploration["complete"] is True
    store = PoolResource(kind="replay", pool="mmlu_pro").store()
    for c in exploration["calls"]:  # each un-asked agent's real (recorded) reply to the same prompt
        assert c["error"] is None and c["reply"] and store.text_for(c["model"], prompts[0]).startswith(c["reply"])
        assert c["model"] == request["agent_models"][c["agent"]] and c["cost_usd"] > 0
    usd = sum(c["cost_usd"] for c in exploration["calls"])
    assert exploration["usd"] == pytest.approx(usd)
    # the key paid its own request only; the day's exploration counter holds the rest
    paid = SpendLedger(home / "serve" / "ledger.sqlite").totals()["team-a"]
    assert paid["requests"] == 1 and paid["usd"] == pytest.approx(r.json()["usage"]["cost"], abs=1e-12)
    assert traffic.ExploreSpend.of_home(home).spent(exploration["day"]) == pytest.approx(usd)
    from prometheus_client.parser import text_string_to_metric_families

    series = {x.name: x.value for f in text_string_to_metric_families(metrics) for x in f.samples}
    assert series["router_lite_explore_usd_total"] == pytest.approx(usd)
    assert 'router_lite_explorations_total{outcome="explored"} 1.0' in metrics


def _worst(request: dict, prompt: str, max_tokens: int) -> float:
    """The reservation a job of `request` (its line) makes: Explorer.worst_case of its un-asked agents."""
    specs = {a.name: a for a in PoolResource(kind="replay", pool="mmlu_pro").agents()}
    pool = [specs[n] for n in request["pool"]]
    asked = {c["agent"] for c in request["calls"]}
    todo = [j for j, s in enumerate(pool) if s.name not in asked]
    upstream = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    return Explorer(TrafficSettings(), None, None, {}, 4096).worst_case(types.SimpleNamespace(specs=pool), todo,
                                                                        upstream)


def test_the_days_cap_stops_exploration_and_is_never_passed(serving, caplog):
    start, prompts = serving
    srv, home = start("probe", "--explore", "1", "--explore-usd-per-day", "1")
    with srv:
        assert ask(srv, prompts[2], max_tokens=50).status_code == 200
        request = next(r for r in wait_for(home, 1) if r["record"] == "request")
    cap = _worst(request, prompts[2], 50) * (1 + 1e-9)  # room for one exploration's worst case, not two
    srv, home = start("capped", "--explore", "1", "--explore-usd-per-day", repr(cap))
    with caplog.at_level(logging.WARNING, logger="pipeline.serve.explore"), srv:
        for i in range(3):
            assert ask(srv, prompts[2], max_tokens=50).status_code == 200
            wait_for(home, 1, timeout_s=5 if i == 0 else 0.5)
        metrics = httpx.get(srv.url + "/metrics").text
    rows = rows_of(home)
    assert [r["record"] for r in rows].count("exploration") == 1 and sum(r["explore"] for r in rows
                                                                         if r["record"] == "request") == 3
    day = rows[0]["day"]
    assert traffic.ExploreSpend.of_home(home).spent(day) <= cap
    warned = [r.getMessage() for r in caplog.records if "is reached" in r.getMessage()]
    assert len(warned) == 1 and f"for {day} (UTC)" in warned[0]  # one line, however many requests follow
    assert 'router_lite_explorations_total{outcome="capped"} 2.0' in metrics


def test_workers_sharing_the_counter_never_pass_the_cap(tmp_path):
    path = tmp_path / "explore_spend.sqlite"
    got: list[bool] = []

    def worker():
        counter = traffic.ExploreSpend(path)  # a connection of its own, as each worker process has
        for _ in range(10):
            got.append(counter.reserve("2026-12-05", 0.1, 1.0))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counter = traffic.ExploreSpend(path)
    assert got.count(True) == 10 and counter.spent("2026-12-05") == pytest.approx(1.0)
    counter.settle("2026-12-05", 0.1, 0.02)  # what was paid replaces the worst case
    assert counter.spent("2026-12-05") == pytest.approx(0.92) and counter.spent("2026-12-06") == 0.0


def test_the_draw_is_seeded_and_takes_its_share():
    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(2000)]
    a = [h for h in hashes if drawn(h, 0.3, seed=0)]
    assert a == [h for h in hashes if drawn(h, 0.3, seed=0)] and abs(len(a) - 600) < 90
    assert a != [h for h in hashes if drawn(h, 0.3, seed=1)]
    assert not any(drawn(h, 0.0, 0) for h in hashes) and all(drawn(h, 1.0, 0) for h in hashes)


@pytest.fixture
def slow_pool(tmp_path):
    """(a head over 3 fake agents answering after 0.3 s, their specs, client_for)."""
    bb = HashBackbone()
    names = ["a0", "a1", "a2"]
    X = bb.encode([f"prompt {i}" for i in range(30)])
    head = Head(np.random.default_rng(0).normal(size=(bb.dim, 3)).astype(np.float32), np.zeros(3, np.float32),
                agents=names)
    reg = registry.load(registry.register(
        tmp_path / "reg", head, registry.PromptFit(OODGuard(k=3).fit(X, X), 0),
        backbone={"id": bb.model_id, "key": bb.key, "pooling": "mean", "max_seq_length": 128, "dim": bb.dim},
        agents=[{"name": n, "model": f"m{i}"} for i, n in enumerate(names)], training={}, data_hashes={},
        metrics={}))
    reg.guard.threshold = float("inf")
    with LoopbackServer(fake_agents_app(0.3), name="fake-agents") as up:
        specs = [AgentSpec(n, f"m{i}", "openai_compatible", up.base_url, 1.0, 1.0) for i, n in enumerate(names)]
        yield reg, specs, lambda agent: openai.AsyncOpenAI(api_key="x", base_url=up.base_url, max_retries=0,
                                                           timeout=30)


def _recorder(home, **kw):
    settings = TrafficSettings(record=True, explore=1.0, explore_usd_per_day=10.0, explore_concurrency=1, **kw)
    writer = traffic.TrafficWriter(home)
    explorer = Explorer(settings, writer, traffic.ExploreSpend.of_home(home), {"timeout": 30.0, "max_retries": 0},
                        100)
    return TrafficRecorder(settings, writer, explorer)


@pytest.mark.parametrize("grace_s", [5.0, 0.05])
def test_a_stop_finishes_or_cancels_what_is_in_flight_and_abandons_the_queue(slow_pool, tmp_path, caplog, grace_s):
    reg, specs, client_for = slow_pool
    rec = _recorder(tmp_path, explore_drain_s=grace_s)
    app = record(build_app(reg, HashBackbone(), specs, client_for, ServeSettings()), rec)
    with caplog.at_level(logging.WARNING, logger="pipeline.serve.explore"), serve_in_thread(app) as srv:
        out: list[float] = []

        def one(i):
            t0 = time.perf_counter()
            assert ask(srv, f"question {i}", max_tokens=10).status_code == 200
            out.append(time.perf_counter() - t0)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(0.1)  # the first exploration has started (one slot), the others wait in the queue
    # the replies did not wait for the explorations (each asks two agents of 0.3 s, one call at a time)
    assert len(out) == 3 and max(out) < 0.3 + 0.5
    counts = rec.explorer.counts
    finished = grace_s > 1
    assert counts["abandoned"] == 2 and counts["explored"] == int(finished) and counts["cancelled"] == 1 - finished
    (line,) = [r.getMessage() for r in caplog.records if "exploration: stopping" in r.getMessage()]
    assert f"{int(finished)} in flight finished, 2 queued abandoned, {1 - int(finished)} cancelled" in line
    rows = rows_of(tmp_path)
    assert [r["record"] for r in rows].count("request") == 3
    assert [r["record"] for r in rows].count("exploration") == int(finished)


def test_the_forecast_of_a_day_of_exploration(tmp_path, monkeypatch, capsys):
    specs = {a.name: a for a in PoolResource(kind="replay", pool="mmlu_pro").agents()}
    pool = list(specs)
    now = time.time()
    ts = datetime.datetime.fromtimestamp(now - 6 * 3600, datetime.UTC)
    msgs = [{"role": "user", "content": "x" * 400}]  # 100 prompt tokens (chars / 4)
    line = {"v": 1, "record": "request", "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.000Z"), "day": ts.strftime("%Y-%m-%d"),
            "pool": pool, "messages": msgs, "calls": [{"agent": pool[0], "reply": "y" * 200}]}  # 50 completion tokens
    rows = [dict(line, request_id=f"{i:032x}") for i in range(8)]
    fc = exploration_forecast(rows, specs, 0.25, 0.01, now)
    prompt = -(-len(json.dumps(msgs)) // 4)
    each = sum(specs[a].cost(prompt, 50) for a in pool[1:])
    assert fc["requests_per_day"] == pytest.approx(8 * 4, rel=1e-3)  # 8 in 6 h: 32 a day
    assert fc["mean_unasked_usd"] == pytest.approx(each) and fc["usd_per_day"] == pytest.approx(32 * 0.25 * each,
                                                                                               rel=1e-3)
    assert fc["capped"] == (32 * 0.25 * each > 0.01) and fc["cap_usd_per_day"] == 0.01
    monkeypatch.setenv("ROUTER_LITE_HOME", str(tmp_path))
    writer = traffic.TrafficWriter(tmp_path)
    for r in rows:
        writer.write(r)
    writer.close()
    assert cli.main(["forecast", "--profile", "mmlu_pro", "--exploration", "--explore", "0.25",
                     "--explore-usd-per-day", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "exploration: 32 requests a day (extrapolated from 6.0 h) x share 0.25" in out
    assert f"= ${32 * 0.25 * each:.4f} a day; cap $0.01 a day" in out


def test_spend_worst_case_is_the_keys_rule():
    """The exploration reserves as a key's budget does (pipeline/serve/spend.py): list prices x bounds."""
    spec = AgentSpec("a", "m", "openai_compatible", None, 2.0, 8.0)
    up = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
    prompt, completion = spend.request_tokens(up, 4096)
    got = Explorer(TrafficSettings(), None, None, {}, 4096).worst_case(types.SimpleNamespace(specs=[spec, spec]),
                                                                       [0, 1], up)
    assert completion == 100 and got == pytest.approx(2 * (2.0 * prompt + 8.0 * 100) / 1e6)
