"""Attacks on the files a user hands in: profiles (a YAML bomb, out-of-range sampling values, a 50 MB or 100,000-deep
or non-UTF-8 file, a path for a name), train inputs (10^6 rows of one task_id, an unknown split, a CSV list column),
the task pool (one question under two ids), the call log (a garbage line) and the price tables (non-finite prices).
Each gets one RouterLiteError line naming file and field (exit 2 on the command line), within its bounds."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from attack_kit import REPO, cli, demo_with, one_line, profile_text, refused

from pipeline.core.environ import environ as env


def test_yaml_bomb(tmp_path: Path) -> None:
    """profile: billion-laughs YAML at an integer field"""
    from pipeline import profile
    from pipeline.core import config

    levels = ["  - &l0 [" + ", ".join(["lol"] * 9) + "]"]
    levels += [f"  - &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 9)]
    text = "collection:\n  concurrency:\n" + "\n".join(levels) + "\nsources: {zeroeval_gsm8k: {}}\n"
    t = time.perf_counter()
    with profile_text(tmp_path, text) as path:
        msg = refused(lambda: profile.load_profile("demo"), str(path), "aliases")
    bomb = ["lol"] * 9
    for _ in range(9):
        bomb = [bomb] * 9  # 9^10 strings once expanded, 10 lists in memory
    shown = config._what(bomb)  # the error path renders a cut value, never the whole graph
    assert len(shown) <= 80 and time.perf_counter() - t < 5
    print(f"{len(text)} bytes refused in {time.perf_counter() - t:.2f}s: {msg[len(str(path)) + 2:][:60]}")


def test_profile_bounds(tmp_path: Path) -> None:
    """profile: temperature nan / 5 / -1, top_p 2 / inf, max_tokens 1e9"""
    from pipeline import profile

    cases = [("temperature", float("nan")), ("temperature", 5), ("temperature", -1), ("top_p", 2),
             ("top_p", float("inf")), ("max_tokens", 10**9)]
    for key, value in cases:
        with profile_text(tmp_path, demo_with(**{key: value})) as path:
            refused(lambda: profile.load_profile("demo"), str(path), f"collection.{key}")
    print(f"{len(cases)} values refused at load, each naming file and key")


def test_profile_size_depth_encoding(tmp_path: Path) -> None:
    """profile: 50 MB file, 100,000-deep nesting, non-UTF-8 bytes"""
    from pipeline import profile

    t = time.perf_counter()
    with profile_text(tmp_path, b"description: '" + b"x" * (50 << 20) + b"'\n") as path:
        refused(lambda: profile.load_profile("demo"), str(path), "larger than")
    big_s = time.perf_counter() - t
    with profile_text(tmp_path, "train: " + "[" * 100_000 + "]" * 100_000 + "\n") as path:
        refused(lambda: profile.load_profile("demo"), str(path), "nested deeper")
    with profile_text(tmp_path, b"description: caf\xe9\n") as path:
        refused(lambda: profile.load_profile("demo"), str(path), "not UTF-8")
    assert big_s < 5, big_s
    print(f"each one line; the 50 MB file refused in {big_s:.2f}s")


def test_profile_traversal(tmp_path: Path) -> None:
    """profile: --profile ../path, ROUTER_LITE_PROFILE=<path>, dagster.yaml as a profile"""
    from pipeline import profile

    (tmp_path / "elsewhere").mkdir(exist_ok=True)
    shutil.copy(REPO / "config" / "profiles" / "demo.yaml", tmp_path / "elsewhere" / "name.yaml")
    rel = os.path.relpath(tmp_path / "elsewhere" / "name", REPO / "config" / "profiles")
    for name in (rel, str(tmp_path / "elsewhere" / "name"), "../../dagster"):
        refused(lambda name=name: profile.load_profile(name), "is not a profile name", "ROUTER_LITE_CONFIG")
        with env(ROUTER_LITE_PROFILE=name):
            refused(lambda: profile.load_profile(), "is not a profile name")
    rc, err = cli("run", "--profile", "../../dagster", "--upto", "source_tasks")
    assert rc == 2 and err.count("\n") == 1 and "is not a profile name" in err, (rc, err)
    print("names only; another config dir only through ROUTER_LITE_CONFIG")


# ------------------------------------------------------------------------------------------------ train inputs
def _train_files(tmp: Path, n: int = 60) -> tuple[Path, Path]:
    rewards = [{"task_id": f"t{i}", "agent_order": ["frontier_a", "frontier_b"], "mean_reward": [i % 2, 1 - i % 2]}
               for i in range(n)]
    tasks = [{"task_id": f"t{i}", "prompt": f"question {i}", "split": ("train", "validation", "test")[i % 3]}
             for i in range(n)]
    r, t = tmp / "rewards.jsonl", tmp / "tasks.jsonl"
    r.write_text("".join(json.dumps(x) + "\n" for x in rewards))
    t.write_text("".join(json.dumps(x) + "\n" for x in tasks))
    return r, t


def _train(tmp: Path, r: Path, t: Path) -> tuple[int, str]:
    return cli("train", "--rewards", str(r), "--tasks", str(t), "--out", str(tmp / "out"))


def _duplicate_ids(tmp: Path, n: int) -> str:
    r, t = _train_files(tmp)
    line = json.dumps({"task_id": "t0", "agent_order": ["frontier_a", "frontier_b"], "mean_reward": [1, 0]}) + "\n"
    r.write_text(line * n)
    err = one_line(*_train(tmp, r, t), "t0", f"{n:,} times", "in all")
    return f"{n:,} rows of one task_id: {len(err)}-character line"


def test_train_duplicate_ids_fast(tmp_path: Path) -> None:
    """train: 200,000 rows of one task_id (fast form of the 10^6 row)"""
    print(_duplicate_ids(tmp_path, 200_000))


@pytest.mark.slow
def test_train_duplicate_ids(tmp_path: Path) -> None:
    """train: 10^6 rows of one task_id"""
    print(_duplicate_ids(tmp_path, 1_000_000))


def test_train_split_and_csv(tmp_path: Path) -> None:
    """train: a split 'banana'; a CSV list column without separators"""
    import pandas as pd

    r, t = _train_files(tmp_path)
    rows = [json.loads(x) for x in t.read_text().splitlines()]
    rows[4]["split"] = "banana"
    t.write_text("".join(json.dumps(x) + "\n" for x in rows))
    one_line(*_train(tmp_path, r, t), "row 5", "'banana'", "train, validation, test")
    r2, t2 = _train_files(tmp_path)
    df = pd.read_json(r2, lines=True)
    df["agent_order"] = "['frontier_a' 'frontier_b']"  # numpy's print form: no comma
    df.to_csv(tmp_path / "rewards.csv", index=False)
    one_line(*_train(tmp_path, tmp_path / "rewards.csv", t2), "agent_order", "without commas")
    print("both one line naming file, row and field")


def test_task_pool_duplicate_prompts() -> None:
    """tasks: one question under two ids lands in two splits"""
    import pandas as pd

    from pipeline.tasks.task_pool import TaskPoolConfig, build_task_pool, cross_split_duplicates

    n = 300
    tasks = pd.DataFrame({
        "task_id": [f"src/test/{i:06d}" for i in range(n)], "source": "src",
        "prompt": [f"What is {i % 100} + 1?" for i in range(n)],  # every question three times
        "gold": "1", "grader": "integer", "domain": ["math", "knowledge", "reasoning"] * (n // 3),
        "difficulty": ["easy", "medium", "hard"] * (n // 3), "category": "c"})
    cfg = TaskPoolConfig(size=90, balance="category", stratify_column="category")
    pool = build_task_pool(tasks, cfg)
    leak = cross_split_duplicates(pool)
    assert leak.empty, f"{len(leak)} tasks share a prompt across splits"
    assert pool["prompt"].is_unique
    from assets.tasks import task_pool_no_cross_split_prompts

    spec = next(iter(task_pool_no_cross_split_prompts.check_specs))
    assert spec.blocking
    print(f"{n} rows of 100 questions -> pool of {len(pool)} distinct prompts; blocking check {spec.name}")


def test_call_log_garbage(tmp_path: Path) -> None:
    """call log: a garbage line in the middle; --quarantine-bad-log-lines"""
    from pipeline.collect.call_log import CallLog

    d = tmp_path / "calls"
    with CallLog(d) as log:
        for i in range(5):
            log.append({"call_key": f"a|t{i}|0|h", "agent": "a", "status": "ok", "task_id": f"t{i}"})
    f = d / "a.jsonl"
    lines = f.read_text().splitlines(keepends=True)
    f.write_text("".join(lines[:2]) + "garbage {{{ not json\n" + "".join(lines[2:]))
    msg = refused(lambda: CallLog(d).keys(), f"{f}:3", "--quarantine-bad-log-lines")
    assert CallLog(d, quarantine=True).keys() == {f"a|t{i}|0|h" for i in range(5)}
    assert "garbage" in (d / "a.jsonl.quarantine").read_text() and CallLog(d).read().shape[0] == 5
    with CallLog(d, quarantine=True) as log:  # the writer appends to the rewritten file
        log.keys()
        log.append({"call_key": "a|t9|0|h", "agent": "a", "status": "ok", "task_id": "t9"})
    assert len(CallLog(d).keys()) == 6
    print(f"one line naming {f.name}:3 ({len(msg)} chars); quarantined on request, the writer goes on")


def test_prices_not_numbers(tmp_path: Path) -> None:
    """config: a price table (or an agent) with a negative, .nan or .inf price -> forecast and run: one line naming file
    and field, exit 2"""
    import yaml

    cfg = tmp_path / "config"
    shutil.copytree(REPO / "config", cfg)
    prices, agents = (cfg / "prices.yaml").read_text(), (cfg / "agents.yaml").read_text()
    model = "gpt-4o-2024-08-06"  # an agent of the demo pool
    assert f"  {model}:\n    {{input: 2.50, output: 10.00," in prices
    pool = yaml.safe_load(agents)
    first = pool["pools"]["demo"]["agents"][0]
    cases = []
    for bad in ("-2.5", ".nan", ".inf"):
        cases.append(("prices.yaml", f"models.{model}.input", lambda bad=bad: (cfg / "prices.yaml").write_text(
            prices.replace("{input: 2.50, output: 10.00,", f"{{input: {bad}, output: 10.00,", 1))))
    cases.append(("agents.yaml", "price_out_per_mtok", lambda: (cfg / "agents.yaml").write_text(yaml.safe_dump(
        {**pool, "pools": {**pool["pools"], "demo": {**pool["pools"]["demo"], "agents": [
            {**first, "price_in_per_mtok": 1.0, "price_out_per_mtok": float("inf")},
            *pool["pools"]["demo"]["agents"][1:]]}}}))))
    with env(ROUTER_LITE_CONFIG=str(cfg), ROUTER_LITE_HOME=str(tmp_path / "home")):
        for n, (file, field, write) in enumerate(cases):
            (cfg / "prices.yaml").write_text(prices)
            (cfg / "agents.yaml").write_text(agents)
            write()
            err = one_line(*cli("forecast", "--profile", "demo"), file, field)
            if n:
                continue  # `run` (Dagster) once: it loads the agents as forecast does
            rc, out = cli("run", "--profile", "demo", "--upto", "task_pool")  # progress lines, then one error
            errors = [ln for ln in out.splitlines() if ln.startswith("router-lite: error:")]
            assert rc == 2 and len(errors) == 1 and file in errors[0] and field in errors[0], (rc, out[-400:])
            assert "Traceback" not in out, out[-400:]
    print(err[:160])
