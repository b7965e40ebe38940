"""What the prompt router learns from: the benchmark's rows and, where a deployment recorded and explored traffic,
the served traffic's (their own source `traffic`: pipeline/collect/traffic.py).

Explored, graded traffic requests of the train and validation splits join the training rows, so the head, the kNN,
the cost scorer and the OOD guard learn this deployment's prompts (a topic the benchmarks lack stops tripping the
guard once it is traffic). Traffic test rows are never trained on: the promotion gate judges candidates on them
(pipeline/report/promotion_gate.py). The held-out figures stay the benchmark's test rows. Without traffic the rows are
the benchmark's, unchanged."""
from __future__ import annotations

import pandas as pd

TRAFFIC = "traffic"  # the source, and the label the traffic rows carry wherever a benchmark row has its category
LEARNED_SPLITS = ("train", "validation")


def learning_rows(reward_matrix: pd.DataFrame, prompt_embeddings: pd.DataFrame, task_pool: pd.DataFrame,
                  traffic_rewards: pd.DataFrame | None = None, traffic_embeddings: pd.DataFrame | None = None,
                  ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(reward rows, tasks, embeddings): the benchmark's, plus the traffic rows of the learned splits that have an
    embedding, in the reward matrix's columns and agent order (traffic_rewards is built in that order)."""
    if traffic_rewards is None or traffic_embeddings is None or not len(traffic_rewards):
        return reward_matrix, task_pool, prompt_embeddings
    keep = traffic_rewards["split"].isin(LEARNED_SPLITS) & traffic_rewards["task_id"].isin(
        traffic_embeddings["task_id"]) & ~traffic_rewards["task_id"].isin(reward_matrix["task_id"])
    rows = traffic_rewards[keep]
    if not len(rows):
        return reward_matrix, task_pool, prompt_embeddings
    if len(reward_matrix) and list(rows["agent_order"].iloc[0]) != list(reward_matrix["agent_order"].iloc[0]):
        return reward_matrix, task_pool, prompt_embeddings  # another pool's traffic: not this matrix's rows
    tasks = pd.DataFrame({"task_id": rows["task_id"].to_numpy(), "split": rows["split"].to_numpy(), "ood": False,
                          "source": TRAFFIC, "domain": TRAFFIC, "category": TRAFFIC})
    tasks = tasks[[c for c in tasks.columns if c in task_pool.columns or c in ("task_id", "split", "ood")]]
    emb = traffic_embeddings[traffic_embeddings["task_id"].isin(rows["task_id"])][["task_id", "embedding"]]
    return (pd.concat([reward_matrix, rows[[c for c in reward_matrix.columns if c in rows.columns]]],
                      ignore_index=True),
            pd.concat([task_pool, tasks], ignore_index=True),
            pd.concat([prompt_embeddings, emb], ignore_index=True))
