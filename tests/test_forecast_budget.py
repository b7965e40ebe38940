"""Against the local OpenRouter stand-in (pipeline/collect/standin.py): the forecast of a 63-task pilot
collection holds the stand-in's bill; a budget stops the collection at the budget (never above it, calls in flight
counted at their worst case) and a rerun with a higher one resumes with 0 lost and 0 doubled calls."""
import asyncio
import json

import pandas as pd
import pytest
import yaml

from pipeline.collect.agents import AgentSpec
from pipeline.collect.budget import Budget, check_max_usd, collection_state, stop_line
from pipeline.collect.call_log import CallLog, call_key
from pipeline.collect.forecast import (
    call_cost_high,
    completion_lengths,
    forecast,
    forecast_line,
    prompt_tokens_high,
)
from pipeline.collect.settings import CollectionSettings
from pipeline.core.errors import RouterLiteError

KEY = "sk-or-v1-" + "f29b0d6e" * 8  # a fake OpenRouter key
PRICE_FACTOR = 1.25  # the stand-in bills 1.25 x the list price its /models endpoint shows
TASKS = 63


def _agent(name="a", p_in=1.0, p_out=2.0):
    return AgentSpec(name=name, model=f"m/{name}", provider="p", base_url=None, price_in_per_mtok=p_in,
                     price_out_per_mtok=p_out)


def test_forecast_counts_the_calls_left_and_bounds_them():
    tasks = pd.DataFrame({"task_id": ["s/1", "s/2"], "prompt": ["x" * 400, "é" * 40]})
    a, b = _agent("a"), _agent("b", 0.5, 0.5)
    s = CollectionSettings(max_tokens=100)
    done = [call_key("a", "s/1", 0, s.hash())]
    fc = forecast(tasks, [a, b], 2, s, done)
    assert (fc["calls"], fc["calls_total"], fc["calls_done"]) == (7, 8, 1)
    pa = fc["per_agent"]["a"]
    assert pa["calls"] == 3 and pa["completion_source"] == "default"
    # high: bound prompt tokens (UTF-8 bytes + template) and max_tokens on every call left
    high_a = (prompt_tokens_high("é" * 40) * 2 + prompt_tokens_high("x" * 400)) * 1.0 + 3 * 100 * 2.0
    assert pa["usd_high"] == pytest.approx(high_a / 1e6)
    assert fc["usd_low"] < fc["usd_expected"] < fc["usd_high"]
    assert call_cost_high(a, "x" * 400, 100) == pytest.approx((400 + 32 + 200) / 1e6)
    live = forecast(tasks, [a], 1, s, (), live_prices={"m/a": (3.0, 4.0)})["per_agent"]["a"]
    assert live["price_source"].startswith("provider") and live["price_out_per_mtok"] == 4.0


def test_budget_values_and_the_stop_line():
    assert check_max_usd(None) is None and check_max_usd("0.5") == 0.5
    for bad in (-1, "x", float("nan"), True):
        with pytest.raises(RouterLiteError, match="collection.max_usd: must be a number of USD >= 0"):
            check_max_usd(bad)
    b = Budget(1.0, 0.25)
    line = stop_line(b, {"spent": 0.9, "missing": [1, 2], "wanted": 10})
    assert "spent $0.900000 of max_usd $1.000000; 2 of 10 calls remain" in line and "--max-usd" in line


def test_budget_never_passes_its_limit_with_calls_in_flight():
    a = _agent("a", 0.0, 1000.0)  # worst case of a call: 100 tokens x $1000/M = $0.1

    async def run():
        b = Budget(0.35, 0.0, max_tokens=100)
        held = [await b.reserve(a, "") for _ in range(3)]  # 3 x 0.1 (+ the template's prompt tokens at $0)
        assert all(h is not None for h in held) and b.in_flight == 3

        async def settle_later():
            await asyncio.sleep(0.01)
            await b.settle(held[0], 0.01)  # a call that cost far less than its worst case frees room

        waiter = asyncio.create_task(b.reserve(a, ""))  # 0.3 reserved + 0.1 > 0.35: waits for a settle
        await asyncio.sleep(0.01)
        assert not waiter.done()
        await settle_later()
        fourth = await waiter
        assert fourth is not None and b.spent == pytest.approx(0.01)
        for h in held[1:] + [fourth]:
            await b.settle(h, 0.1)  # calls that cost their worst case: spent 0.31
        assert await b.reserve(a, "") is None and b.stopped  # 0.31 + 0.1 > 0.35 with nothing in flight: stop
        assert await b.reserve(_agent("cheap", 0.0, 0.0), "") is None  # stopped: nothing starts any more
        return b

    b = asyncio.run(run())
    assert b.peak_committed <= 0.35 + 1e-12


