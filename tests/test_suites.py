"""Suites registry and profile builders (routerbench from the bundled data, own / mmlu-pro-outputs from a reward
matrix), final_query on real RouterBench rows, declared-only suites."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import RouterLiteError
from pipeline.report import suites as S

ARC_TEST_1 = (
    "A group of engineers wanted to know how different building designs would respond during an earthquake. "
    "They made several models of buildings and tested each for its ability to withstand earthquake conditions. "
    "Which will most likely result from testing different building designs?\n"
    "A) buildings will be made safer\nB) building materials will be cheaper\n"
    "C) building designs will look nicer\nD) buildings will be built faster"
)


@pytest.fixture(scope="module")
def routerbench() -> S.Profile:
    return S.build_suite("routerbench")


@pytest.fixture(scope="module")
def raw_rows() -> pd.DataFrame:
    return pd.read_parquet(S.data_dir() / S.ROUTERBENCH_FILE).set_index("sample_id", drop=False)


# ---------------------------------------------------------------------------------------------- routerbench
def test_routerbench_counts(routerbench):
    p = routerbench
    assert p.k == 11 and "gpt-4-1106-preview" in p.models
    assert p.meta["rows_raw"] == 3178
    assert p.meta["dropped_missing"] == 28
    assert p.meta["dropped_missing_by_split"] == {"test": 8, "train": 20}
    assert p.meta["rows_by_split"] == {"test": 945, "train": 2205}
    assert p.meta["rows_by_eval_split"] == {
        "arc-challenge/test": 437, "arc-challenge/train": 1019,
        "mbpp/test": 128, "mbpp/train": 299,
        "winogrande/test": 380, "winogrande/train": 887,
    }
    assert p.quality.shape == p.cost.shape == (3150, 11)
    assert set(np.unique(p.quality)) == {0.0, 1.0}
    assert (p.cost > 0).all()
    assert len(set(p.query_ids)) == p.n


def test_routerbench_values_match_source(routerbench):
    p = routerbench
    i = p.query_ids.index("arc-challenge.test.1")
    j = p.models.index("gpt-4-1106-preview")
    m = p.models.index("mistralai/mistral-7b-chat")
    assert p.split[i] == "test"
    assert p.quality[i, j] == 1.0 and p.cost[i, j] == pytest.approx(0.00519)
    assert p.quality[i, m] == 1.0 and p.cost[i, m] == pytest.approx(0.0001036)


def test_select_split(routerbench):
    test = routerbench.select("test")
    assert test.n == 945 and set(test.split) == {"test"}
    assert len(test.meta["per_query"]["eval_name"]) == 945
    assert test.quality.shape == (945, 11)


def test_final_query_arc_row(raw_rows, routerbench):
    row = raw_rows.loc["arc-challenge.test.1"]
    assert row["prompt"].count("Answer:\n") == 5  # 5 answered shots + the question's own "Answer:"
    assert S.final_query(row["prompt"], "arc-challenge") == ARC_TEST_1
    assert routerbench.query_text[routerbench.query_ids.index("arc-challenge.test.1")] == ARC_TEST_1
    # the list repr the source CSV stores gives the same query
    assert S.final_query(repr([row["prompt"]]), "arc-challenge") == ARC_TEST_1


def test_final_query_winogrande_and_mbpp_rows(raw_rows):
    wino = raw_rows.loc["winogrande.dev.339"]
    assert wino["prompt"].startswith("Please answer with the letter of the correct answer.")
    assert S.final_query(wino["prompt"], "winogrande") == (
        "Derrick really liked working in Human Resources and William wanted to work at the same company, and _ "
        "subsequently accepted a position.\nA) William\nB) Derrick"
    )
    mbpp = raw_rows.loc["mbpp.dev.316"]
    assert S.final_query(mbpp["prompt"], "mbpp") == mbpp["prompt"].strip()


def test_final_query_has_no_shared_prefix(routerbench):
    texts = pd.Series(routerbench.query_text)
    assert not texts.str.contains("Print only a single choice").any()
    assert not texts.str.contains("Answer:").any()
    assert not texts.str.startswith("Please answer").any()
    assert (texts.str.len() > 20).all()


def test_data_dir_override(tmp_path, monkeypatch):
    monkeypatch.setenv("ROUTER_LITE_DATA", str(tmp_path))
    assert S.data_dir() == tmp_path
    with pytest.raises(RouterLiteError, match="RouterBench data not found"):
        S.build_suite("routerbench")


def test_one_data_dir_for_every_stage(tmp_path, monkeypatch):
    """Task sources, replay recordings and suites read the bundled data through the one `pipeline.core.paths`."""
    from pipeline.collect import replay
    from pipeline.core import paths
    from pipeline.tasks import sources

    assert sources.data_dir is replay.data_dir is S.data_dir is paths.data_dir
    monkeypatch.setenv("ROUTER_LITE_DATA", "")  # set but empty: the repository's data/, as when unset
    assert paths.data_dir() == paths.REPO_DATA and (paths.REPO_DATA / "sources").is_dir()
    monkeypatch.setenv("ROUTER_LITE_DATA", str(tmp_path))
    assert replay.default_recordings_path() == tmp_path / replay.RECORDINGS


# ---------------------------------------------------------------------------------------------- registry
def test_registry_lists_kinds():
    suites = S.load_suites()
    assert {n: s.kind for n, s in suites.items()} == {
        "routerbench": "profile", "mmlu-pro-outputs": "profile", "zeroeval-outputs": "profile",
        "own": "profile",
        "chatbot-arena": "preference", "task-sources": "raw",
    }


def test_preference_suite_raises_clear_error():
    with pytest.raises(RouterLiteError, match="not converted until data exists") as info:
        S.build_suite("chatbot-arena")
    assert "chatbot-arena" in str(info.value)


def test_raw_suite_points_to_collection():
    with pytest.raises(RouterLiteError, match="task_pool"):
        S.build_suite("task-sources")


def test_unknown_suite_names_it_and_lists_known():
    with pytest.raises(RouterLiteError) as info:
        S.build_suite("no-such-suite")
    msg = str(info.value)
    assert "'no-such-suite'" in msg
    for known in ("routerbench", "mmlu-pro-outputs", "own", "chatbot-arena", "task-sources"):
        assert known in msg


# ---------------------------------------------------------------------------------------------- reward matrices
def _rewards() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "task_id": ["mmlu_pro/test/000001", "mmlu_pro/test/000002", "mmlu_pro/test/000003"],
            "agent_order": [["a", "b"], ["b", "a"], ["a", "b"]],
            "mean_reward": [[1.0, 0.0], [1.0, 2 / 3], [np.nan, 1.0]],
            "best_agents": [["a"], ["b"], ["b"]],
            "is_tie": [False, False, False],
            "mean_cost": [[0.001, 0.01], [0.02, 0.002], [0.001, 0.01]],
        }
    )


def test_own_suite_from_reward_matrix():
    tasks = pd.DataFrame(
        {"task_id": ["mmlu_pro/test/000001", "mmlu_pro/test/000002", "mmlu_pro/test/000003"],
         "prompt": ["q1", "q2", "q3"], "split": ["train", "test", "train"]}
    )
    p = S.build_suite("own", rewards=_rewards(), tasks=tasks)
    assert p.name == "own" and p.models == ["a", "b"]
    assert p.query_ids == ["mmlu_pro/test/000001", "mmlu_pro/test/000002"]
    assert p.meta["dropped_missing"] == 1
    np.testing.assert_allclose(p.quality, [[1.0, 0.0], [2 / 3, 1.0]])  # row 2 reordered to agent a, b
    np.testing.assert_allclose(p.cost, [[0.001, 0.01], [0.002, 0.02]])
    assert p.query_text == ["q1", "q2"] and p.split.tolist() == ["train", "test"]


def test_own_suite_without_tasks_uses_stable_hash_split():
    a = S.build_own(_rewards())
    b = S.build_own(_rewards())
    assert a.split.tolist() == b.split.tolist()
    assert set(a.split) <= {"train", "test"} and a.meta["query_text"] == "absent"


@pytest.mark.parametrize("suite", ["mmlu-pro-outputs", "zeroeval-outputs"])
def test_recorded_matrix_suites_use_prices(suite):
    p = S.build_suite(suite, rewards=_rewards(), prices={"a": 0.004, "b": 0.0005})
    np.testing.assert_allclose(p.cost, [[0.004, 0.0005]] * 2)
    assert p.name == suite
    with pytest.raises(RouterLiteError, match=r"prices lack agents \['b'\]"):
        S.build_suite(suite, rewards=_rewards(), prices={"a": 0.004})


def test_reward_matrix_errors_name_the_input():
    bad = _rewards()
    bad.at[1, "agent_order"] = ["a", "c"]
    with pytest.raises(RouterLiteError, match="mmlu_pro/test/000002"):
        S.build_own(bad)
    with pytest.raises(RouterLiteError, match="mean_reward"):
        S.build_own(_rewards().drop(columns=["mean_reward"]))
