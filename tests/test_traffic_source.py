"""Served traffic as a source (pipeline/collect/traffic*.py, assets/traffic.py): logs written by hand in the writer's
format (docs/tasks.md, "Traffic as a source") from real recorded replies of the replay pool (ZeroEval for the demo
pool, AlpacaEval for the chat pool), read, graded, materialised, sensed and turned into reward rows."""
import hashlib
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from dagster import AssetSpec, SkipReason, build_sensor_context, materialize

from assets.definitions import pool_resource
from assets.partitions import traffic_partitions
from assets.traffic import traffic_asset, traffic_rewards, traffic_sensor
from pipeline.collect.agents import load_agents
from pipeline.collect.grading import grade
from pipeline.collect.rewards import REWARD_COLUMNS
from pipeline.collect.traffic import (
    TrafficJudge,
    TrafficSettings,
    due_days,
    split_of,
    traffic_reward_rows,
    traffic_rows,
    traffic_tasks,
    with_traffic,
)
from pipeline.collect.traffic_log import read_day
from pipeline.core.prompts import routed_text
from pipeline.profile import load_profile
from resources.pool import default_agents_file
from resources.profile import ProfileResource
from resources.storage import ParquetIOManager, StorageResource, asset_path
from resources.traffic import day_files, traffic_day_dir

REPO = Path(__file__).resolve().parents[1]
DAY = "2026-11-30"
DEMO = ["frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"]
SPLIT = {"train": 0.6, "validation": 0.2, "test": 0.2}


# --- the fixture helper: log lines as `router-lite serve` writes them -------------------------------------------------
def _call(agent: str, model: str, reply: str | None, error: str | None = None) -> dict:
    return {"agent": agent, "model": model, "reply": reply, "cost_usd": None if reply is None else 1e-4,
            "latency_ms": 12.5, "finish_reason": None if error else "stop", "error": error}


def request_line(rid: str, prompt: str, replies: dict[str, tuple[str, str | None]], asked: list[str], pool: list[str],
                 fmt: str | None, day: str = DAY, explore: bool = True) -> dict:
    messages = [{"role": "user", "content": prompt}]
    return {"v": 1, "record": "request", "request_id": rid, "ts": f"{day}T12:00:00.000Z", "day": day,
            "router": "cascade-test", "target": "quality>=0.98", "pool": pool,
            "agent_models": {a: replies[a][0] for a in pool}, "routed_text": routed_text([prompt]),
            "messages": messages,
            "conversation_hash": hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False)
                                                .encode()).hexdigest(),
            "decision": {"agent": asked[-1], "policy": "cascade", "ood": False, "format": fmt},
            "calls": [_call(a, *replies[a]) for a in asked], "explore": explore, "key_name": "ci"}


def exploration_line(rid: str, replies: dict[str, tuple[str, str | None]], agents: list[str], pool_done: bool,
                     day: str = DAY) -> dict:
    return {"v": 1, "record": "exploration", "request_id": rid, "ts": f"{day}T12:00:01.000Z", "day": day,
            "calls": [_call(a, *replies[a]) for a in agents], "complete": pool_done, "usd": 4e-4}


def write_log(home: Path, day: str, lines: list[dict], name: str = "101.jsonl", torn: str | None = None) -> Path:
    path = traffic_day_dir(home, day) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines) + (torn or "")
    with path.open("a", encoding="utf-8") as f:
        f.write(text)
    return path


# --- real records -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def zeroeval():
    """GSM8K questions with every demo agent's recorded reply: {qid: (prompt, gold, {agent: (model, reply)})}."""
    tasks = pd.read_parquet(REPO / "data/sources/zeroeval/tasks.parquet")
    tasks = tasks[tasks["task"] == "gsm"].iloc[1200:1260]  # the end of GSM8K test
    rec = pd.read_parquet(REPO / "data/replay/zeroeval_outputs.parquet")
    models = {a.name: a.model for a in load_agents(default_agents_file(), "demo")}
    rec = rec[rec["question_id"].isin(tasks["qid"]) & rec["model"].isin(models.values())]
    by = {(q, m): t for q, m, t in zip(rec["question_id"], rec["model"], rec["text"])}
    return {q: (p, g.lstrip("#").strip().replace(",", ""), {a: (m, by[(q, m)]) for a, m in models.items()})
            for q, p, g in zip(tasks["qid"], tasks["prompt"], tasks["gold"])}