# ----------------------------------------------------------------------------------------------- the stand-in
@pytest.fixture(scope="module")
def pilot63(tmp_path_factory):
    """The pilot profile's 63-task pool (9 per source), built as `router-lite run --upto task_pool` builds it."""
    import os

    from cli.forecast import profile_task_pool
    from pipeline.profile import load_profile

    over = tmp_path_factory.mktemp("o") / "o.yaml"
    over.write_text(yaml.safe_dump({"task_pool": {"size": TASKS}}))
    old = os.environ.get("ROUTER_LITE_OVERRIDE")
    os.environ["ROUTER_LITE_OVERRIDE"] = str(over)
    try:
        prof = load_profile("pilot")
    finally:
        os.environ.pop("ROUTER_LITE_OVERRIDE")
        if old is not None:
            os.environ["ROUTER_LITE_OVERRIDE"] = old
    return prof, profile_task_pool(prof)


def _collect(prof, pool_res, tasks, home, budget_for=None):
    """Collect every partition of the profile (source x repetition) into `home`'s call logs, as graded_calls does,
    with a `Budget` per partition from `budget_for(state)` (None: no budget). Returns the budgets."""
    from assets.collection_budget import collection_dirs
    from pipeline.collect.calls import run_collect
    from resources.storage import StorageResource

    storage = StorageResource(home=str(home))
    agents = pool_res.agents()
    budgets = []
    for source in prof.sources:
        for rep in range(prof.repetitions):
            state = collection_state(collection_dirs(storage, pool_res.kind, prof), tasks, agents, prof.repetitions,
                                     prof.collection.hash())
            budget = budget_for(state) if budget_for else None
            log = CallLog(storage.calls_dir(pool_res.kind, source, rep))
            run_collect(tasks[tasks["source"] == source], agents, rep, log, pool_res.client_for, prof.collection,
                        budget=budget)
            budgets.append(budget)
    return budgets


def _logged(home) -> pd.DataFrame:
    rows = [json.loads(line) for f in sorted((home / "calls" / "openrouter").glob("*/rep*/*.jsonl"))
            for line in f.read_text().splitlines()]
    return pd.DataFrame(rows)


@pytest.mark.slow
def test_the_standins_bill_falls_inside_its_forecast(pilot63, tmp_path, monkeypatch):
    from cli.forecast import compute_forecast
    from pipeline.collect.standin import StandInServer, pool_standin
    from resources.pool import PoolResource

    prof, tasks = pilot63
    home = tmp_path / "home"
    standin = pool_standin("pilot", tasks=tasks.to_dict("records"), key=KEY, latency_ms=0,
                           price_factor=PRICE_FACTOR)
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    with StandInServer(standin) as server:
        prof = _pointed(prof, server)
        fc, note = compute_forecast(prof, None, str(home))
        assert note.startswith("5 prices from http://127.0.0.1")  # the stand-in's models endpoint, with the key
        pool_res = PoolResource(kind="openrouter", pool="pilot", base_url=server.base_url,
                                key_hosts=[server.host_port])
        _collect(prof, pool_res, tasks, home)
        after, _ = compute_forecast(prof, None, str(home))
    calls = _logged(home)
    bill = float(calls["cost_usd"].sum())
    billed = sum(g["total_cost"] for g in standin.generations.values())
    assert fc["calls"] == TASKS * 5 * 3 == len(calls) and bill == pytest.approx(billed)
    assert fc["usd_low"] <= bill <= fc["usd_high"], (fc["usd_low"], bill, fc["usd_high"])
    for agent, v in fc["per_agent"].items():
        spent = float(calls.loc[calls["agent"] == agent, "cost_usd"].sum())
        assert v["usd_low"] <= spent <= v["usd_high"], (agent, v, spent)
    assert after["calls"] == 0 and {v["completion_source"] for v in after["per_agent"].values()} == {"recorded calls"}
    # the same collection forecast again from the lengths now measured: its expected figure is the list-price bill
    lengths = completion_lengths(calls)
    again = forecast(tasks, pool_res.agents(), prof.repetitions, prof.collection, (), lengths)
    assert again["usd_low"] <= bill / PRICE_FACTOR <= again["usd_high"]
    assert again["usd_expected"] == pytest.approx(bill / PRICE_FACTOR, rel=0.02)
    print(f"\n63-task pilot through the stand-in: forecast {fc['calls']} calls, USD {fc['usd_low']:.6f} .. "
          f"{fc['usd_high']:.6f} (expected {fc['usd_expected']:.6f} at the default completion length); stand-in "
          f"bill ${bill:.6f} (x{PRICE_FACTOR} list); with measured lengths: USD {again['usd_low']:.6f} .. "
          f"{again['usd_high']:.6f}, expected {again['usd_expected']:.6f} x {PRICE_FACTOR} = "
          f"{again['usd_expected'] * PRICE_FACTOR:.6f}")


