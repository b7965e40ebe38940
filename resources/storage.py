"""Storage layout under ROUTER_LITE_HOME, and the Parquet IO manager every asset writes through.

This module is the only place that knows where things live on disk (docs/architecture.md lists the layout).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
from dagster import ConfigurableIOManager, ConfigurableResource, InputContext, OutputContext

from pipeline.core.errors import RouterLiteError
from pipeline.core.io import atomic_write_json, atomic_write_parquet

DEFAULT_HOME = ".router-lite"


# Several profiles share one home without mixing: the first profile that runs on a home keeps its lineage at the
# root (its name in <home>/profile; a home from before this file is its legacy profile's, recognised by its sources),
# every other profile's lives under <home>/profiles/<name>/ (assets, reports, datasets, registry). The folders below
# are caches keyed by content (a call's key holds agent, task, repetition and settings; an embedding's its backbone
# and text): every profile of a home shares them at the root.
OWNER_FILE = "profile"
PROFILES_DIR = "profiles"
SHARED = ("calls", "embeddings", "backbones", "bench")


def default_home() -> str:
    return os.environ.get("ROUTER_LITE_HOME", DEFAULT_HOME)


def _legacy_sources(root: Path) -> set[str] | None:
    """The sources of a lineage left at the root by a version without `OWNER_FILE` (its `source_tasks` partition
    files); None when the root holds no lineage."""
    part = root / "assets" / "source_tasks"
    return {f.stem for f in part.glob("*.parquet")} or None if part.is_dir() else None


def root_owner(home: str | Path) -> str | None:
    """The profile whose lineage lives at the root of `home` (None: nobody has claimed it yet)."""
    f = Path(home).resolve() / OWNER_FILE
    return f.read_text().strip() or None if f.is_file() else None


def profile_home(home: str | Path, profile: str, sources=None, claim: bool = False) -> Path:
    """Where profile `profile`'s lineage lives in `home`: the root when the root is its own (named in
    <home>/profile, or, for a home without that file, no lineage or one of the same sources `sources`), else
    <home>/profiles/<profile>. `claim`: an unclaimed root that exists becomes `profile`'s (its name written), which
    is how the first profile run on a home, and the legacy lineage's own profile, keep the root."""
    root = Path(home).resolve()
    if not profile:
        return root
    owner = root_owner(root)
    if owner is None:
        legacy = _legacy_sources(root)
        mine = legacy is None or (sources is not None and legacy == set(sources))
        if not mine:
            return root / PROFILES_DIR / profile
        if claim and root.is_dir():  # a home not made yet is claimed by its first lineage's sources
            (root / OWNER_FILE).write_text(profile + "\n")
        return root
    return root if owner == profile else root / PROFILES_DIR / profile


def profile_name(profile) -> str:
    """The name a `pipeline.profile.Profile` goes by in a home: its file's name."""
    return Path(profile.path).stem if getattr(profile, "path", "") else profile.name


def home_of(profile, home: str | Path | None = None, claim: bool = False) -> Path:
    """`profile_home` for a `pipeline.profile.Profile` (its name, its sources) in `home` (default: the
    ROUTER_LITE_HOME)."""
    return profile_home(home or default_home(), profile_name(profile), sources=list(profile.sources), claim=claim)


def _partition_file(key: str) -> str:
    # MultiPartitionKey renders as "mmlu_pro|0"; '|' is awkward in file names
    return key.replace("|", "__").replace("/", "_")


def asset_path(home: str | Path, asset: str, partition: str | None = None, suffix: str = ".parquet") -> Path:
    """The one place that knows where an asset's file lives: `<home>/assets/<asset>/<partition or __all__><suffix>`
    (the IO manager writes and reads there; the CLI, the report and the tests ask here)."""
    part = _partition_file(str(partition)) if partition else "__all__"
    return Path(home).resolve() / "assets" / asset / f"{part}{suffix}"


def read_asset(home: str | Path, asset: str, partition: str | None = None) -> Any:
    """What `ParquetIOManager` stored as `asset` (one partition of it) in `home`: a DataFrame, or the JSON value; one
    error naming the asset when it has not been materialised. A read without Dagster's Definitions."""
    pq, js = asset_path(home, asset, partition), asset_path(home, asset, partition, ".json")
    if pq.exists():
        return pd.read_parquet(pq)
    if js.exists():
        return json.loads(js.read_text())
    where = f" partition {partition!r}" if partition else ""
    raise RouterLiteError(f"asset {asset!r}{where} has not been materialised yet ({pq} missing): materialise it "
                          f"first (`router-lite run` or the Dagster UI)")