@pytest.fixture(scope="module")
def demo_agents():
    return load_agents(default_agents_file(), "demo")


def _rid(i: int) -> str:
    return uuid.UUID(int=i + 1).hex


def _day_lines(zeroeval, n: int, explored: int) -> list[dict]:
    """n GSM8K requests: the cascade asked open_cheap_reasoning then frontier_a; the first `explored` explored."""
    lines = []
    for i, (_, (prompt, _, replies)) in enumerate(list(zeroeval.items())[:n]):
        lines.append(request_line(_rid(i), prompt, replies, ["open_cheap_reasoning", "frontier_a"], DEMO, "integer"))
        if i < explored:
            lines.append(exploration_line(_rid(i), replies, ["frontier_b", "frontier_c", "open_mid"], True))
    return lines


# --- reading --------------------------------------------------------------------------------------------------------
def test_rows_from_a_log_torn_line_unexplored_and_explored(tmp_path, zeroeval, demo_agents):
    (p0, _, r0), (p1, _, r1), (p2, _, r2) = list(zeroeval.values())[:3]
    lines = [request_line(_rid(0), p0, r0, ["frontier_a"], DEMO, "integer"),  # no exploration line: not explored
             request_line(_rid(1), p1, r1, ["open_mid", "frontier_a"], DEMO, "integer"),
             exploration_line(_rid(1), r1, ["frontier_b", "frontier_c", "open_cheap_reasoning"], True),
             request_line(_rid(2), p2, r2, ["open_mid"], DEMO, "integer")]
    write_log(tmp_path, DAY, lines[:3], "101.jsonl", torn='{"v": 1, "record": "request", "request_')
    write_log(tmp_path, DAY, lines[3:], "202.jsonl")
    write_log(tmp_path, DAY, [exploration_line(_rid(2), r2, ["frontier_a", "frontier_b"], False)], "202.jsonl")
    log = read_day(day_files(tmp_path, DAY))
    assert log.torn == 1 and log.unreadable == [] and log.lines == 5
    explored = {r.request_id: r.explored for r in log.requests}
    assert explored == {_rid(0): False, _rid(1): True, _rid(2): False}  # an incomplete exploration stays partial
    rows = traffic_rows(log.requests, DAY, demo_agents, TrafficSettings(), SPLIT)
    tasks = rows.drop_duplicates("task_id").set_index("request_id")
    assert tasks.loc[_rid(0), "task_id"] == f"traffic/{DAY}/{_rid(0)}"
    assert tasks.loc[_rid(0), "source"] == "traffic" and tasks.loc[_rid(0), "prompt"] == p0
    assert tasks.loc[_rid(0), "user_text"] == routed_text([p0]) != p0  # the routed text, the template removed
    assert rows.groupby("request_id").size().to_dict() == {_rid(0): 1, _rid(1): 5, _rid(2): 3}
    assert rows.loc[rows["request_id"] == _rid(1), "asked_by"].tolist() == ["decision"] * 2 + ["exploration"] * 3


def test_a_broken_line_is_skipped_and_named(tmp_path, zeroeval):
    prompt, _, replies = next(iter(zeroeval.values()))
    good = request_line(_rid(0), prompt, replies, ["frontier_a"], DEMO, "integer")
    bad = {**good, "request_id": _rid(9), "v": 2}
    path = write_log(tmp_path, DAY, [good, bad])
    with path.open("a") as f:
        f.write("not json\n")
    log = read_day(day_files(tmp_path, DAY))
    assert [r.request_id for r in log.requests] == [_rid(0)] and log.torn == 0
    assert len(log.unreadable) == 2 and log.unreadable[0].startswith("101.jsonl:2:")


