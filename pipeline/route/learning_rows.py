"""What the routers learn from and are judged on: the benchmark's rows and, where a deployment recorded and explored
traffic, the served traffic's (their own source `traffic`: pipeline/collect/traffic.py).

Explored, graded traffic requests of the train and validation splits join the training rows, so the head, the kNN,
the cost scorer and the OOD guard learn this deployment's prompts (a topic the benchmarks lack stops tripping the
guard once it is traffic). Traffic test rows are never trained on: the promotion gate judges candidates on them
(pipeline/report/promotion_traffic.py). The held-out figures stay the benchmark's test rows. Without traffic the rows
are the benchmark's, unchanged (the same objects)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

TRAFFIC = "traffic"  # the source, and the label the traffic rows carry where a benchmark row has its category
LEARNED_SPLITS = ("train", "validation")
HELD_OUT_SPLITS = ("test",)


def routed_traffic_columns() -> list[str]:
    return ["task_id", "split", "grader", "agent_order", "answers", "embedding"]


def routed_traffic(calls: pd.DataFrame, agents: list[str], embed: Callable[[list[str]], np.ndarray]) -> pd.DataFrame:
    """One row per traffic task of `calls` (the `traffic` partitions' rows: one per call): its split, grader, each of
    `agents`' extracted answer (None where it gave none) and the embedding of the text serve embedded (`user_text`)."""
    tasks = calls.drop_duplicates("task_id").reset_index(drop=True)
    by_call = {(t, a): x for t, a, x in zip(calls["task_id"], calls["agent"], calls["extracted"])}
    answers = [[by_call.get((t, a)) for a in agents] for t in tasks["task_id"]]
    X = embed(tasks["user_text"].astype(str).tolist())
    return pd.DataFrame({"task_id": tasks["task_id"], "split": tasks["split"], "grader": tasks["grader"],
                         "agent_order": [list(agents)] * len(tasks), "answers": answers, "embedding": list(X)})


def learning_rows(reward_matrix: pd.DataFrame, prompt_embeddings: pd.DataFrame, task_pool: pd.DataFrame,
                  traffic_rewards: pd.DataFrame | None = None, traffic_tasks: pd.DataFrame | None = None,
                  splits: tuple[str, ...] = LEARNED_SPLITS) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(reward rows, tasks, embeddings): the benchmark's, plus the traffic rows of `splits` that have a routed task
    (`routed_traffic`), in the reward matrix's columns and agent order (traffic of another pool is left out)."""
    rows = _traffic_rows(reward_matrix, traffic_rewards, traffic_tasks, splits)
    if rows is None:
        return reward_matrix, task_pool, prompt_embeddings
    routed = traffic_tasks.set_index("task_id").loc[rows["task_id"]].reset_index()
    tasks = pd.DataFrame({"task_id": routed["task_id"], "split": routed["split"], "ood": False, "source": TRAFFIC,
                          "domain": TRAFFIC, "category": TRAFFIC, "grader": routed["grader"]})
    tasks = tasks[[c for c in tasks.columns if c in task_pool.columns or c in ("task_id", "split", "ood", "grader")]]
    cols = [c for c in reward_matrix.columns if c in rows.columns]
    return (pd.concat([reward_matrix, rows[cols].assign(source=TRAFFIC)], ignore_index=True),
            pd.concat([task_pool, tasks], ignore_index=True),
            pd.concat([prompt_embeddings, routed[["task_id", "embedding"]]], ignore_index=True))


def traffic_answers(agent_answers: pd.DataFrame, traffic_tasks: pd.DataFrame | None) -> pd.DataFrame:
    """The agents' extracted answers of the benchmark's tasks and of the routed traffic's (a cascade compares them)."""
    if traffic_tasks is None or not len(traffic_tasks):
        return agent_answers
    return pd.concat([agent_answers, traffic_tasks[["task_id", "agent_order", "answers"]]], ignore_index=True)


def _traffic_rows(reward_matrix, traffic_rewards, traffic_tasks, splits) -> pd.DataFrame | None:
    if traffic_rewards is None or traffic_tasks is None or not len(traffic_rewards) or not len(traffic_tasks):
        return None
    keep = (traffic_rewards["split"].isin(splits) & traffic_rewards["task_id"].isin(traffic_tasks["task_id"])
            & ~traffic_rewards["task_id"].isin(reward_matrix["task_id"]))
    rows = traffic_rewards[keep]
    if not len(rows):
        return None
    if len(reward_matrix) and list(rows["agent_order"].iloc[0]) != list(reward_matrix["agent_order"].iloc[0]):
        return None  # another pool's traffic: not this matrix's rows
    return rows
