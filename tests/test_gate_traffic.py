"""The promotion gate judges on traffic: beside the benchmark rows (every other source), the
held-out rows of the task pool's source `traffic` where every agent replied (explored requests) pair the candidate
with the promoted router; worse or dearer there beyond noise refuses it even when the benchmark rows pass it; fewer
than MIN_TRAFFIC rows do not block. Pure functions on constructed evidence first, then the lineage's decide() and
`router-lite promote` on registered small heads, and the asset's held-out rows read off a reward matrix."""
import json

import numpy as np
import pandas as pd
import pytest
from _support import promote_the_other_router

from cli.main import main
from pipeline.report.gate_rows import TRAFFIC, benchmark_part
from pipeline.report.promotion import evidence_rows, gate, verdict_lines
from pipeline.report.promotion_traffic import MIN_TRAFFIC
from pipeline.route import registry

AGENTS = ["a", "b", "c"]


def _ev(name, ids, sources, reward, cost, replied=None, best_reward=None):
    """Evidence as pipeline.report.promotion.evidence stores it, from constructed per-row outcomes."""
    n = len(ids)
    best = np.full(n, 0.8) if best_reward is None else best_reward
    return {"name": name, "router": "head", "target": "max-quality", "agents": AGENTS, "task_ids": list(ids),
            "source": list(sources), "replied": [True] * n if replied is None else [bool(x) for x in replied],
            "reward": [float(x) for x in reward], "cost": [float(x) for x in cost], "best_single": "a",
            "best_reward": [float(x) for x in best], "best_cost": [2e-3] * n}


def _pair(n_bench=300, n_traffic=100, traffic_loss=0.4, seed=0, cost=1e-3, traffic_cost=1e-3,
          cand_unreplied=(), inc_unreplied=()):
    """(candidate, promoted) evidence on the same rows: n_bench benchmark rows (gsm8k) where the candidate answers
    right every task the promoted router did and half of the others (better), then n_traffic traffic rows where it
    loses each task the promoted router answered right with chance `traffic_loss`; `*_unreplied`: traffic rows
    (positions among them) where an agent of that router's pool did not reply."""
    rng = np.random.default_rng(seed)
    ids = [f"gsm8k/{i}" for i in range(n_bench)] + [f"traffic/2026-12-0{1 + i % 5}/{i}" for i in range(n_traffic)]
    src = ["gsm8k"] * n_bench + [TRAFFIC] * n_traffic
    inc_b = (rng.random(n_bench) < 0.7).astype(float)
    cand_b = np.maximum(inc_b, (rng.random(n_bench) < 0.5).astype(float))
    inc_t = (rng.random(n_traffic) < 0.8).astype(float)
    cand_t = inc_t * (rng.random(n_traffic) >= traffic_loss)
    replied_c, replied_i = np.ones(n_bench + n_traffic, bool), np.ones(n_bench + n_traffic, bool)
    replied_c[[n_bench + i for i in cand_unreplied]] = False
    replied_i[[n_bench + i for i in inc_unreplied]] = False
    c_cost = np.r_[np.full(n_bench, cost), np.full(n_traffic, traffic_cost)]
    cand = _ev("cand", ids, src, np.r_[cand_b, cand_t], c_cost, replied_c)
    inc = _ev("served", ids, src, np.r_[inc_b, inc_t], np.full(n_bench + n_traffic, cost), replied_i)
    return cand, inc


SERVED = {"name": "served", "target": "max-quality"}


def test_better_on_benchmarks_but_worse_on_traffic_is_refused_naming_traffic():
    cand, inc = _pair()
    v = gate(cand, inc, None, served=SERVED)
    assert v["passed"] is False and v["benchmark_passed"] is True and v["mode"] == "paired"
    t = v["traffic"]
    assert t["passed"] is False and t["n"] == 100 and t["quality_minus_promoted"]["high"] < 0
    assert "refused: worse in quality on traffic beyond noise" in t["reason"]
    assert "traffic rows: 100 held-out traffic rows" in v["reason"] and not v["dearer"]
    assert v["quality_minus_promoted"]["low"] > 0 and v["quality_minus_promoted"]["n"] == 300  # benchmark: better
    said = verdict_lines(v)
    assert said[0].startswith("gate: refuses cand") and said[1].startswith("  benchmark rows (paired): ")
    assert said[2].startswith("  traffic rows: 100 held-out traffic rows") and "worse in quality on traffic" in said[2]
    # the UI's table: one row per kind of evidence, the traffic row refusing with its CI
    table = {r["evidence"]: r for r in evidence_rows(v)}
    assert table["benchmark (paired)"]["says"] == "passes" and table["benchmark (paired)"]["rows"] == 300
    assert table["traffic"]["says"] == "refuses" and table["traffic"]["rows"] == 100
    assert table["traffic"]["quality Δ [95 % CI]"].startswith(f"{t['quality_minus_promoted']['gain']:+.4f} [")
    # the benchmark rows alone (what the gate judged before traffic) pass it: traffic is what refuses it
    assert gate(benchmark_part(cand), benchmark_part(inc), None, served=SERVED)["passed"] is True