def _pointed(prof, server):
    import dataclasses

    return dataclasses.replace(prof, pool=dataclasses.replace(prof.pool, base_url=server.base_url,
                                                              key_hosts=(server.host_port,)))


@pytest.mark.slow
def test_a_budget_stops_the_collection_and_a_higher_one_resumes_it(pilot63, tmp_path, monkeypatch):
    from pipeline.collect.standin import StandInServer, pool_standin
    from resources.pool import PoolResource

    prof, tasks = pilot63
    home = tmp_path / "home"
    standin = pool_standin("pilot", tasks=tasks.to_dict("records"), key=KEY, latency_ms=5,
                           price_factor=PRICE_FACTOR)
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    wanted = TASKS * 5 * 3
    max_usd = 0.012  # about 40 % of this collection's bill ($0.0295)
    with StandInServer(standin) as server:
        pool_res = PoolResource(kind="openrouter", pool="pilot", base_url=server.base_url,
                                key_hosts=[server.host_port])
        first = _collect(prof, pool_res, tasks, home,
                         lambda st: Budget(max_usd, st["spent"], prof.collection.max_tokens))
        stopped = _logged(home)
        spent = float(stopped["cost_usd"].fillna(0).sum())
        answered_first = sum(e["kind"] == "answered" for e in standin.events)
        assert any(b.stopped for b in first) and spent <= max_usd  # never above the budget
        assert all(b.peak_committed <= max_usd + 1e-12 for b in first)  # nor its reservations
        assert 0 < stopped["call_key"].nunique() < wanted and answered_first == len(stopped)  # every made call logged
        _collect(prof, pool_res, tasks, home, lambda st: Budget(10.0, st["spent"], prof.collection.max_tokens))
    calls = _logged(home)
    answered = sum(e["kind"] == "answered" for e in standin.events)
    assert calls["call_key"].nunique() == wanted == len(calls)  # 0 lost, 0 doubled in the log
    assert answered == wanted  # and at the stand-in: no call made twice
    assert set(stopped["call_key"]) <= set(calls["call_key"])
    worst = max(call_cost_high(a, p, prof.collection.max_tokens) for a in pool_res.agents() for p in tasks["prompt"])
    print(f"\nbudget ${max_usd}: stopped after {len(stopped)} of {wanted} calls, spent ${spent:.6f} (peak committed "
          f"${max(b.peak_committed for b in first):.6f}, worst case of one call ${worst:.6f}); resume with $10: "
          f"{wanted - len(stopped)} calls made, {len(calls)} rows, {calls['call_key'].nunique()} keys, bill "
          f"${calls['cost_usd'].sum():.6f}")


def test_matrix_complete_names_the_cells_never_collected():
    from assets.collection_budget import matrix_complete_check

    tasks = pd.DataFrame({"task_id": ["s/1", "s/2"]})
    calls = pd.DataFrame({"agent": ["a", "a", "b"], "task_id": ["s/1", "s/2", "s/1"], "repetition": [0, 0, 0]})
    res = matrix_complete_check(calls, tasks, ["a", "b"], 1)
    assert not res.passed and res.metadata["missing_cells"].value == 1
    assert "1 of 4 cells (agent/task/repetition) were never collected, e.g. b/s/2/rep0" in res.description
    assert matrix_complete_check(calls, tasks, ["a"], 1).passed


def _cli(args, home, env_extra=None):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("OPENROUTER_API_KEY", "ROUTER_LITE_OVERRIDE",
                                                             "ROUTER_LITE_PROFILE", "ROUTER_LITE_LOG_LEVEL")}
    env.update({"ROUTER_LITE_HOME": str(home), "PYTHONPATH": str(repo), **(env_extra or {})})
    return subprocess.run([sys.executable, "-m", "cli.main", *args], env=env, cwd=repo, capture_output=True,
                          text=True, timeout=900, check=False)


