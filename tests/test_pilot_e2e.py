"""The seed's own path, end to end: the pilot profile through the local OpenRouter stand-in
(pipeline/collect/standin.py), pointed at it by an override file as a user would (`router-lite run --override`).

One slow test runs `router-lite run --profile pilot` as a user does, on a small slice (63 tasks: 9 per source,
3 repetitions): the task pool without a key; the whole run without a key (one line, exit 2); pre-flight with three
misbehaving models (past max_tokens, no usage, 25 % empties: each excluded with its reason); collection with
provider-reported costs and a 429 storm; a SIGKILL mid-collection and the resume (0 lost, 0 doubled calls); rewards,
head, registered head, the routed benchmark through the stand-in; and the fake key in no log, no Dagster metadata,
no file. It prints its figures.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pipeline.collect.standin import OpenRouterStandIn, StandInServer, pool_standin
from pipeline.core.prompts import prompt_hash
from resources.storage import asset_path

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-or-v1-" + "e2e0f4ke" * 8  # a fake OpenRouter key (64 characters after the prefix)
KEY_RUNS = (KEY, KEY[9:25], KEY[-16:])  # the key and 16-character runs of it
MISSING = "needs the OPENROUTER_API_KEY environment variable, which is not set"
GOOD = {"frontier_a": "openai/gpt-oss-120b", "frontier_b": "deepseek/deepseek-v4-flash-0731"}
STORM = {"after": 30, "count": 12, "retry_after": 1, "max_per_prompt": 2}  # deepseek's requests 30-41: in the
# first partitions; at most 2 x 429 per call, so with 3 retries every call gets through
FAULTS = {
    "google/gemma-3-27b-it": {"overshoot_max_tokens": 17},  # frontier_c: runs past max_tokens
    "mistralai/mistral-nemo": {"no_usage": True},  # open_mid: no usage object
    "inclusionai/ling-3.0-flash": {"empty_rate": 0.25},  # open_cheap_reasoning: 25 % empty replies
    "deepseek/deepseek-v4-flash-0731": {"rate_limit_storm": STORM},  # frontier_b: a 429 storm in collection
}
PRICE_FACTOR = 1.25  # the stand-in charges 1.25 x list price: a logged cost equal to it is the provider's
TASKS, REPS = 63, 3


def _env(home: Path, dagster_home: Path, key: str | None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENROUTER_API_KEY", "ROUTER_LITE_OVERRIDE", "ROUTER_LITE_LOG_LEVEL", "ROUTER_LITE_DEBUG",
                        "ROUTER_LITE_PROFILE")}
    env.update({"ROUTER_LITE_HOME": str(home), "DAGSTER_HOME": str(dagster_home), "PYTHONPATH": str(REPO)})
    if key:
        env["OPENROUTER_API_KEY"] = key
    return env


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", *args]


def _run(args: list[str], env: dict, logs: list, timeout: float = 600) -> subprocess.CompletedProcess:
    p = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
    logs.append(p.stdout + p.stderr)
    return p


def _logged(home: Path) -> pd.DataFrame:
    """Every row of the collection call logs (not the benchmark's), as written."""
    rows = []
    for f in sorted((home / "calls" / "openrouter").glob("*/rep*/*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:  # a torn last line after SIGKILL (the call log skips it too)
                pass
    return pd.DataFrame(rows)


def _benchmark_rows(home: Path, log: str = "benchmark") -> pd.DataFrame:
    """Call-log rows of the routed benchmark (`benchmark`: the head's; `benchmark_cascade`: the cascade's stages)."""
    rows = [json.loads(line) for f in (home / "calls" / "openrouter" / log).glob("*/*.jsonl")
            for line in f.read_text().splitlines() if line.strip()]
    return pd.DataFrame(rows)


def _answered(standin: OpenRouterStandIn, hashes: set[str]) -> int:
    return sum(e["kind"] == "answered" and e["prompt_hash"] in hashes for e in list(standin.events))


def _key_hits(root: Path) -> list[str]:
    hits = []
    for f in root.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            hits += [f"{f}: {run[:6]}..." for run in KEY_RUNS if run.encode() in data]
    return hits


def _collect_until(proc: subprocess.Popen, standin: OpenRouterStandIn, hashes: set[str], n: int,
                   timeout_s: float = 400) -> int:
    """Wait until the stand-in has answered `n` collection calls, then SIGKILL the run's process group."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if _answered(standin, hashes) >= n:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            return _answered(standin, hashes)
        time.sleep(0.05)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    out = proc.communicate(timeout=30)[0]
    raise AssertionError(f"the run ended (rc {proc.returncode}) or stalled before {n} collection calls:\n{out}")


@pytest.mark.slow
def test_pilot_end_to_end_through_the_openrouter_standin(tmp_path, temp_instance_dir, monkeypatch):
    home, dagster_home = tmp_path / "home", temp_instance_dir
    logs: list[str] = []
    figures: dict = {}
    walls: dict = {}
    t0 = time.monotonic()
    override = tmp_path / "standin.yaml"

    # -- the task pool needs no key (the override file already points the pool at a local endpoint)
    base = {"task_pool": {"size": TASKS}, "train": {"generations": 8}, "backbone": {"backend": "torch"}}
    override.write_text(yaml.safe_dump({**base, "pool": {"base_url": "http://127.0.0.1:9/api/v1",
                                                         "key_hosts": ["127.0.0.1:9"]}}))
    nokey = _env(home, dagster_home, None)
    p = _run(_cli("run", "--profile", "pilot", "--override", str(override), "--upto", "task_pool"), nokey, logs)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "[task pool] task_pool done" in p.stderr and "preflight" not in p.stderr  # only task_pool and its inputs
    walls["task pool"] = time.monotonic() - t0
    pool = pd.read_parquet(asset_path(home, "task_pool"))
    assert len(pool) == TASKS and pool["source"].nunique() == 7

    # -- the whole run without a key: one line naming the variable and the asset, exit 2, before any stage
    p = _run(_cli("run", "--profile", "pilot"), nokey, logs)
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"router-lite: error: preflight {MISSING}"), lines
    figures["no key"] = lines[0]

    # -- the same in a Dagster run (what the UI shows on the failed step): preflight alone, no key
    from dagster import AssetKey, materialize

    from assets.definitions import build_definitions
    from cli.run import user_error

    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    monkeypatch.setenv("ROUTER_LITE_OVERRIDE", str(override))
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    defs = build_definitions(home=str(home), profile="pilot")
    result = materialize(list(defs.assets) + list(defs.asset_checks), selection=[AssetKey("preflight")],
                         resources=defs.resources, raise_on_error=False,
                         run_config={"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}})
    assert not result.success
    ui_message = user_error(result)
    assert ui_message.startswith(f"preflight {MISSING}") and "\n" not in ui_message, ui_message
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert [e.step_key for e in failures] == ["preflight"]
    monkeypatch.delenv("ROUTER_LITE_OVERRIDE")

    # -- the stand-in, knowing the pool's tasks; the override a user would write points the pool at it
    standin = pool_standin("pilot", tasks=pool.to_dict("records"), key=KEY, faults=FAULTS, latency_ms=15,
                           price_factor=PRICE_FACTOR)
    hashes = {prompt_hash(p) for p in pool["prompt"]}
    with StandInServer(standin) as server:
        override.write_text(yaml.safe_dump({**base, **server.override()}))
        withkey = _env(home, dagster_home, KEY)
        # baselines is no ancestor of the promotion (the benchmark report reads the reward matrix itself): name
        # both; the promotion (after the benchmark report) writes the served pointer read below
        full = _cli("run", "--profile", "pilot", "--override", str(override), "--upto", "promotion",
                    "--upto", "baselines")
        wanted = TASKS * len(GOOD) * REPS

        # -- collection killed with SIGKILL once 40 % of its calls are answered
        t0 = time.monotonic()
        proc = subprocess.Popen(full, env=withkey, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        answered_before = _collect_until(proc, standin, hashes, int(0.4 * wanted))
        walls["killed run"] = time.monotonic() - t0
        logs.append(proc.stdout.read())
        proc.stdout.close()
        before = _logged(home)
        logged_before = set(before.loc[before["status"] == "ok", "call_key"])
        assert 0 < len(logged_before) < wanted

        # -- the resume: the same command, to the end
        t0 = time.monotonic()
        p = _run(full, withkey, logs)
        walls["resume"] = time.monotonic() - t0
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        answered_all = _answered(standin, hashes)
        stats = standin.stats()

    # pre-flight: two agents pass, each misbehaving model is excluded with its reason
    pf = pd.read_parquet(asset_path(home, "preflight")).set_index("agent")
    assert set(pf.index[pf["passed"]]) == set(GOOD)
    reasons = pf.loc[~pf["passed"], "reason"].to_dict()
    assert reasons["frontier_c"].startswith("max_tokens not respected: 4113 completion tokens > 4096"), reasons
    assert reasons["open_mid"] == "20/20 responses lack usable usage token counts", reasons
    assert reasons["open_cheap_reasoning"] == "empty-rate 25% >= 5%", reasons
    assert (pf.loc[list(GOOD), "n_ok"] == 20).all()  # valid completions: all 20 of each passing agent

    # collection: every call once, nothing lost, nothing made twice, provider costs, the storm honoured
    calls = _logged(home)
    ok = calls[calls["status"] == "ok"]
    assert set(calls["status"]) == {"ok"}, calls["status"].value_counts()  # no error row: the storm was waited out
    assert ok["call_key"].nunique() == wanted and len(ok) == wanted  # 0 lost, 0 doubled in the log
    bench = _benchmark_rows(home)
    cascade_bench = _benchmark_rows(home, "benchmark_cascade")  # the cascade's stage calls, their own log
    assert len(cascade_bench) > 0 and set(cascade_bench["usage_source"]) == {"provider"}
    remade = answered_all - answered_before - len(bench) - len(cascade_bench)  # collection calls of the resume
    assert remade == wanted - len(logged_before), (remade, wanted, len(logged_before))  # nothing logged re-made
    in_flight = answered_before - len(logged_before)  # answered, then killed before the log had them
    assert 0 <= in_flight <= 8  # at most the collection concurrency
    deepseek = stats["per_model"][GOOD["frontier_b"]]
    assert 0 < deepseek["rate_limited"] <= STORM["count"]
    assert stats["retry_after_honoured"] == deepseek["rate_limited"] and stats["retry_after_violated"] == 0
    assert stats["unauthorized"] == 0  # the key reached the stand-in, and only the key
    assert (ok["attempts"] > 1).sum() >= 1 and set(ok["usage_source"]) == {"provider"}
    agents = {a.name: a for a in standin_agents()}
    list_cost = ok.apply(lambda r: agents[r["agent"]].cost(r["prompt_tokens"], r["completion_tokens"]), axis=1)
    assert ((ok["cost_usd"] - PRICE_FACTOR * list_cost).abs() < 1e-9).all()  # the provider's cost, not ours

    # rewards, head, registered head, routed benchmark
    rewards = pd.read_parquet(asset_path(home, "reward_matrix"))
    assert len(rewards) == TASKS and not rewards["cost_estimated"].any()
    reports = home / "reports"
    for name in ("baselines.md", "benchmark_report.md"):
        text = (reports / name).read_text()
        assert "costs as reported by the provider" in text and "ESTIMATED" not in text, name
    head = json.loads(asset_path(home, "router_head", suffix=".json").read_text())
    from pipeline.route.registry import latest_path

    registered = latest_path(home / "registry")
    manifest = json.loads((registered / "manifest.json").read_text())
    assert [a["name"] for a in manifest["agents"]] == list(GOOD)
    test_n = int(((pool["split"] == "test") & ~pool["ood"]).sum())
    assert len(bench) == test_n * len(GOOD) and set(bench["status"]) == {"ok"}  # each routed question, each agent
    assert set(bench["usage_source"]) == {"provider"}
    per_q = pd.read_csv(reports / "benchmark_test.csv")
    summary = json.loads((reports / "benchmark_report.json").read_text())["variants"]["test"]

    # the key: in no log, no Dagster metadata or event, no file under ROUTER_LITE_HOME or DAGSTER_HOME
    assert not [s for s in logs if any(run in s for run in KEY_RUNS)]
    assert not _key_hits(home) and not _key_hits(dagster_home)
    from dagster import DagsterInstance

    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
    with DagsterInstance.get() as instance:
        runs = instance.get_runs()
        events = [str(e) for r in runs for e in instance.all_logs(r.run_id)]
        configs = [json.dumps(r.run_config, default=str) + json.dumps(r.tags) for r in runs]
    assert len(runs) > 30 and not [s for s in events + configs if any(run in s for run in KEY_RUNS)]

    m = head["metrics"]
    cost = {"collection": float(ok["cost_usd"].sum()), "benchmark": float(bench["cost_usd"].sum())}
    print("\n== pilot end to end through the OpenRouter stand-in ==")
    print(f"no key: `router-lite run --profile pilot --upto task_pool` rc 0 ({len(pool)} tasks); "
          f"`router-lite run --profile pilot` rc 2: {figures['no key']}")
    print(f"Dagster step failure without a key: {ui_message}")
    print(f"pre-flight passed: {', '.join(f'{a} ({GOOD[a]})' for a in GOOD)}")
    for a, why in reasons.items():
        print(f"pre-flight failed: {a} ({pf.loc[a, 'model']}): {why}")
    print(f"collection: {wanted} calls wanted ({TASKS} tasks x {len(GOOD)} agents x {REPS} repetitions); "
          f"SIGKILL after {answered_before} answered, {len(logged_before)} logged ({in_flight} in flight, answered "
          f"but not yet logged); the resume made {remade} = {wanted} - {len(logged_before)}: 0 lost, 0 doubled; "
          f"{len(ok)} ok rows, {ok['call_key'].nunique()} keys")
    print(f"429 storm on {GOOD['frontier_b']}: {deepseek['rate_limited']} x 429 (Retry-After "
          f"{STORM['retry_after']} s), {stats['retry_after_honoured']} retries honoured, "
          f"{stats['retry_after_violated']} early; {int((ok['attempts'] > 1).sum())} calls needed a retry, 0 errors")
    print(f"cost (provider-reported, usage.cost; cost_estimated false): collection ${cost['collection']:.6f}, "
          f"routed benchmark ${cost['benchmark']:.6f}")
    print("accuracy (collection, all repetitions): "
          + ", ".join(f"{a} {ok[ok['agent'] == a]['correct'].mean():.3f}" for a in GOOD))
    intended = ok.apply(lambda r: standin.intended(GOOD[r["agent"]], pool.set_index("task_id").loc[
        r["task_id"], "prompt"]), axis=1)
    print(f"grader vs the stand-in's intended answers: {int((intended == ok['correct']).sum())}/{len(ok)} agree")
    print(f"head (held-out test n={m['n_test']}): head {m['head']:.4f} vs best single {m['best_single']:.4f} "
          f"(kNN {m['knn']:.4f}, random {m['random']:.4f}, oracle {m['oracle']:.4f}); shipped: "
          f"{head['extra'].get('gate', {}).get('shipped', 'head')}; registered {registered.name}")
    print(f"routed benchmark (test n={summary['n']}): router accuracy {summary['accuracy']:.4f}, "
          f"{len(bench)} real calls through the stand-in ({test_n} questions x {len(GOOD)} agents), "
          f"routing {summary['distribution']}")
    times = json.loads((reports / "stage_times.json").read_text())
    print(f"wall: task pool {walls['task pool']:.0f} s, run to the kill {walls['killed run']:.0f} s, resume "
          f"{walls['resume']:.0f} s (stages {times['stages']})")
    print(f"key: in 0 of {len(logs)} run logs, 0 files, 0 of {len(events)} Dagster events / {len(runs)} run configs")
    assert (intended == ok["correct"]).all()
    assert len(per_q) == test_n


def standin_agents():
    from pipeline.collect.agents import load_agents

    return load_agents(REPO / "config" / "agents.yaml", "pilot")


def test_serve_without_a_key_is_one_line(monkeypatch, capsys):
    """`router-lite serve` on the pilot pool without OPENROUTER_API_KEY: one line naming it and `serve`, exit 2,
    before the head is read."""
    from cli import main as cli

    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    monkeypatch.delenv("ROUTER_LITE_OVERRIDE", raising=False)
    assert cli.main(["serve", "--head", "/nonexistent/head", "--profile", "pilot", "--port", "0"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == [f"router-lite: error: serve {MISSING} (pool 'pilot' of kind 'openrouter' calls the provider)"]


def test_an_override_file_points_the_pilot_at_another_endpoint(tmp_path, monkeypatch):
    from assets.definitions import build_definitions
    from pipeline.core.errors import RouterLiteError
    from pipeline.profile import load_profile

    f = tmp_path / "o.yaml"
    f.write_text("pool: {base_url: 'http://127.0.0.1:8765/api/v1', key_hosts: ['127.0.0.1:8765']}\n"
                 "task_pool: {size: 30}\n")
    monkeypatch.setenv("ROUTER_LITE_OVERRIDE", str(f))
    prof = load_profile("pilot")
    assert prof.pool.base_url == "http://127.0.0.1:8765/api/v1" and prof.pool.key_hosts == ("127.0.0.1:8765",)
    assert prof.pool.kind == "openrouter" and prof.pool.name == "pilot" and prof.task_pool.size == 30
    assert prof.task_pool.seed == 42 and prof.override == str(f)  # the rest of the profile as it was
    pool = build_definitions(profile=prof).resources["pool"]
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    pool.check(pool.agents())  # the listed host may receive the key
    assert pool.client_for(pool.agents()[0]).api_key == KEY
    f.write_text("pool: {base_urll: x}\n")
    with pytest.raises(RouterLiteError, match=r"pilot.yaml \(override .*o.yaml\): pool.base_urll: unknown key"):
        load_profile("pilot")
    monkeypatch.setenv("ROUTER_LITE_OVERRIDE", str(tmp_path / "missing.yaml"))
    with pytest.raises(RouterLiteError, match="ROUTER_LITE_OVERRIDE=.*missing.yaml: no such file"):
        load_profile("pilot")


@pytest.mark.slow
def test_the_standin_speaks_openrouter():
    """The stand-in alone: OpenRouter's response and error shapes, the key, Retry-After, generation stats."""
    import httpx

    st = pool_standin("pilot", tasks=[{"task_id": "t/1", "prompt": "Q?", "gold": "B", "grader": "mcq_letter",
                                       "source": "mmlu", "domain": "knowledge", "difficulty": "easy",
                                       "choices": 4}], key=KEY,
                      faults={"mistralai/mistral-nemo": {"rate_limit_storm": {"after": 0, "count": 1,
                                                                              "retry_after": 2}},
                              "google/gemma-3-27b-it": {"error_rate": 1.0}})
    with StandInServer(st) as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        auth = {"authorization": f"Bearer {KEY}"}
        body = {"model": "openai/gpt-oss-120b", "messages": [{"role": "user", "content": "Q?"}], "max_tokens": 64}
        r = c.post("/chat/completions", json=body, headers=auth).json()
        assert r["id"].startswith("gen-") and r["provider"] == "StandIn" and r["object"] == "chat.completion"
        assert set(r["usage"]) >= {"prompt_tokens", "completion_tokens", "total_tokens", "cost"}
        assert "The answer is (" in r["choices"][0]["message"]["content"]
        gen = c.get("/generation", params={"id": r["id"]}).json()["data"]
        assert gen["total_cost"] == r["usage"]["cost"] and gen["model"] == body["model"]
        assert [m["id"] for m in c.get("/models").json()["data"]] == st.models
        no = c.post("/chat/completions", json=body)
        assert no.status_code == 401 and no.json() == {"error": {"code": 401, "message": "No auth credentials found"}}
        bad = c.post("/chat/completions", json={**body, "model": "x/y"}, headers=auth)
        assert bad.status_code == 400 and bad.json()["error"]["message"] == "x/y is not a valid model ID"
        rl = c.post("/chat/completions", json={**body, "model": "mistralai/mistral-nemo"}, headers=auth)
        assert rl.status_code == 429 and rl.headers["retry-after"] == "2" and rl.json()["error"]["code"] == 429
        pe = c.post("/chat/completions", json={**body, "model": "google/gemma-3-27b-it"}, headers=auth)
        assert pe.status_code == 502 and pe.json()["error"]["message"] == "Provider returned error"
        s = c.post("/chat/completions", json={**body, "stream": True}, headers=auth)
        assert s.text.rstrip().endswith("data: [DONE]") and '"usage"' in s.text
    assert st.stats()["unauthorized"] == 1
    # right and wrong replies grade as intended, per model
    from pipeline.collect.grading import grade

    for model in st.models:
        text = st.reply_text(model, "Q?")
        assert grade(text, "B", "mcq_letter")[1] == st.intended(model, "Q?")


@pytest.mark.slow
def test_preflight_excludes_invalid_completions_from_the_standin(monkeypatch):
    """Pre-flight's first criterion (valid completions) through the stand-in: OpenRouter's HTTP 200 carrying an
    `error` object and no choices, on every call of one model -> that agent is excluded with its reason; a 502
    on a fifth of another's calls is retried and that agent passes."""
    from pipeline.collect.preflight import preflight
    from pipeline.collect.settings import CollectionSettings
    from resources.pool import PoolResource

    st = pool_standin("pilot", tasks=[], key=KEY, faults={"openai/gpt-oss-120b": {"error_body_rate": 1.0},
                                                           "mistralai/mistral-nemo": {"error_rate": 0.2}})
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    with StandInServer(st) as srv:
        pool = PoolResource(kind="openrouter", pool="pilot", base_url=srv.base_url, key_hosts=[srv.host_port])
        agents = [a for a in pool.agents() if a.name in ("frontier_a", "open_mid")]
        # one call at a time: the 502s fall on every fifth request of a model, so a retry is the next request and
        # never a 502 too (with calls in flight, a retry could draw another 502 slot and the agent fail by timing)
        df = preflight(pool.client_for, agents, ["What is 2 + 2? Reply with the number only."],
                       CollectionSettings(max_retries=1, backoff_base_s=0.01, concurrency=1)).set_index("agent")
    assert not df.loc["frontier_a", "passed"]
    assert df.loc["frontier_a", "reason"].startswith("20/20 calls failed (bad_response: 20; first: "), df
    assert "Provider returned error" in df.loc["frontier_a", "reason"]
    assert df.loc["open_mid", "passed"] and df.loc["open_mid", "n_ok"] == 20, df.loc["open_mid"].to_dict()
    assert st.stats()["per_model"]["mistralai/mistral-nemo"]["provider_error"] >= 1
