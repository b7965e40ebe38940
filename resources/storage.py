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


def default_home() -> str:
    return os.environ.get("ROUTER_LITE_HOME", DEFAULT_HOME)


def _partition_file(key: str) -> str:
    # MultiPartitionKey renders as "mmlu_pro|0"; '|' is awkward in file names
    return key.replace("|", "__").replace("/", "_")


def asset_path(home: str | Path, asset: str, partition: str | None = None, suffix: str = ".parquet") -> Path:
    """The one place that knows where an asset's file lives: `<home>/assets/<asset>/<partition or __all__><suffix>`
    (the IO manager writes and reads there; the CLI, the report and the tests ask here)."""
    part = _partition_file(str(partition)) if partition else "__all__"
    return Path(home).resolve() / "assets" / asset / f"{part}{suffix}"


class StorageResource(ConfigurableResource):
    """Paths of everything the pipeline writes: one root, `ROUTER_LITE_HOME` (default ./.router-lite)."""

    home: str = DEFAULT_HOME

    def root(self) -> Path:
        return Path(self.home).resolve()

    def path(self, *parts: str) -> Path:
        p = self.root().joinpath(*parts)
        p.mkdir(parents=True, exist_ok=True)
        return p

    def asset_file(self, asset: str, partition: str | None = None, suffix: str = ".parquet") -> Path:
        return asset_path(self.home, asset, partition, suffix)

    def calls_dir(self, pool: str, source: str, repetition: int) -> Path:
        return self.path("calls", pool, source, f"rep{repetition}")


class ParquetIOManager(ConfigurableIOManager):
    """DataFrames as zstd Parquet (atomic), dicts/lists as JSON; one file per asset partition."""

    home: str = DEFAULT_HOME

    def _file(self, asset_key: list[str], partition: str | None, suffix: str) -> Path:
        return asset_path(self.home, "/".join(asset_key), partition, suffix)

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        if obj is None:
            return
        partition = context.asset_partition_key if context.has_asset_partitions else None
        key = context.asset_key.path
        if isinstance(obj, pd.DataFrame):
            atomic_write_parquet(obj, self._file(key, partition, ".parquet"))
        else:
            atomic_write_json(obj, self._file(key, partition, ".json"))

    def _read(self, asset_key: list[str], partition: str | None) -> Any:
        pq, js = self._file(asset_key, partition, ".parquet"), self._file(asset_key, partition, ".json")
        if pq.exists():
            return pd.read_parquet(pq)
        if js.exists():
            return json.loads(js.read_text())
        where = f" partition {partition!r}" if partition else ""
        raise RouterLiteError(f"asset {'/'.join(asset_key)!r}{where} has not been materialised yet ({pq} missing): "
                              f"materialise it first (`router-lite run` or the Dagster UI)")

    def load_input(self, context: InputContext) -> Any:
        key = context.asset_key.path
        if context.has_asset_partitions:  # every partition the input maps to (the profile's), in definition order
            wanted = {str(k) for k in context.asset_partition_keys}
            keys = [k for k in map(str, context.asset_partitions_def.get_partition_keys()) if k in wanted]
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
