"""Client keys, budgets, rates and allowed targets of `router-lite serve` (pipeline/serve/auth.py, keys.py, spend.py;
the ledger resources/ledger.py), on the real app in process: a tiny registered head and cascade over a fake backbone
(an embedding from the prompt's hash) and fake agents on loopback that bill a fixed `usage.cost` per reply."""
from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import logging
import os
import re
import threading
import time

import httpx
import numpy as np
import openai
import pytest

from pipeline.collect.agents import AgentSpec
from pipeline.core.errors import RouterLiteError
from pipeline.core.http_server import LoopbackServer
from pipeline.route import registry
from pipeline.route.cascade import CascadeRouter, Plan, Policy, Stage
from pipeline.route.fit import constant_head
from pipeline.route.head import Head
from pipeline.route.ood import OODGuard
from pipeline.serve import spend
from pipeline.serve.app import build_app
from pipeline.serve.auth import guard_clients
from pipeline.serve.keys import ClientKey, load_keys
from pipeline.serve.server import serve_in_thread
from pipeline.serve.settings import ServeSettings
from resources.ledger import SpendLedger

KEY_A, KEY_B = "rl-test-key-team-a-0123456789", "rl-test-key-team-b-9876543210"
COST = {"m0": 0.05, "m1": 0.01, "m2": 0.02}  # what each fake agent bills per reply (usage.cost)
PRICE_IN, PRICE_OUT = 100.0, 1000.0  # USD per million tokens: a worst case of ~0.1 USD per call at max_tokens 100
PG_URL = os.environ.get("ROUTER_LITE_PG_URL", "")
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


class HashBackbone:
    """An 8-dim embedding from the prompt's SHA-256 (the router's pick does not matter here)."""

    dim, model_id, key, device = 8, "hash-8", "hash-8", "cpu"

    def encode(self, texts):
        rows = [np.frombuffer(hashlib.sha256(t.encode("utf-8", "surrogatepass")).digest()[:8], np.uint8)
                for t in texts]
        return np.asarray(rows, np.float32) / 255.0 + 0.01