# --- grading --------------------------------------------------------------------------------------------------------
def test_agreement_of_the_strongest_grades_like_the_gold(zeroeval, demo_agents, tmp_path):
    write_log(tmp_path, DAY, _day_lines(zeroeval, 40, 40))
    rows = traffic_rows(read_day(day_files(tmp_path, DAY)).requests, DAY, demo_agents, TrafficSettings(), SPLIT)
    graded = rows[rows["grade_state"] == "graded"]
    assert graded["task_id"].nunique() >= 35  # the three frontier agents agree on most GSM8K questions
    assert set(graded["reference_by"].str.split(",").explode()) <= {"frontier_a", "frontier_b", "frontier_c"}
    # where the agreed reference is the gold answer, every grade equals the grade against the gold
    gold = {f"traffic/{DAY}/{_rid(i)}": g for i, (_, g, _) in enumerate(zeroeval.values())}
    same = 0
    for r in graded.itertuples():
        if grade(str(r.reference), gold[r.task_id], "integer")[1]:
            assert bool(r.correct) == grade(r.response_text, gold[r.task_id], "integer")[1], r.task_id
            same += 1
    assert same >= 0.9 * len(graded)
    assert graded["reward"].isin([0.0, 1.0]).all() and not graded["reward"].isna().any()


def test_no_reference_and_no_judge_is_ungraded_with_its_reason(zeroeval, demo_agents, tmp_path):
    (p0, _, r0), (p1, _, r1), (p2, _, r2) = list(zeroeval.values())[:3]
    write_log(tmp_path, DAY, [request_line(_rid(0), p0, r0, ["open_mid"], DEMO, None),  # format unknown
                              request_line(_rid(1), p1, r1, ["open_mid", "frontier_a"], DEMO, "integer"),
                              request_line(_rid(2), p2, r2, ["open_mid"], DEMO, None),  # a prompt router's: none
                              exploration_line(_rid(2), r2, DEMO[:3] + DEMO[4:], True)])
    rows = traffic_rows(read_day(day_files(tmp_path, DAY)).requests, DAY, demo_agents, TrafficSettings(), SPLIT)
    assert (rows["grade_state"] == "ungraded").all() and rows["reward"].isna().all() and rows["correct"].isna().all()
    reasons = rows.groupby("request_id")["grade_reason"].agg(set)
    assert len(reasons[_rid(0)]) == 1 and len(reasons[_rid(1)]) == 1 and len(reasons[_rid(2)]) == 1
    (why0,), (why1,) = reasons[_rid(0)], reasons[_rid(1)]
    assert "answer format unknown" in why0 and "no judge" in why0
    assert why1.startswith("no reference: 1 of the strongest (frontier_a, frontier_b, frontier_c) gave an answer")
    assert traffic_reward_rows(rows, DEMO).empty  # ungraded rows are never rewards
    # a deployment that serves one answer format says so: a request without a format is graded by it
    told = traffic_rows(read_day(day_files(tmp_path, DAY)).requests, DAY, demo_agents,
                        TrafficSettings(format="integer"), SPLIT)
    assert told.loc[told["request_id"] == _rid(0), "grade_reason"].str.startswith("no reference: 0 of the").all()
    assert (told.loc[told["request_id"] == _rid(2), "grade_state"] == "graded").all()
    with pytest.raises(Exception, match="traffic.format 'essay' is no answer format"):
        TrafficSettings(format="essay")