class StorageResource(ConfigurableResource):
    """Paths of everything the pipeline writes: the profile's lineage under `home` (`profile_home`: the root of
    `ROUTER_LITE_HOME`, default ./.router-lite, or its profiles/<name>), the shared caches (`SHARED`) under `shared`
    (the home's root; empty: `home`)."""

    home: str = DEFAULT_HOME
    shared: str = ""

    def root(self) -> Path:
        return Path(self.home).resolve()

    def path(self, *parts: str) -> Path:
        base = Path(self.shared).resolve() if self.shared and parts and parts[0] in SHARED else self.root()
        p = base.joinpath(*parts)
        p.mkdir(parents=True, exist_ok=True)
        return p

    def calls_dir(self, pool: str, source: str, repetition: int) -> Path:
        return self.path("calls", pool, source, f"rep{repetition}")


# input metadata (`AssetIn(metadata={BY_PARTITION: True})`): a partitioned input loads as {partition key: value}
# rather than one concatenated frame, for an asset that reads each partition apart (e.g. one table per suite)
BY_PARTITION = "by_partition"
# input metadata: a partitioned input loads only the partitions materialised so far (the daily `traffic` partitions:
# most days of the calendar have none), not one error per missing file
MATERIALISED_ONLY = "materialised_only"


class ParquetIOManager(ConfigurableIOManager):
    """DataFrames as zstd Parquet (atomic), dicts/lists as JSON; one file per asset partition. A partitioned input
    loads as one frame (the partitions' frames concatenated, in definition order) or, with `BY_PARTITION` in its
    metadata, as {partition key: value}. `owner`: the profile whose lineage this is, when it lives at the home's root:
    its first write there names it in `OWNER_FILE`."""

    home: str = DEFAULT_HOME
    owner: str = ""

    def _file(self, asset_key: list[str], partition: str | None, suffix: str) -> Path:
        return asset_path(self.home, "/".join(asset_key), partition, suffix)

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        if obj is None:
            return
        mark = Path(self.home).resolve() / OWNER_FILE
        if self.owner and not mark.exists():
            mark.parent.mkdir(parents=True, exist_ok=True)
            mark.write_text(self.owner + "\n")
        partition = context.asset_partition_key if context.has_asset_partitions else None
        key = context.asset_key.path
        if isinstance(obj, pd.DataFrame):
            atomic_write_parquet(obj, self._file(key, partition, ".parquet"))
        else:
            atomic_write_json(obj, self._file(key, partition, ".json"))

    def _read(self, asset_key: list[str], partition: str | None) -> Any:
        return read_asset(self.home, "/".join(asset_key), partition)

    def load_input(self, context: InputContext) -> Any:
        key = context.asset_key.path
        if context.has_asset_partitions:  # every partition the input maps to (the profile's), in definition order
            wanted = {str(k) for k in context.asset_partition_keys}
            keys = [k for k in map(str, context.asset_partitions_def.get_partition_keys()) if k in wanted]
            if (context.definition_metadata or {}).get(MATERIALISED_ONLY):
                keys = [k for k in keys if asset_path(self.home, "/".join(key), k).exists()
                        or asset_path(self.home, "/".join(key), k, ".json").exists()]
            if (context.definition_metadata or {}).get(BY_PARTITION):  # each partition's value under its key
                return {k: self._read(key, k) for k in keys}
            parts = [self._read(key, k) for k in keys]
            if all(isinstance(p, pd.DataFrame) for p in parts):
                return pd.concat(parts, ignore_index=True)
            return parts
        return self._read(key, None)


class RouterIOManager(ConfigurableIOManager):
    """Fitted routers (`pipeline.route.fitted.FittedRouter`, any registered kind): each router's own `save_files`
    into `<home>/assets/<asset>/__all__/`, read back through the router table's `from_files`; the fit's summary also
    as `__all__.json`, for people and the command line's summary."""

    home: str = DEFAULT_HOME

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        from pipeline.route.fitted import FittedRouter

        if not isinstance(obj, FittedRouter):
            raise TypeError(f"asset {context.asset_key.to_user_string()} must return a FittedRouter, got "
                            f"{type(obj).__name__}")
        name = "/".join(context.asset_key.path)
        directory = asset_path(self.home, name, suffix="")
        tmp = directory.with_name(f".{directory.name}.tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        obj.save(tmp)
        if directory.exists():  # swap whole: a reader never sees half of the old and half of the new fit
            shutil.rmtree(directory)
        tmp.rename(directory)
        atomic_write_json(obj.summary, asset_path(self.home, name, suffix=".json"))

    def load_input(self, context: InputContext) -> Any:
        from pipeline.route.fitted import FittedRouter

        name = "/".join(context.asset_key.path)
        directory = asset_path(self.home, name, suffix="")
        if not directory.exists():
            raise RouterLiteError(f"asset {name!r} has not been materialised yet ({directory} missing): materialise "
                                  f"it first (`router-lite run` or the Dagster UI)")
        return FittedRouter.load(directory)