def fake_agents_app(delay_s: float):
    """Agents answering "The answer is 42." after `delay_s`, billing COST[model]; a stream ends with a usage chunk."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def chat(request):
        body = await request.json()
        await asyncio.sleep(delay_s)
        model, msg = body["model"], {"role": "assistant", "content": "The answer is 42."}
        usage = {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25, "cost": COST[model]}
        if body.get("stream"):
            head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": model,
                    "choices": [{"index": 0, "delta": msg, "finish_reason": None}]}
            tail = {**head, "choices": [], "usage": usage}
            return Response(f"data: {json.dumps(head)}\r\n\r\ndata: {json.dumps(tail)}\r\n\r\ndata: [DONE]\r\n\r\n",
                            media_type="text/event-stream")
        return JSONResponse({"id": "c", "object": "chat.completion", "created": 0, "model": model, "usage": usage,
                             "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.fixture(scope="module")
def world(tmp_path_factory, cascade_point):
    """(prompt head, cascade, agent specs, client_for) over fake agents that answer after 0.3 s."""
    bb = HashBackbone()
    names = ["a0", "a1", "a2"]
    X = bb.encode([f"prompt {i}" for i in range(30)])
    fields = {"backbone": {"id": bb.model_id, "key": bb.key, "pooling": "mean", "max_seq_length": 128, "dim": bb.dim},
              "agents": [{"name": n, "model": f"m{i}"} for i, n in enumerate(names)], "training": {},
              "data_hashes": {}, "metrics": {}}
    root = tmp_path_factory.mktemp("registry")
    head = Head(np.random.default_rng(0).normal(size=(bb.dim, 3)).astype(np.float32), np.zeros(3, np.float32),
                agents=names)
    reg = registry.load(registry.register(root, head, registry.PromptFit(OODGuard(k=3).fit(X, X), 0), **fields))
    path = {"kind": "cascade", "agents": names, "best_single": "a0", "guard_z": 0.0,
            "best_single_validation": {"quality": 0.8, "ci_low": 0.8, "ci_high": 0.8, "cost_per_1k": 50.0},
            "n_validation": 100,
            "points": [cascade_point(Plan(Policy((Stage((0,)),))), names, 0.8, 50.0),
                       cascade_point(Plan(Policy((Stage((1, 2), 2), Stage((0,))))), names, 0.7, 30.0)]}
    cascade = registry.load(registry.register(root, CascadeRouter(constant_head(head, 0), path, [0, 1, 2], names),
                                              registry.PromptFit(OODGuard(k=3).fit(X, X), 0), **fields))
    for r in (reg, cascade):
        r.guard.threshold = float("inf")  # no prompt is out of distribution here
    with LoopbackServer(fake_agents_app(0.3), name="fake-agents") as up:
        specs = [AgentSpec(n, f"m{i}", "openai_compatible", up.base_url, PRICE_IN, PRICE_OUT)
                 for i, n in enumerate(names)]

        def client_for(agent):
            return openai.AsyncOpenAI(api_key="upstream", base_url=up.base_url, max_retries=0, timeout=30)

        yield reg, cascade, specs, client_for


def keys_file(tmp_path, **team_a) -> str:
    entry = {"name": "team-a", "sha256": hashlib.sha256(KEY_A.encode()).hexdigest(), **team_a}
    f = tmp_path / f"keys-{len(list(tmp_path.glob('keys-*')))}.yaml"
    import yaml

    f.write_text(yaml.safe_dump({"keys": [entry, {"name": "team-b", "key": KEY_B}]}))
    return str(f)


def serve(world, ledger_url=None, keys=None, allowed=(), cascade=False, **settings):
    reg, casc, specs, client_for = world
    app = build_app(casc if cascade else reg, HashBackbone(), specs, client_for, ServeSettings(**settings))
    keyring = load_keys(keys, allowed) if keys else None
    return serve_in_thread(guard_clients(app, keyring, SpendLedger(ledger_url) if keyring else None, allowed))


def ask(srv, key=None, prompt="What is 6 x 7?", headers=None, **body):
    h = {**({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    return httpx.post(srv.base_url + "/chat/completions", headers=h, timeout=60,
                      json={"messages": [{"role": "user", "content": prompt}], "max_tokens": 100, **body})


def streamed_cost(r) -> float:
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    return sum(e["usage"]["cost"] for e in events if e.get("usage"))


def test_no_key_or_a_wrong_one_is_401_and_healthz_stays_open(world, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="router_lite.access"), \
            serve(world, tmp_path / "ledger.sqlite", keys_file(tmp_path)) as srv:
        refused = [ask(srv), ask(srv, "rl-test-key-team-a-0123456788"), ask(srv, headers={"Authorization": KEY_A}),
                   httpx.get(srv.base_url + "/models"), httpx.get(srv.base_url + "/models/x",
                                                                  headers={"Authorization": "Bearer nope"})]
        health = httpx.get(srv.url + "/healthz")
        ok_a, ok_b = ask(srv, KEY_A), ask(srv, KEY_B)
        models = httpx.get(srv.base_url + "/models", headers={"Authorization": f"Bearer {KEY_B}"})
        metrics = httpx.get(srv.url + "/metrics").text
    for r in refused:
        assert r.status_code == 401, r.text
        assert r.json() == {"error": {"message": r.json()["error"]["message"], "type": "invalid_request_error",
                                      "param": None, "code": "invalid_api_key"}}
        assert r.headers["www-authenticate"] == "Bearer"
    assert health.status_code == 200 and ok_a.status_code == 200 and ok_b.status_code == 200
    assert models.status_code == 200 and models.json()["data"][0]["id"] == world[0].name
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "router_lite.access"]
    assert [x["key"] for x in lines if x["status"] == 200] == ["team-a", "team-b"]
    assert sum(x["status"] == 401 and x["key"] is None for x in lines) == len(refused)
    assert all(datetime.datetime.fromisoformat(x["ts"]).utcoffset() == datetime.timedelta(0) for x in lines)
    text = caplog.text + json.dumps(lines)
    assert KEY_A not in text and KEY_B not in text and "0123456788" not in text
    # /metrics counts the refused requests too, by status and key name (none for a refused one)
    from prometheus_client.parser import text_string_to_metric_families

    counted = {(x.labels["status"], x.labels["key"]): x.value for f in text_string_to_metric_families(metrics)
               if f.name == "router_lite_requests" for x in f.samples if x.name.endswith("_total")}
    assert counted == {("401", ""): len(refused), ("200", "team-a"): 1, ("200", "team-b"): 1}


def test_recorded_spend_is_the_replies_usage_cost_and_survives_a_restart(world, tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    keys = keys_file(tmp_path, budget_usd=1.0, budget_window="12h")
    with serve(world, ledger, keys) as srv, serve(world, ledger, keys, cascade=True) as casc:
        replies = [ask(srv, KEY_A), ask(srv, KEY_A, prompt="another"), ask(casc, KEY_A, router_grader="integer",
                                                                             router_target="quality>=0.5"),
                   ask(casc, KEY_A, router_grader="integer", router_target="quality>=0.5", stream=True),
                   ask(srv, KEY_A, prompt="a streamed one", stream=True), ask(srv, KEY_A, model="no-such-router")]
    assert [r.status_code for r in replies] == [200] * 5 + [404]
    paid = [r.json()["usage"]["cost"] for r in replies[:3]] + [streamed_cost(r) for r in replies[3:5]]
    assert replies[2].json()["usage"]["calls"] == 2 and paid[3] == pytest.approx(COST["m1"] + COST["m2"])
    assert paid[4] in COST.values()  # the agent's own usage, relayed in its stream
    recorded = SpendLedger(ledger).totals()
    assert recorded["team-a"]["requests"] == 5 and abs(recorded["team-a"]["usd"] - sum(paid)) < 1e-9
    # a restart: a new app on the same ledger file knows what was spent; with a budget of that + 0.05 USD (a
    # request's worst case is ~0.1) it refuses, while on a fresh ledger the same budget admits the request
    tighter = keys_file(tmp_path, budget_usd=recorded["team-a"]["usd"] + 0.05, budget_window="12h")
    with serve(world, ledger, tighter) as again, serve(world, tmp_path / "fresh.sqlite", tighter) as fresh:
        r, first = ask(again, KEY_A), ask(fresh, KEY_A)
    assert r.status_code == 429 and r.json()["error"]["code"] == "budget_exceeded", r.text
    assert f"${recorded['team-a']['usd']:.6f} spent in the window" in r.json()["error"]["message"]
    assert 1 <= int(r.headers["retry-after"]) <= 12 * 3600 * 121 / 120 and first.status_code == 200  # a bucket: 1/120


def _budget_run(world, tmp_path, urls: list, n: int = 24) -> tuple[list, dict]:
    """`n` concurrent requests of team-a (budget 0.3 USD) spread over one server per ledger URL."""
    keys = keys_file(tmp_path, budget_usd=0.3, budget_window="1d")
    servers = [serve(world, url, keys) for url in urls]
    try:
        out = [None] * n

        def one(i):
            out[i] = ask(servers[i % len(servers)], KEY_A, prompt=f"question {i}")

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for s in servers:
            s.stop()
    return out, SpendLedger(urls[0]).totals().get("team-a", {"usd": 0.0, "requests": 0})


def _check_budget_run(replies, recorded) -> None:
    ok = [r for r in replies if r.status_code == 200]
    over = [r for r in replies if r.status_code == 429]
    assert len(ok) + len(over) == len(replies) and ok and over, [r.status_code for r in replies]
    for r in over:
        err = r.json()["error"]
        assert err["code"] == "budget_exceeded" and err["type"] == "insufficient_quota" and err["param"] is None
        assert "over its budget of $0.300000 per 1d" in err["message"] and int(r.headers["retry-after"]) >= 1
    paid = sum(r.json()["usage"]["cost"] for r in ok)
    # every 200's worst case was reserved before its call: the spend never passes the budget (the calls in flight
    # at once were at most budget / worst case)
    assert abs(recorded["usd"] - paid) < 1e-9 and recorded["requests"] == len(ok) and paid <= 0.3 + 1e-9


def test_a_key_past_its_budget_gets_429_and_concurrent_requests_never_overshoot(world, tmp_path):
    replies, recorded = _budget_run(world, tmp_path, [tmp_path / "ledger.sqlite"])
    _check_budget_run(replies, recorded)


def test_two_ledgers_sharing_one_sqlite_file_share_the_budget(world, tmp_path):
    f = tmp_path / "shared.sqlite"
    replies, recorded = _budget_run(world, tmp_path, [f, f"sqlite:///{f}"])
    _check_budget_run(replies, recorded)


@pytest.fixture
def pg_ledger_url():
    """A fresh PostgreSQL database for the ledger (dropped afterwards), from ROUTER_LITE_PG_URL (.ci/postgres.sh)."""
    assert PG_URL, "CI=true but ROUTER_LITE_PG_URL is not set: .ci/postgres.sh could not start PostgreSQL"
    import uuid

    import psycopg2

    base = PG_URL.replace("+psycopg2", "")
    name = f"router_lite_ledger_{uuid.uuid4().hex[:10]}"
    admin = psycopg2.connect(base, connect_timeout=10)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    yield base.rsplit("/", 1)[0] + "/" + name
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


@pytest.mark.postgres
@pytest.mark.skipif(not PG_URL and not IN_CI, reason="no PostgreSQL: set ROUTER_LITE_PG_URL (source .ci/postgres.sh)")
def test_two_ledgers_sharing_one_postgres_database_share_the_budget(world, tmp_path, pg_ledger_url):
    replies, recorded = _budget_run(world, tmp_path, [pg_ledger_url, pg_ledger_url])
    _check_budget_run(replies, recorded)


def test_over_rpm_is_429_with_retry_after(world, tmp_path):
    with serve(world, tmp_path / "ledger.sqlite", keys_file(tmp_path, rpm=3)) as srv:
        codes = [ask(srv, KEY_A, prompt=f"q{i}").status_code for i in range(3)]
        r = ask(srv, KEY_A, prompt="one too many")
        other = ask(srv, KEY_B)  # another key's rate is its own
    assert codes == [200] * 3 and other.status_code == 200
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
    assert "3 requests per minute" in r.json()["error"]["message"] and 1 <= int(r.headers["retry-after"]) <= 60


def test_a_ledger_that_fails_refuses_keyed_requests_rather_than_let_them_spend(world, tmp_path, caplog):
    reg, _, specs, client_for = world
    ledger = SpendLedger(tmp_path / "ledger.sqlite")
    app = guard_clients(build_app(reg, HashBackbone(), specs, client_for, ServeSettings()),
                        load_keys(keys_file(tmp_path, budget_usd=1.0)), ledger)
    with serve_in_thread(app) as srv:
        ledger._conn.close(), ledger._now.close()  # the database goes away under the server
        r = ask(srv, KEY_A)
    assert r.status_code == 503 and r.json()["error"]["code"] == "ledger_unavailable" and r.headers["retry-after"]
    assert "spend ledger failed for key team-a" in caplog.text and KEY_A not in caplog.text


def test_a_key_limited_to_some_targets_gets_403_for_others(world, tmp_path):
    keys = keys_file(tmp_path, targets=["quality>=0.95"])
    with serve(world, tmp_path / "ledger.sqlite", keys, cascade=True, default_target="max-quality") as srv:
        by_header = ask(srv, KEY_A, headers={"X-Router-Target": "max-quality"}, router_grader="integer")
        by_field = ask(srv, KEY_A, router_target="max-quality", router_grader="integer")
        allowed = ask(srv, KEY_A, router_target="quality>=0.950", router_grader="integer")
        unnamed = ask(srv, KEY_A, router_grader="integer")  # runs at the key's first target
        other_key = ask(srv, KEY_B, router_target="max-quality", router_grader="integer")
    for r in (by_header, by_field):
        assert r.status_code == 403, r.text
        err = r.json()["error"]
        assert err["code"] == "target_not_allowed" and err["param"] == "router_target"
        assert "max-quality is not allowed for key 'team-a'; allowed: quality>=0.95" in err["message"]
    assert allowed.status_code == 200 and unnamed.status_code == 200 and other_key.status_code == 200
    assert unnamed.headers["x-router-target"] == "quality>=0.95"


def test_allowed_targets_restrict_every_client(world):
    with serve(world, allowed=("quality>=0.95", "max-quality"), cascade=True) as srv:
        refused = [ask(srv, router_target=t, router_grader="integer") for t in ("parity", "lambda=1e308")]
        ok = ask(srv, router_target="quality>=0.95", router_grader="integer")
        plain = ask(srv, router_grader="integer")
    assert [r.status_code for r in refused] == [403, 403]
    assert "lambda=1e+308 is not allowed for this server; allowed: quality>=0.95, max-quality" in \
        refused[1].json()["error"]["message"]
    assert ok.status_code == 200 and plain.status_code == 200 and plain.headers["x-router-target"] == "max-quality"
    reg, _, specs, client_for = world
    app = build_app(reg, HashBackbone(), specs, client_for, ServeSettings())
    with pytest.raises(RouterLiteError, match="default target max-quality is not among --allowed-targets"):
        guard_clients(app, allowed_targets=("parity",))
    app.state.served.endpoint.batcher.close()


def test_retry_after_is_when_enough_old_spend_leaves_the_rolling_window():
    key = ClientKey("k", b"", budget_usd=1.0, window_s=3600)
    usage = spend.KeyUsage(spend=((1000, 0.5), (2000, 0.3), (3000, 0.1)), reserved=0.05)
    assert spend.admission(key, usage, 0.05, now=3500) is None  # 0.9 + 0.05 + 0.05 fits
    r = spend.admission(key, usage, 0.2, now=3500)  # 0.15 over: the first bucket (0.5) must leave, at 1000 + 3600
    assert r.code == "budget_exceeded" and r.retry_after_s == 1100
    # never fits, more than the whole budget: refused before the ledger is asked, without a time to retry
    assert "no retry can fit it" in spend.over_whole_budget(key, [(0.0, 1e6)], 0, 2)  # $2 of completion tokens
    rate = ClientKey("k", b"", rpm=2)
    assert spend.admission(rate, spend.KeyUsage(hits=((100, 1), (130, 1))), 0.0, now=140).retry_after_s == 20


@pytest.mark.parametrize("text, where", [
    ("keys: [{sha256: " + "a" * 64 + "}]", "keys[0].name: required"),
    ("keys: [{name: a}]", "keys[0]: give exactly one of sha256"),
    ("keys: [{name: a, sha256: abc}]", "keys[0].sha256: must be 64 hex digits"),
    ("keys: [{name: a, key: short}]", "keys[0].key: must be at least 16 characters"),
    ("keys: [{name: a, key: 123456789012345678901}]", "keys[0].key: must be a string"),
    ("keys: [{name: a, key: " + KEY_A + ", budget_usd: -1}]", "keys[0].budget_usd: must be >= 0"),
    ("keys: [{name: a, key: " + KEY_A + ", budget_usd: lots}]", "keys[0].budget_usd: expected a number"),
    ("keys: [{name: a, key: " + KEY_A + ", budget_window: 1w}]", "keys[0].budget_window: '1w' is not a window"),
    ("keys: [{name: a, key: " + KEY_A + ", rpm: 0}]", "keys[0].rpm: must be >= 1"),
    ("keys: [{name: a, key: " + KEY_A + ", targets: [fastest]}]", "keys[0].targets[0]: unknown target 'fastest'"),
    ("keys: [{name: a, key: " + KEY_A + ", colour: red}]", "keys[0].colour: unknown key"),
    ("keys: [{name: a, key: " + KEY_A + "}, {name: a, key: " + KEY_B + "}]", "keys[1].name: 'a' is also keys[0]'s"),
    ("keys: [{name: a, key: " + KEY_A + "}, {name: b, key: " + KEY_A + "}]", "keys[1]: the same key as keys[0]"),
    ("keys: []", "keys: no key listed"),
    ("- a list", "expected a mapping"),
    ("keys: [&a [*a]]", "alias refers to the value that contains it"),
    ("keys: [{name: a", "not valid YAML (expected ',' or '}', but got '<stream end>' at line 1, column 16)"),
    ("keys: [{name: a, key: " + KEY_A + " ]", "not valid YAML"),
])
def test_keys_file_errors_are_one_line_naming_file_and_field(tmp_path, text, where):
    f = tmp_path / "keys.yaml"
    f.write_text(text)
    with pytest.raises(RouterLiteError) as exc:
        load_keys(f)
    msg = str(exc.value)
    assert msg.startswith(f"{f}: ") and where in msg and "\n" not in msg, msg
    assert "12345678901" not in msg and KEY_A not in msg  # a key is never echoed


def test_a_key_outside_the_servers_allowed_targets_is_refused_at_load(tmp_path):
    f = keys_file(tmp_path, targets=["max-quality"])
    with pytest.raises(RouterLiteError, match=r"keys\[0\].targets\[0\]: max-quality is not among the server's"):
        load_keys(f, ("parity",))
    ring = load_keys(keys_file(tmp_path, targets=["parity", "quality>=0.950"]))
    assert ring.find(KEY_A).targets == ("parity", "quality>=0.95") and ring.find(KEY_B).name == "team-b"
    assert ring.find("nope") is None and ring.find(None) is None and KEY_B not in repr(ring.keys)
    from resources.ledger import shown

    assert shown("postgresql+psycopg2://router:s3cr3t@db:5432/ledger") == "postgresql+psycopg2://router:***@db:5432/ledger"


@pytest.mark.parametrize("argv, says", [
    (["--host", "0.0.0.0"], "--host 0.0.0.0 is reachable beyond this machine and no client keys are set"),
    (["--host", "192.168.1.7", "--ledger", "x.sqlite"], "no client keys are set"),
    (["--ledger", "x.sqlite"], "--ledger keeps the spend of client keys: pass --api-keys FILE too"),
    (["--allowed-targets", "parity,,max-quality"], "--allowed-targets: an empty target"),
])
def test_serve_refuses_to_start_with_one_line(argv, says, capsys, monkeypatch):
    from cli.main import main

    monkeypatch.delenv("ROUTER_LITE_API_KEYS", raising=False)
    assert main(["serve", "--head", "nowhere", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(r"router-lite: error: [^\n]+", err) and says in err, err


def test_serve_with_a_bad_keys_file_named_by_the_environment_is_one_line(tmp_path, capsys, monkeypatch):
    from cli.main import main

    f = tmp_path / "keys.yaml"
    f.write_text("keys: [{name: a, sha256: zz}]")
    monkeypatch.setenv("ROUTER_LITE_API_KEYS", str(f))
    assert main(["serve", "--head", "nowhere", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"router-lite: error: {f}: keys[0].sha256: must be 64 hex digits (printf %s \"$KEY\" | sha256sum)"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_budget_holds_across_two_worker_processes(tmp_path, static_head_dir):
    """`serve --workers 2 --api-keys FILE` (replay pool, the static-backbone head of test_serve_workers.py): 40
    requests from 16 clients on new connections (the kernel spreads them over both workers) against a budget of 1.5
    worst cases: 200s then 429s, nothing else; the default ledger in the home holds exactly the replies' usage.cost,
    within the budget."""
    import subprocess
    import sys
    import time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    ROOT = Path(__file__).resolve().parents[1]
    from pipeline.serve.spend import price_bounds, request_tokens, worst_case_usd
    from resources.pool import PoolResource

    head_dir, prompts = static_head_dir
    reg = registry.load(head_dir)
    agents = {a.name: a for a in PoolResource(kind="replay", pool="mmlu_pro").agents()}
    bounds = price_bounds(reg, [agents[a["name"]] for a in reg.agents], None)
    worst = max(worst_case_usd(bounds, *request_tokens({"messages": [{"role": "user", "content": p}]}, 4096))
                for p in prompts)
    keys = keys_file(tmp_path, budget_usd=round(1.5 * worst, 6), budget_window="1h")
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ROUTER_LITE_HOME": str(tmp_path / "home")}
    env.pop("ROUTER_LITE_API_KEYS", None)
    env.pop("ROUTER_LITE_LEDGER_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--head", str(head_dir), "--profile",
                             "mmlu_pro", "--port", str(port), "--workers", "2", "--api-keys", keys], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        deadline = time.monotonic() + 240
        # one startup line, printed once both workers are ready (before: one per worker, and the keys line too)
        while not any("router-lite serve: head " in ln and "2 worker processes" in ln for ln in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.3)
        assert httpx.post(url, json={"messages": [{"role": "user", "content": prompts[0]}]}).status_code == 401

        def one(i):
            return httpx.post(url, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=60,
                              json={"messages": [{"role": "user", "content": prompts[i % len(prompts)]}]})

        with ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(one, range(40)))
    finally:
        proc.terminate()
        proc.wait(30)
    ok = [r for r in replies if r.status_code == 200]
    assert ok and len(ok) < 40 and all(r.status_code == 429 and r.headers["retry-after"] for r in replies
                                       if r.status_code != 200), [r.text[:200] for r in replies][:3]
    ledger = tmp_path / "home" / "serve" / "ledger.sqlite"
    recorded = SpendLedger(ledger).totals()["team-a"]
    paid = sum(r.json()["usage"]["cost"] for r in ok)
    assert recorded["requests"] == len(ok) and abs(recorded["usd"] - paid) < 1e-9 and paid <= 1.5 * worst + 1e-6
    out = "".join(lines)
    assert out.count("2 client keys from") == 1 and KEY_A not in out and KEY_B not in out  # once, not per worker


def test_the_reply_shape_is_the_same_for_every_router_kind(world):
    """A client reads one shape whatever router answered: `usage.calls`, `usage.cost`, `router.agents_called` and
    `router.cost_usd` (= `usage.cost` = `X-Router-Cost-Usd`), for a prompt-only head as for a cascade (before, a
    head's reply had neither `usage.calls` nor `router.agents_called` / `router.cost_usd`)."""
    with serve(world) as srv, serve(world, cascade=True) as casc:
        head = ask(srv)
        cascade = ask(casc, router_grader="integer", router_target="quality>=0.5")
    for r in (head, cascade):
        assert r.status_code == 200, r.text
        body = r.json()
        usage, router = body["usage"], body["router"]
        assert {"calls", "cost", "prompt_tokens", "completion_tokens"} <= set(usage)
        assert {"agents_called", "cost_usd", "agent", "head"} <= set(router)
        assert usage["calls"] == len(router["agents_called"]) >= 1 and router["agent"] in router["agents_called"]
        assert usage["cost"] == router["cost_usd"] == pytest.approx(float(r.headers["x-router-cost-usd"]))
    assert head.json()["usage"]["calls"] == 1


def test_an_admission_on_the_event_loop_never_waits_for_the_ledger_lock(tmp_path):
    """`admit_now` (the middleware's first try, on the event loop) takes the SQLite write lock without waiting: it
    admits when the file is free and gives way (None, nothing written) while another connection holds it, so the
    middleware falls back to its thread; PostgreSQL always goes through the thread."""
    url = tmp_path / "ledger.sqlite"
    ledger, other = SpendLedger(url), SpendLedger(url)
    now = time.time()
    args = ("team-a", 0.25, now, now + 60, (now - 86400, now - 60), lambda spend, reserved, hits: None)
    rid, refusal = ledger.admit_now(*args)
    assert rid and refusal is None
    other._conn.execute("BEGIN IMMEDIATE")
    t0 = time.monotonic()
    assert ledger.admit_now(*args) is None and time.monotonic() - t0 < 1.0
    other._conn.execute("COMMIT")
    seen = []
    ledger.admit(*args[:5], lambda spend, held, hits: seen.append(sum(u for _, u in held)))  # the thread's path
    assert seen == [pytest.approx(0.25)]  # the first reservation only: the refused try wrote nothing
    ledger.close(), other.close()


def _guarded(world, tmp_path, keys, cascade=False):
    """(the app, behind the client-key middleware with a SQLite ledger, its ledger path) (the app: to reach its
    state)."""
    reg, casc, specs, client_for = world
    app = build_app(casc if cascade else reg, HashBackbone(), specs, client_for, ServeSettings())
    ledger = tmp_path / f"ledger-{len(list(tmp_path.glob('ledger-*')))}.sqlite"
    return guard_clients(app, load_keys(keys), SpendLedger(ledger)), ledger


def test_a_request_naming_a_retired_router_is_priced_and_charged_like_any(world, tmp_path):
    """After a swap, clients that pinned the old router's name keep working: their requests are admitted against the
    key's budget and charged like any (before, the middleware's own parse refused the old name and let the request
    through unmetered)."""
    app, ledger = _guarded(world, tmp_path, keys_file(tmp_path, budget_usd=0.02))  # below one worst case (~0.1)
    app.state.endpoint.retired.add("head-served-before")
    with serve_in_thread(app) as srv:
        plain, pinned = ask(srv, KEY_A), ask(srv, KEY_A, model="head-served-before")
        app2, ledger2 = _guarded(world, tmp_path, keys_file(tmp_path, budget_usd=5.0))
        app2.state.endpoint.retired.add("head-served-before")
        with serve_in_thread(app2) as srv2:
            paid = ask(srv2, KEY_A, model="head-served-before")
    assert plain.status_code == 402 and pinned.status_code == 402, pinned.text
    assert pinned.json()["error"]["code"] == "request_over_budget"
    recorded = SpendLedger(ledger2).totals()["team-a"]
    assert paid.status_code == 200 and recorded["requests"] == 1
    assert abs(recorded["usd"] - paid.json()["usage"]["cost"]) < 1e-12


def test_a_keyed_request_is_parsed_once_and_a_cascade_reply_priced_once(world, tmp_path, monkeypatch, caplog):
    """The middleware's parse is the app's (one `ChatRequest` on request.state); a cascade prices each call once
    (its summed usage reuses the tokens each call was priced for); the access line and the ledger agree with it."""
    from pipeline.collect import client as client_mod
    from pipeline.serve import app as app_mod
    from pipeline.serve import cascade_calls, requests

    parsed, priced = [], []
    real_load, real_price = requests.load_json_body, client_mod.reply_usage
    monkeypatch.setattr(requests, "load_json_body", lambda *a: parsed.append(1) or real_load(*a))
    for mod in (app_mod, cascade_calls):
        monkeypatch.setattr(mod, "reply_usage", lambda *a: priced.append(1) or real_price(*a))
    app, ledger = _guarded(world, tmp_path, keys_file(tmp_path, budget_usd=5.0), cascade=True)
    with caplog.at_level(logging.INFO, logger="router_lite.access"), serve_in_thread(app) as srv:
        r = ask(srv, KEY_A, router_grader="integer", router_target="quality>=0.5")
    assert r.status_code == 200 and r.json()["usage"]["calls"] == 2, r.text
    assert len(parsed) == 1 and len(priced) == 2  # before: parsed twice, each call priced twice
    assert r.json()["usage"]["prompt_tokens"] == 40 and r.json()["usage"]["completion_tokens"] == 10
    line = next(json.loads(x.getMessage()) for x in caplog.records if x.name == "router_lite.access")
    assert line["cost_usd"] == r.json()["usage"]["cost"] == pytest.approx(COST["m1"] + COST["m2"])
    assert line["agents_called"] == ["a1", "a2"] and line["grader"] == "integer" and line["key"] == "team-a"
    assert abs(SpendLedger(ledger).totals()["team-a"]["usd"] - r.json()["usage"]["cost"]) < 1e-12


def test_a_request_over_the_whole_budget_is_402_which_the_sdk_does_not_retry(world, tmp_path, caplog):
    """A key whose whole budget is below one request's worst case: 402 request_over_budget naming the budget, the
    worst case and the max_tokens that fits, no Retry-After (before: 429 with Retry-After of the window, which the
    openai SDK retries); that max_tokens is then admitted; and `serve` warns at start about such a key."""
    from pipeline.serve.auth import budget_warnings

    keys = keys_file(tmp_path, budget_usd=0.02, budget_window="1h")  # below a 100-token request's worst case
    app, _ = _guarded(world, tmp_path, keys)
    with caplog.at_level(logging.INFO, logger="router_lite.access"), serve_in_thread(app) as srv:
        r = ask(srv, KEY_A)
        fits = int(re.search(r"max_tokens of at most (\d+)", r.json()["error"]["message"]).group(1))
        client = openai.OpenAI(base_url=srv.base_url, api_key=KEY_A, max_retries=2)
        with pytest.raises(openai.APIStatusError) as sdk:
            client.chat.completions.create(model=world[0].name, max_tokens=100,
                                           messages=[{"role": "user", "content": "What is 6 x 7?"}])
        ok = ask(srv, KEY_A, max_tokens=fits)
        over = ask(srv, KEY_A, max_tokens=fits + 1)
    err = r.json()["error"]
    assert r.status_code == 402 and "retry-after" not in r.headers, (r.status_code, dict(r.headers))
    assert err["code"] == "request_over_budget" and err["param"] == "max_tokens", err
    assert "$0.020000 per 1h" in err["message"] and "may cost up to $" in err["message"], err["message"]
    assert sdk.value.status_code == 402
    refused = [json.loads(x.getMessage()) for x in caplog.records if x.name == "router_lite.access"]
    assert sum(x["status"] == 402 for x in refused) == 3  # the SDK's call was sent once: not retried
    assert 0 < fits < 100 and ok.status_code == 200 and over.status_code == 402, (fits, ok.text, over.text)
    lines = budget_warnings(app, load_keys(keys))  # the server default: no max_tokens -> the cap, 32768 tokens
    assert len(lines) == 1 and "key 'team-a' has a budget of $0.020000 per 1h" in lines[0] and \
        "402 request_over_budget" in lines[0], lines
    assert budget_warnings(app, load_keys(keys_file(tmp_path, budget_usd=1e6))) == []