def test_worse_on_traffic_within_noise_passes():
    cand, inc = _pair(traffic_loss=0.03, seed=1)
    v = gate(cand, inc, None, served=SERVED)
    t = v["traffic"]
    assert t["quality_minus_promoted"]["gain"] < 0 <= t["quality_minus_promoted"]["high"]  # worse, within noise
    assert v["passed"] is True and t["passed"] is True and "refused" not in v["reason"]


def test_dearer_on_traffic_beyond_noise_is_refused_by_the_gates_cost_rule():
    cand, inc = _pair(traffic_loss=0.0, traffic_cost=3e-3)
    v = gate(cand, inc, None, served=SERVED)
    assert v["passed"] is False and v["dearer"] and v["traffic"]["cost_per_1k_minus_promoted"]["low"] > 0
    assert "dearer on traffic beyond noise" in v["traffic"]["reason"]
    assert any("--force" in line for line in verdict_lines(v))


def test_too_few_traffic_rows_say_so_and_do_not_block():
    cand, inc = _pair(n_traffic=MIN_TRAFFIC - 10, traffic_loss=1.0)  # every traffic row it can lose, lost
    v = gate(cand, inc, None, served=SERVED)
    assert v["passed"] is True and v["traffic"]["passed"] is None and v["traffic"]["n"] == MIN_TRAFFIC - 10
    assert f"not enough traffic rows ({MIN_TRAFFIC - 10} < {MIN_TRAFFIC})" in v["traffic"]["reason"]
    assert "not blocking" in v["traffic"]["reason"]
    # a promoted router scored before any traffic was recorded: its evidence holds none of these rows
    cand, inc = _pair()
    old = benchmark_part(inc)
    v = gate(cand, old, None, served=SERVED)
    assert v["passed"] is True and v["traffic"]["passed"] is None and v["traffic"]["unscored"] == 100
    assert "not enough traffic rows (0 < 30)" in v["reason"] and "100 the promoted router was not scored on" in v[
        "reason"]


def test_traffic_rows_where_an_agent_did_not_reply_are_left_out_and_counted():
    cand, inc = _pair(traffic_loss=0.5, seed=2)  # loses half the traffic rows the promoted router answered right
    lost = [i for i in range(100) if cand["reward"][300 + i] < inc["reward"][300 + i]]
    assert len(lost) >= 30 and 100 - len(lost) >= MIN_TRAFFIC
    assert gate(cand, inc, None, served=SERVED)["passed"] is False
    # those rows were requests not explored: an agent one router can ask (either's pool) has no reply there
    cand, inc = _pair(traffic_loss=0.5, seed=2, cand_unreplied=lost[::2], inc_unreplied=lost[1::2])
    v = gate(cand, inc, None, served=SERVED)
    t = v["traffic"]
    assert t["n"] == 100 - len(lost) and t["left_out"] == len(lost) and t["passed"] is True and v["passed"]
    assert f"{100 - len(lost)} held-out traffic rows every agent replied to ({len(lost)} left out: an agent a " \
           "router can ask did not reply)" in t["reason"]
    assert set(t["task_ids"]).isdisjoint(cand["task_ids"][300 + i] for i in lost)


# ------------------------------------------------------------------------------------ the lineage's gate and the CLI
def _held_out(X, n_bench, n_traffic):
    from pipeline.report.promotion import HeldOut

    n = n_bench + n_traffic
    ids = [f"mmlu/{i}" for i in range(n_bench)] + [f"traffic/2026-12-05/{i}" for i in range(n_traffic)]
    return HeldOut(ids, X, np.zeros((n, 3)), np.full((n, 3), 1e-3), [[None] * 3] * n,
                   np.array(["integer"] * n, object), AGENTS, 0, None,
                   np.array(["mmlu"] * n_bench + [TRAFFIC] * n_traffic), np.ones(n, bool))