def test_open_ended_traffic_is_judged_by_the_profiles_judge(tmp_path):
    """AlpacaEval instructions through the chat profile's judge (the replay serves the recorded GPT-4-turbo
    judgments): each judged reward is the recorded preference, the reference agent's own reply a tie."""
    chat = load_profile("chat")
    agents = load_agents(default_agents_file(), "chat")
    names, models = [a.name for a in agents], {a.name: a.model for a in agents}
    rec = pd.read_parquet(REPO / "data/alpaca_eval/records.parquet")
    rec = rec[rec["dataset"] == "koala"]  # a source the chat router may be trained without
    ids = sorted(rec["instruction_id"].unique())[:4]
    lines, want = [], {}
    for i, iid in enumerate(ids):
        r = rec[rec["instruction_id"] == iid].set_index("model")
        replies = {a: (m, r.loc[m, "output"]) for a, m in models.items()}
        lines.append(request_line(_rid(i), r["instruction"].iloc[0], replies, ["fusechat_3b"], names, "open"))
        lines.append(exploration_line(_rid(i), replies, [a for a in names if a != "fusechat_3b"], True))
        want.update({(_rid(i), a): r.loc[m, "preference"] for a, m in models.items()})
    write_log(tmp_path, DAY, lines)
    from pipeline.collect.traffic import pool_judge

    pool = pool_resource(chat)
    judge = pool_judge(pool.client_for, agents, chat.collection.judge, chat.collection)
    rows = traffic_rows(read_day(day_files(tmp_path, DAY)).requests, DAY, agents, chat.traffic, SPLIT, judging=judge)
    assert (rows["grade_state"] == "judged").all(), rows["grade_reason"].unique()
    for r in rows.itertuples():
        expected = 0.5 if r.agent == chat.collection.judge.reference else want[(r.request_id, r.agent)]
        assert r.reward == pytest.approx(expected, abs=1e-6), (r.request_id, r.agent)
    rewards = traffic_reward_rows(rows, names)
    assert len(rewards) == 4 and (rewards["source"] == "traffic").all()
    # the open day is read again as it grows: a reply judged before keeps its grade, the judge is not asked again
    asked = []
    counting = TrafficJudge(lambda items: asked.extend(items) or judge.judge(items), judge.reference)
    again = traffic_rows(read_day(day_files(tmp_path, DAY)).requests, DAY, agents, chat.traffic, SPLIT,
                         judging=counting, prior=rows)
    assert asked == [] and again["reward"].tolist() == rows["reward"].tolist()


def test_split_is_seeded_and_a_conversation_sent_again_keeps_its_split(tmp_path, zeroeval, demo_agents):
    """The split is a seeded draw from the conversation hash: the profile's fractions, and the same prompt sent in 40
    requests lands in one split (a held-out prompt sent again is never trained on)."""
    keys = [_rid(i) for i in range(3000)]
    splits = pd.Series([split_of(k, SPLIT) for k in keys]).value_counts(normalize=True)
    assert abs(splits["train"] - 0.6) < 0.03 and abs(splits["test"] - 0.2) < 0.03
    assert [split_of(k, SPLIT, seed=1) for k in keys[:50]] != [split_of(k, SPLIT) for k in keys[:50]]
    prompts = list(zeroeval.values())[:2]
    lines = [request_line(_rid(i), prompts[i % 2][0], prompts[i % 2][2], ["frontier_a"], DEMO, "integer")
             for i in range(40)]
    write_log(tmp_path, DAY, lines)
    rows = traffic_rows(read_day(day_files(tmp_path, DAY)).requests, DAY, demo_agents, TrafficSettings(), SPLIT)
    assert rows.groupby("conversation_hash")["split"].nunique().tolist() == [1, 1]
    assert rows["request_id"].nunique() == 40


# --- reward rows ------------------------------------------------------------------------------------------------------
def test_reward_rows_only_from_explored_graded_requests(zeroeval, demo_agents, tmp_path):
    write_log(tmp_path, DAY, _day_lines(zeroeval, 12, 8))
    rows = traffic_rows(read_day(day_files(tmp_path, DAY)).requests, DAY, demo_agents, TrafficSettings(), SPLIT)
    rewards = traffic_reward_rows(rows, DEMO)
    graded_explored = {t for t, d in rows.groupby("task_id") if d["explored"].iloc[0]
                       and (d["grade_state"] == "graded").all()}
    assert set(rewards["task_id"]) == graded_explored and len(graded_explored) >= 6
    assert list(rewards.columns) == [*REWARD_COLUMNS, "source", "split"]
    assert all(list(o) == DEMO for o in rewards["agent_order"])
    one = rewards.iloc[0]
    mine = rows[rows["task_id"] == one["task_id"]].set_index("agent")
    assert one["mean_reward"] == [float(mine.loc[a, "reward"]) for a in DEMO]
    tasks = traffic_tasks(rows).set_index("task_id")  # what a consumer embeds and splits on
    assert len(tasks) == 12 and tasks.loc[rewards["task_id"], "split"].tolist() == rewards["split"].tolist()
    assert tasks.loc[one["task_id"], "gold"] == mine["reference"].iloc[0] is not None


