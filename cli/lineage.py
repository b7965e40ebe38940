"""The materialised lineage, read through Dagster: a profile's Definitions load each asset with its own IO manager
(`Definitions.load_asset_value`), so bench/, scripts/ and the CLI never open an asset's file by path, and read the
lineage exactly as the next asset would."""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=4)
def definitions(profile: str | None = None, home: str | None = None):
    """The Definitions of `profile` (default: $ROUTER_LITE_PROFILE, else demo) on `home` (default:
    $ROUTER_LITE_HOME): the profile's lineage where `router-lite run` put it (the root, or profiles/<name>)."""
    from assets.definitions import build_definitions
    from pipeline.profile import load_profile

    return build_definitions(home, load_profile(profile))


def load(asset: str, profile: str | None = None, home: str | None = None, partition: str | None = None):
    """The value of `asset` as materialised (a DataFrame, a dict, a FittedRouter); one error naming the asset when it
    has not been materialised."""
    from dagster import AssetKey, DagsterInstance

    with DagsterInstance.ephemeral() as instance:
        return definitions(profile, home).load_asset_value(AssetKey(asset), instance=instance,
                                                           partition_key=partition)


def training_rows(profile: str | None = None, home: str | None = None) -> dict:
    """What the routers are fitted on, in reward-row order: `rewards` (reward_matrix), `tasks` (the task pool's rows
    of those tasks), `split` (train / validation / test / ood: `training_split`, the lineage's one rule) and `X`
    (their embeddings: `reward_embeddings`)."""
    from pipeline.route.fit import reward_embeddings, training_split

    rewards, pool = load("reward_matrix", profile, home), load("task_pool", profile, home)
    return {"rewards": rewards, "tasks": rewards[["task_id"]].merge(pool, on="task_id", how="left"),
            "split": training_split(rewards, pool).reset_index(drop=True),
            "X": reward_embeddings(load("prompt_embeddings", profile, home), rewards)}