@pytest.fixture
def traffic_home(tmp_path, monkeypatch, register_small_head):
    """A home serving head `a` (promoted by the gate on benchmark rows, before traffic was recorded) and the run's
    candidate `b`, on held-out rows where b's picks are right on the benchmark rows and a's on the traffic rows."""
    from pipeline.profile import OVERRIDE_ENV
    from pipeline.report.promotion import evidence, held_out_outcome, rows_at
    from pipeline.route import pointer

    home = tmp_path / "home"
    root = home / "registry"
    a, b = register_small_head(root), register_small_head(root, seed=1)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 8)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    rows = _held_out(X, 200, 100)
    pa, _ = registry.load(a).route(X)
    pb, _ = registry.load(b).route(X)
    idx = np.arange(300)
    rows.U[idx[:200], pb[:200]] = 1.0  # the candidate's picks right on the benchmark rows
    rows.U[idx[200:], pa[200:]] = 1.0  # the served router's right on the traffic rows
    assert (pa[200:] != pb[200:]).sum() >= 40  # enough rows where they decide differently
    bench = rows_at(rows, idx[:200])
    reg_a = registry.load(a)
    ev_a = evidence(a.name, "head", "max-quality", bench, *held_out_outcome(reg_a, "max-quality", bench))
    pointer.promote(root, {"name": a.name, "path": str(a), "kind": "head", "target": "max-quality",
                           "evidence": pointer.save_evidence(root, ev_a)}, by="gate", reason="before traffic")
    reg_b = registry.load(b)
    ev_b = evidence(b.name, "head", "max-quality", rows, *held_out_outcome(reg_b, "max-quality", rows))
    override = tmp_path / "serve.yaml"
    override.write_text("serve: {target: max-quality}\n")  # the small heads have no operating points
    monkeypatch.setenv(OVERRIDE_ENV, str(override))
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    entry = {"name": b.name, "path": str(b), "kind": "head", "target": "max-quality"}
    return root, a, b, rows, entry, ev_b