def test_reward_matrix_with_and_without_traffic(zeroeval, demo_agents, tmp_path):
    """A profile that records no traffic keeps its reward matrix as it is; with traffic, the traffic rows follow the
    benchmark rows as their own source."""
    matrix = pd.DataFrame([{"task_id": "zeroeval_gsm8k/test/000001", "agent_order": DEMO,
                            "mean_reward": [1.0, 1.0, 0.0, 0.0, 1.0], "best_agents": DEMO[:2] + [DEMO[4]],
                            "is_tie": True, "empty_count": [0] * 5, "error_count": [0] * 5, "mean_cost": [0.1] * 5,
                            "n_repetitions": 1, "cost_estimated": True}], columns=REWARD_COLUMNS)
    assert with_traffic(matrix, traffic_reward_rows(None, DEMO)) is matrix
    write_log(tmp_path, DAY, _day_lines(zeroeval, 6, 6))
    rows = traffic_rows(read_day(day_files(tmp_path, DAY)).requests, DAY, demo_agents, TrafficSettings(), SPLIT)
    both = with_traffic(matrix, traffic_reward_rows(rows, DEMO))
    assert both.iloc[:1].equals(matrix) and len(both) > 1
    assert both["task_id"].iloc[1:].str.startswith(f"traffic/{DAY}/").all()
    with pytest.raises(Exception, match="agent order"):
        with_traffic(matrix, traffic_reward_rows(rows, DEMO[::-1]))


# --- the lineage: partition asset, traffic_rewards, sensor ----------------------------------------------------------
def _resources(home: Path, profile: str = "demo") -> dict:
    return {"profile": ProfileResource(name=profile), "pool": pool_resource(profile),
            "storage": StorageResource(home=str(home), shared=str(home)),
            "io_manager": ParquetIOManager(home=str(home))}


def test_partition_and_traffic_rewards_materialise(zeroeval, tmp_path):
    home = tmp_path / "home"
    write_log(home, DAY, _day_lines(zeroeval, 10, 6), torn='{"v": 1')
    parts = traffic_partitions()
    day_asset = traffic_asset(parts)
    res = materialize([day_asset], partition_key=DAY, resources=_resources(home))
    assert res.success
    meta = res.asset_materializations_for_node("traffic")[0].metadata
    assert meta["requests"].value == 10 and meta["explored"].value == 6 and meta["torn_lines"].value == 1
    stored = pd.read_parquet(asset_path(home, "traffic", DAY))
    assert stored["task_id"].nunique() == 10 and set(stored["day"]) == {DAY}
    # the benchmark's reward matrix (as the lineage stored it): traffic_rewards reads the materialised days only
    matrix = pd.DataFrame([{"task_id": "x/test/000000", "agent_order": DEMO, "mean_reward": [1.0] * 5,
                            "best_agents": DEMO, "is_tie": True, "empty_count": [0] * 5, "error_count": [0] * 5,
                            "mean_cost": [0.0] * 5, "n_repetitions": 1, "cost_estimated": True}])
    p = asset_path(home, "reward_matrix")
    p.parent.mkdir(parents=True)
    matrix.to_parquet(p)
    res = materialize([day_asset, traffic_rewards, AssetSpec("reward_matrix")], selection=["traffic_rewards"],
                      resources=_resources(home))
    out = pd.read_parquet(asset_path(home, "traffic_rewards"))
    assert res.success and 1 <= len(out) <= 6 and (out["source"] == "traffic").all()
    assert set(out["task_id"]) <= set(stored.loc[stored["explored"], "task_id"])
    from resources.traffic import derived_files

    assert derived_files(home, DAY) == [asset_path(home, "traffic", DAY)]  # what deleting the day must delete too