@pytest.mark.slow
def test_forecast_of_the_pilot_needs_no_key(tmp_path):
    """... and writes into the pilot's own folder of a home whose root holds another profile's (demo's) lineage."""
    from resources.storage import OWNER_FILE, PROFILES_DIR

    (tmp_path / "home").mkdir()
    (tmp_path / "home" / OWNER_FILE).write_text("demo\n")
    p = _cli(["forecast", "--profile", "pilot"], tmp_path / "home")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "16,650 calls wanted (0 of 16,650 done), USD " in p.stdout and "no OPENROUTER_API_KEY" in p.stdout
    assert not (tmp_path / "home" / "reports").exists()  # not the demo's folder
    fc = json.loads((tmp_path / "home" / PROFILES_DIR / "pilot" / "reports" / "forecast.json").read_text())
    assert fc["calls"] == 16650 and 0 < fc["usd_low"] < fc["usd_expected"] < fc["usd_high"]
    assert set(fc["per_agent"]) == {"frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"}


@pytest.mark.slow
def test_run_max_usd_stops_with_one_line_and_resumes(tmp_path, temp_instance_dir):
    """`router-lite run --max-usd` on the smoke profile (replay: estimated costs): the stop line, then the rerun."""
    home, extra = tmp_path / "home", {"DAGSTER_HOME": str(temp_instance_dir)}
    p = _cli(["run", "--profile", "smoke", "--upto", "graded_calls", "--max-usd", "0.2"], home, extra)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("router-lite: error:")]
    assert p.returncode == 2 and len(errors) == 1, p.stderr[-3000:]
    assert "check graded_calls:within_budget failed: collection budget reached: spent $" in errors[0]
    assert "of max_usd $0.200000" in errors[0] and "calls remain" in errors[0] and "--max-usd" in errors[0]
    first = _replay_rows(home)
    assert 0 < len(first) < 4500 and first["cost_usd"].sum() <= 0.2
    p = _cli(["run", "--profile", "smoke", "--upto", "graded_calls", "--max-usd", "100"], home, extra)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = _replay_rows(home)
    assert len(rows) == rows["call_key"].nunique() == 4500  # 0 lost, 0 doubled
    assert set(first["call_key"]) <= set(rows["call_key"])


def _replay_rows(home) -> pd.DataFrame:
    return pd.DataFrame([json.loads(line) for f in sorted((home / "calls" / "replay").glob("*/rep*/*.jsonl"))
                         for line in f.read_text().splitlines()])


def test_a_sampled_agent_is_forecast_on_its_sample_only():
    """Per source and repetition the sample's size (round(fraction x n), at least 2); a partly logged source gives a
    range: the logged tasks may or may not be in the sample."""
    tasks = pd.DataFrame({"task_id": [f"t{i}" for i in range(30)], "prompt": ["x" * (40 + 4 * i) for i in range(30)],
                          "source": ["s"] * 20 + ["u"] * 10})
    settings = CollectionSettings(max_tokens=100)
    a, b = _agent("a"), _agent("b")
    full = forecast(tasks, [a, b], 2, settings)
    fc = forecast(tasks, [a, b], 2, settings, sampled={"b": 0.3})
    assert fc["per_agent"]["a"] == full["per_agent"]["a"]  # an agent not sampled: forecast as before
    assert fc["per_agent"]["a"]["calls"] == 60 and fc["per_agent"]["b"]["calls"] == 2 * (6 + 3)
    assert fc["per_agent"]["b"]["calls_low"] == 18 and fc["sampled"] == ["b"]
    assert fc["per_agent"]["b"]["usd_high"] < full["per_agent"]["b"]["usd_high"] * 0.4
    fb = fc["per_agent"]["b"]
    assert 0 < fb["usd_low"] <= fb["usd_expected"] <= fb["usd_high"]
    sh = settings.hash()
    done = [call_key("b", f"t{i}", 0, sh) for i in range(15)]  # 15 of source s's 20 logged in repetition 0
    fc = forecast(tasks, [b], 2, settings, done, sampled={"b": 0.3})
    # rep 0: s has 5 left, its sample of 6 needs 0 (all 6 among the logged 15) to 5 of them; u 3; rep 1: 6 + 3
    assert (fc["calls_low"], fc["calls"]) == (0 + 3 + 9, 5 + 3 + 9)
    assert "b on a sample: 12 to 17 calls" in forecast_line(fc)