def test_the_lineage_gate_scores_the_served_router_on_new_traffic_and_refuses(traffic_home, capsys):
    """decide() as the promotion asset calls it: the served router's stored evidence has no traffic row (it was
    promoted before); it is scored, as served, on the run's held-out traffic rows and stored back; the candidate,
    better on the benchmark rows, is refused on traffic; the pointer stays; `promote --check` prints both lines."""
    from cli.summary import promotion_lines
    from pipeline.report.promotion import decide
    from pipeline.route import pointer

    root, a, b, rows, entry, ev_b = traffic_home
    before = (root / "latest.json").read_text()
    action, v = decide(root, entry, ev_b, rows)
    assert action == "refused" and v["mode"] == "paired" and v["benchmark_passed"] is True
    assert v["traffic"]["n"] == 100 and v["traffic"]["passed"] is False and v["replaces"] == a.name
    assert (root / "latest.json").read_text() == before
    stored = json.loads((root / "evidence" / f"{a.name}.json").read_text())
    assert stored["source"].count(TRAFFIC) == 100 and len(stored["task_ids"]) == 300  # its traffic rows, kept
    line = pointer.history(root)[-1]
    assert line["action"] == "refused" and line["verdict"]["traffic"]["n"] == 100
    assert "worse in quality on traffic beyond noise" in line["reason"]
    said = promotion_lines({"action": "refused", "candidate": b.name, "served": a.name, "verdict": line["verdict"]})
    assert said[1].startswith("  gate, benchmark rows (paired): same held-out rows")  # what `router-lite run` prints
    assert said[2].startswith("  gate, traffic rows: 100 held-out traffic rows") and "on traffic beyond" in said[2]
    capsys.readouterr()
    assert main(["promote", b.name, "--check", "--profile", "smoke"]) == 1  # the same verdict, from the files
    out = capsys.readouterr().out
    assert f"gate: refuses {b.name} at max-quality (replacing {a.name})" in out
    assert "  benchmark rows (paired): same held-out rows" in out
    assert "  traffic rows: 100 held-out traffic rows every agent replied to: quality" in out
    assert "refused: worse in quality on traffic beyond noise" in out
    assert main(["promote", b.name, "--profile", "smoke"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"the gate refuses {b.name}" in err and "on traffic beyond noise" in err and "--force" in err
    assert (root / "latest.json").read_text() == before


def test_the_asset_reads_each_held_out_rows_source_and_whether_every_agent_replied():
    """assets/promotion.held_out on a reward matrix with traffic rows: their source from the task pool, and a row
    with an imputed cell (an agent the served decision did not ask, not explored) is not `replied`."""
    from assets.promotion import held_out
    from pipeline.collect.rewards import replied_rows

    n = 60
    ids = [f"mmlu/{i}" for i in range(40)] + [f"traffic/2026-12-05/{i}" for i in range(20)]
    split = ["train"] * 30 + ["test"] * 10 + ["train"] * 5 + ["test"] * 15
    rng = np.random.default_rng(0)
    imputed = [[False] * 3] * 40 + [[False, i % 3 == 0, False] for i in range(20)]
    rewards = pd.DataFrame({"task_id": ids, "agent_order": [AGENTS] * n,
                            "mean_reward": [list(rng.random(3).round(3)) for _ in range(n)],
                            "mean_cost": [[1e-3, 2e-3, 3e-3]] * n, "imputed": imputed})
    pool = pd.DataFrame({"task_id": ids, "split": split, "ood": False, "grader": "integer",
                         "source": ["mmlu"] * 40 + [TRAFFIC] * 20})
    emb = pd.DataFrame({"task_id": ids, "embedding": list(rng.normal(size=(n, 8)).astype(np.float32))})
    answers = pd.DataFrame({"task_id": ids, "agent_order": [AGENTS] * n, "answers": [["1", "2", "1"]] * n})
    rows = held_out(rewards, pool, emb, answers, 0)
    assert rows.task_ids == ids[30:40] + ids[45:]
    assert list(rows.sources) == ["mmlu"] * 10 + [TRAFFIC] * 15
    want = [True] * 10 + [i % 3 != 0 for i in range(5, 20)]
    assert list(rows.replied) == want and list(replied_rows(rewards)[[*range(30, 40), *range(45, 60)]]) == want
    # reward rows that carry their own source are read by it (the task pool's where they hold none)
    tagged = rewards.assign(source=[None] * 40 + [TRAFFIC] * 20)
    assert list(held_out(tagged, pool.assign(source="mmlu"), emb, answers, 0).sources) == ["mmlu"] * 10 + [TRAFFIC] * 15
    # a matrix without `imputed` was collected in full
    assert replied_rows(rewards.drop(columns=["imputed"])).all()


def test_the_promotion_asset_shows_the_traffic_rows_in_its_metadata(smoke_home_copy, monkeypatch, capsys):
    """The promotion asset on the smoke lineage with 40 held-out tasks relabelled as traffic (5 of them with an
    agent's cell imputed: not explored): the served router (another entry, promoted by hand with evidence from
    before traffic) is scored on them as served and its evidence stored back; the verdict and the metadata (the UI)
    show the benchmark and the traffic lines, the traffic rows compared and the 5 left out, and the table of both."""
    from dagster import materialize

    from assets.definitions import build_assets, build_resources
    from pipeline.route import pointer
    from resources.storage import asset_path

    home = smoke_home_copy()
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    root, candidate, other = promote_the_other_router(home)
    pool = pd.read_parquet(asset_path(home, "task_pool"))
    traffic = pool[(pool["split"] == "test") & ~pool["ood"].astype(bool)]["task_id"].head(40).tolist()
    pool.loc[pool["task_id"].isin(traffic), "source"] = TRAFFIC
    pool.to_parquet(asset_path(home, "task_pool"), index=False)
    rewards = pd.read_parquet(asset_path(home, "reward_matrix"))
    k = len(rewards["agent_order"].iloc[0])
    unexplored = set(traffic[:5])
    rewards["imputed"] = [[j == 1 and t in unexplored for j in range(k)] for t in rewards["task_id"]]
    rewards.to_parquet(asset_path(home, "reward_matrix"), index=False)
    result = materialize(build_assets("smoke"), selection=["promotion"],
                         resources=build_resources(str(home), profile="smoke"))
    assert result.success
    out = result.output_for_node("promotion")
    t = out["verdict"]["traffic"]
    assert t["n"] == 35 and t["left_out"] == 5 and t["unscored"] == 0 and t["passed"] in (True, False)
    meta = result.asset_materializations_for_node("promotion")[0].metadata
    assert meta["gate_traffic"].value.startswith("35 held-out traffic rows every agent replied to (5 left out: an "
                                                 "agent a router can ask did not reply): quality ")
    assert meta["gate_traffic_rows"].value == 35 and meta["gate_benchmark"].value == out["verdict"]["benchmark_reason"]
    table = meta["gate_evidence"].value
    assert "| traffic " in table and "| benchmark (" in table and "quality Δ [95 % CI]" in table
    assert sorted(meta["verdict"].value["traffic"]["task_ids"]) == sorted(set(traffic) - unexplored)
    stored = json.loads((root / "evidence" / f"{other}.json").read_text())
    assert stored["source"].count(TRAFFIC) == 40 and sum(not r for r in stored["replied"]) == 5
    line = pointer.history(root)[-1]
    assert line["by"] == "gate" and line["verdict"]["traffic"]["n"] == 35
