"""The router learns from the served traffic: explored, graded traffic rows of the train and validation splits join
the benchmark's training rows (pipeline/route/learning_rows.py); traffic test rows never do (the gate judges on them);
without traffic nothing changes."""
import numpy as np
import pandas as pd

from pipeline.route.fit import fit_router, reward_embeddings, training_split
from pipeline.route.learning_rows import HELD_OUT_SPLITS, learning_rows, routed_traffic, traffic_answers
from pipeline.route.train import TrainConfig

AGENTS = ["a", "b", "c"]


def _benchmark(n=450, d=8, seed=0):
    """Benchmark rows around one centre (x0 ~ +3): agent a right where x1 > 0, b elsewhere."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    X[:, 0] += 3
    R = np.stack([X[:, 1] > 0, X[:, 1] <= 0, np.zeros(n, bool)], axis=1).astype(float)
    ids = [f"bench/{i}" for i in range(n)]
    rewards = pd.DataFrame({"task_id": ids, "agent_order": [AGENTS] * n, "mean_reward": list(R),
                            "mean_cost": [np.array([1.0, 1.0, 0.1])] * n})
    tasks = pd.DataFrame({"task_id": ids, "split": np.array(["train", "validation", "test"])[np.arange(n) % 3],
                          "ood": False, "source": "bench", "category": "bench"})
    emb = pd.DataFrame({"task_id": ids, "embedding": list(X)})
    return rewards, tasks, emb


def _traffic(n=300, d=8, seed=1, order=AGENTS):
    """Traffic rows far from the benchmark (x0 ~ -3), where the cheap agent c is always right."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    X[:, 0] -= 3
    ids = [f"traffic/2026-12-05/r{i}" for i in range(n)]
    R = np.tile([0.0, 0.0, 1.0], (n, 1))
    rewards = pd.DataFrame({"task_id": ids, "agent_order": [list(order)] * n, "mean_reward": list(R),
                            "mean_cost": [np.array([1.0, 1.0, 0.1])] * n, "source": "traffic",
                            "split": np.array(["train", "validation", "test"])[np.arange(n) % 3]})
    routed = pd.DataFrame({"task_id": ids, "split": rewards["split"], "grader": "mcq_letter",
                           "agent_order": [list(order)] * n, "answers": [["A", "B", "C"]] * n, "embedding": list(X)})
    return rewards, routed


def test_without_traffic_the_rows_are_the_benchmarks_unchanged():
    rewards, tasks, emb = _benchmark()
    empty = _traffic()[0].iloc[:0]
    for tr, te in ((None, None), (empty, _traffic()[1])):
        r, t, e = learning_rows(rewards, emb, tasks, tr, te)
        assert r is rewards and t is tasks and e is emb


def test_traffic_train_and_validation_rows_join_and_test_rows_never_do():
    rewards, tasks, emb = _benchmark()
    tr, te = _traffic()
    te = te.iloc[1:]  # one request without an embedding: left out
    r, t, e = learning_rows(rewards, emb, tasks, tr, te)
    added = set(r["task_id"]) - set(rewards["task_id"])
    learned = tr[tr["split"].isin(["train", "validation"]) & tr["task_id"].isin(te["task_id"])]
    assert added == set(learned["task_id"]) and len(added) == 199
    assert not added & set(tr.loc[tr["split"] == "test", "task_id"])
    split = training_split(r, t)
    assert (split[r["task_id"].isin(added)].isin(["train", "validation"])).all()
    assert (split == "test").sum() == (tasks["split"] == "test").sum()  # held-out figures: the benchmark's
    assert reward_embeddings(e, r).shape == (len(r), 8)
    # another pool's traffic (another agent order) is not this matrix's rows
    other, _ = _traffic(order=["c", "b", "a"])
    assert learning_rows(rewards, emb, tasks, other, te)[0] is rewards


def test_the_guard_and_the_head_learn_the_traffic():
    """Before: the traffic's prompts trip the OOD guard (nothing like them in training) and go to the best single
    agent. After learning the traffic's train rows: the guard lets them through and the router picks the cheap agent
    that is right there."""
    rewards, tasks, emb = _benchmark()
    tr, te = _traffic()
    held = tr["split"] == "test"
    X_traffic_test = np.stack(te.loc[held.to_numpy(), "embedding"].to_numpy())
    cfg = TrainConfig(generations=10, log_every=0)

    def fit(r, t, e):
        return fit_router(reward_embeddings(e, r), r, training_split(r, t), cfg)

    before = fit(rewards, tasks, emb)
    after = fit(*learning_rows(rewards, emb, tasks, tr, te))
    assert before.guard.fire_rate(X_traffic_test) > 0.9
    assert after.guard.fire_rate(X_traffic_test) < 0.1
    assert (after.head.pick(X_traffic_test) == AGENTS.index("c")).mean() > 0.9  # the shipped router, unguarded


def test_the_held_out_traffic_rows_are_the_test_split_with_their_answers_and_source():
    """The promotion gate's rows: the benchmark's and the traffic's test rows, each traffic row carrying its source,
    its grader and every agent's extracted answer (a cascade decides on them as serve does)."""
    rewards, tasks, emb = _benchmark()
    tr, te = _traffic()
    r, t, e = learning_rows(rewards, emb, tasks, tr, te, splits=HELD_OUT_SPLITS)
    added = r[r["task_id"].str.startswith("traffic/")]
    assert len(added) == (tr["split"] == "test").sum() and (added["source"] == "traffic").all()
    assert (training_split(r, t).to_numpy()[r["task_id"].str.startswith("traffic/").to_numpy()] == "test").all()
    assert set(t.loc[t["task_id"].isin(added["task_id"]), "grader"]) == {"mcq_letter"}
    answers = traffic_answers(pd.DataFrame({"task_id": ["bench/0"], "agent_order": [AGENTS], "answers": [["A"] * 3]}),
                              te)
    assert len(answers) == 1 + len(te)


def test_routed_traffic_reads_each_agents_answer_and_embeds_the_served_text():
    calls = pd.DataFrame({"task_id": ["t1", "t1", "t2"], "agent": ["a", "c", "b"], "extracted": ["A", "C", None],
                          "split": ["train", "train", "test"], "grader": ["mcq_letter"] * 3,
                          "user_text": ["first", "first", "second"]})
    seen = []
    out = routed_traffic(calls, AGENTS, lambda texts: seen.extend(texts) or np.eye(len(texts), 4))
    assert seen == ["first", "second"]
    assert out["answers"].tolist() == [["A", None, "C"], [None, None, None]]
    assert out["split"].tolist() == ["train", "test"] and len(out["embedding"][0]) == 4
