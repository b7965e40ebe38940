"""The materialised lineage, read and run through Dagster: a profile's Definitions load each asset with its own IO
manager (`Definitions.load_asset_value`) and store one through it, and `run` materialises assets with
`router-lite run`'s own `run_lineage`, so bench/, scripts/ and the CLI never open an asset's file by path, read the
lineage exactly as the next asset would, and time the lineage's own steps."""
from __future__ import annotations

from functools import lru_cache

_RAISE = object()


@lru_cache(maxsize=4)
def _cached(profile: str | None, home: str | None):
    from assets.definitions import build_definitions
    from pipeline.profile import load_profile

    return build_definitions(home, load_profile(profile))


def definitions(profile=None, home: str | None = None):
    """The Definitions of `profile` (a name, default $ROUTER_LITE_PROFILE else demo, or a loaded Profile) on `home`
    (default: $ROUTER_LITE_HOME): the profile's lineage where `router-lite run` put it (the root, or
    profiles/<name>)."""
    if profile is None or isinstance(profile, str):
        return _cached(profile, home)
    from assets.definitions import build_definitions

    return build_definitions(home, profile)


def load(asset: str, profile=None, home: str | None = None, partition: str | None = None, *, defs=None,
         default=_RAISE):
    """The value of `asset` as materialised (a DataFrame, a dict, a FittedRouter) in `defs` (default: `definitions`
    of `profile` on `home`); one error naming the asset when it has not been materialised, or `default` when one is
    given."""
    from dagster import AssetKey, DagsterInstance

    from pipeline.core.errors import RouterLiteError

    defs = defs or definitions(profile, home)
    try:
        with DagsterInstance.ephemeral() as instance:
            return defs.load_asset_value(AssetKey(asset), instance=instance, partition_key=partition)
    except RouterLiteError:  # the IO managers' "has not been materialised yet"
        if default is _RAISE:
            raise
        return default


def read(asset: str, profile, default=_RAISE):
    """An unpartitioned asset of the default IO manager (`resources.storage.ParquetIOManager`: task_pool,
    prompt_embeddings, ...) of `profile` (a loaded Profile) on $ROUTER_LITE_HOME, read as that IO manager reads it
    but without the Definitions (importing and building them takes seconds: `serve` reads two such assets at start
    and in each worker); `default` when it has not been materialised, if given."""
    from pipeline.core.errors import RouterLiteError
    from resources.storage import home_of, read_asset

    try:
        return read_asset(home_of(profile), asset)
    except RouterLiteError:
        if default is _RAISE:
            raise
        return default


def store(defs, asset: str, value, partition: str | None = None) -> None:
    """Write `value` as `asset` (one partition of it) through the asset's own IO manager, as a run would."""
    from dagster import AssetKey, build_output_context

    key = AssetKey(asset)
    spec = defs.get_assets_def(key)
    io = defs.resources[spec.get_io_manager_key_for_asset_key(key)]
    io.handle_output(build_output_context(asset_key=key, partition_key=partition,
                                          asset_partitions_def=spec.partitions_def if partition else None), value)


def partitions(defs, asset: str) -> list[str]:
    """The partition keys of `asset` in `defs` (the profile's), in definition order."""
    from dagster import AssetKey

    return [str(k) for k in defs.get_assets_def(AssetKey(asset)).partitions_def.get_partition_keys()]


def run(defs, upto, start=None, profile=None) -> dict:
    """Materialise `upto` (an asset or several, with what they depend on; with `start`, only from those assets on,
    the rest read as materialised) with `router-lite run`'s `run_lineage`, quietly, on an ephemeral instance (a
    bench's runs stay out of the UI's): its step statistics ({"stages", "steps": {asset step: wall s}, "total_s"})."""
    from dagster import DagsterInstance

    from cli.run import run_lineage

    with DagsterInstance.ephemeral() as instance:
        return run_lineage(defs, profile, upto, log=lambda m: None, start=start, instance=instance)


def training_rows(profile: str | None = None, home: str | None = None) -> dict:
    """What the routers are fitted on, in reward-row order: `rewards` (reward_matrix), `tasks` (the task pool's rows
    of those tasks), `split` (train / validation / test / ood: `training_split`, the lineage's one rule) and `X`
    (their embeddings: `reward_embeddings`)."""
    from pipeline.route.fit import reward_embeddings, training_split

    rewards, pool = load("reward_matrix", profile, home), load("task_pool", profile, home)
    return {"rewards": rewards, "tasks": rewards[["task_id"]].merge(pool, on="task_id", how="left"),
            "split": training_split(rewards, pool).reset_index(drop=True),
            "X": reward_embeddings(load("prompt_embeddings", profile, home), rewards)}