def test_traffic_rewards_without_traffic_is_empty(tmp_path):
    home = tmp_path / "home"
    matrix = pd.DataFrame([{"task_id": "x/test/000000", "agent_order": DEMO, "mean_reward": [1.0] * 5}])
    p = asset_path(home, "reward_matrix")
    p.parent.mkdir(parents=True)
    matrix.to_parquet(p)
    res = materialize([traffic_asset(traffic_partitions()), traffic_rewards, AssetSpec("reward_matrix")],
                      selection=["traffic_rewards"], resources=_resources(home))
    assert res.success and pd.read_parquet(asset_path(home, "traffic_rewards")).empty
    assert not (home / "traffic").exists()


def test_sensor_decisions():
    today = "2026-12-05"
    # a closed day: requested; the same (day, size) again: not; late lines on it: requested again
    assert due_days({"2026-12-04": 30}, today, {}, 500) == [("2026-12-04", 30)]
    assert due_days({"2026-12-04": 30}, today, {"2026-12-04": 30}, 500) == []
    assert due_days({"2026-12-04": 31}, today, {"2026-12-04": 30}, 500) == [("2026-12-04", 31)]
    # the open day: nothing under the size, then each time it has grown by it
    assert due_days({today: 499}, today, {}, 500) == []
    assert due_days({today: 500}, today, {}, 500) == [(today, 500)]
    assert due_days({today: 900}, today, {today: 500}, 500) == []
    assert due_days({today: 1000}, today, {today: 500}, 500) == [(today, 1000)]


def test_sensor_evaluated_with_its_cursor(zeroeval, tmp_path):
    home = tmp_path / "home"
    today = datetime.now(UTC)
    yesterday = (today - timedelta(days=1)).strftime("%Y-%m-%d")
    write_log(home, yesterday, _day_lines(zeroeval, 3, 1))
    write_log(home, today.strftime("%Y-%m-%d"), _day_lines(zeroeval, 2, 0))  # 2 lines: under the size
    parts = traffic_partitions()
    _, sensor = traffic_sensor(load_profile("demo"), parts)
    storage = StorageResource(home=str(home))
    got = sensor(build_sensor_context(resources={"storage": storage}))
    assert [(r.partition_key, r.run_key) for r in got.run_requests] == [(yesterday, f"traffic:{yesterday}:4")]
    assert json.loads(got.cursor)["requested"] == {yesterday: 4}
    ctx = build_sensor_context(resources={"storage": storage}, cursor=got.cursor)
    again = sensor(ctx)  # the same (day, size): nothing
    assert isinstance(again, SkipReason) and "no traffic day due" in again.skip_message
    write_log(home, yesterday, [exploration_line(_rid(1), next(iter(zeroeval.values()))[2], ["frontier_b"], False,
                                                 day=yesterday)])  # a late line on the closed day
    late = sensor(build_sensor_context(resources={"storage": storage}, cursor=ctx.cursor))
    assert [r.run_key for r in late.run_requests] == [f"traffic:{yesterday}:5"]


def test_a_new_traffic_day_refreshes_traffic_rewards(tmp_path):
    """The refresh automation (assets/automation.py) requests `traffic_rewards` once after a traffic day is
    materialised, though most days of the calendar never are (no missing dependency holds it)."""
    from dagster import AssetMaterialization, DagsterInstance, Definitions, evaluate_automation_conditions

    from assets.automation import refresh_condition

    home = tmp_path / "home"
    write_log(home, DAY, [])
    day_asset = traffic_asset(traffic_partitions())
    rewards = traffic_rewards.map_asset_specs(lambda s: s.replace_attributes(automation_condition=refresh_condition()))
    defs = Definitions(assets=[day_asset, rewards, AssetSpec("reward_matrix")], resources=_resources(home))
    with DagsterInstance.ephemeral() as inst:
        inst.report_runless_asset_event(AssetMaterialization("reward_matrix"))
        first = evaluate_automation_conditions(defs=defs, instance=inst)
        idle = evaluate_automation_conditions(defs=defs, instance=inst, cursor=first.cursor)
        assert materialize([day_asset], partition_key=DAY, resources=_resources(home), instance=inst).success
        after = evaluate_automation_conditions(defs=defs, instance=inst, cursor=idle.cursor)
        once = evaluate_automation_conditions(defs=defs, instance=inst, cursor=after.cursor)
    assert (idle.total_requested, after.total_requested, once.total_requested) == (0, 1, 0)
