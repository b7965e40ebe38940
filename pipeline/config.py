"""Profiles: one YAML file per way of running the lineage (config/profiles/<name>.yaml).

The active profile is chosen by one setting — `ROUTER_LITE_PROFILE` (or `router-lite --profile NAME`) — never by
code edits. Default: `demo`, the embedded default (replay pool, bundled data, bundled backbone).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipeline.errors import RouterLiteError
from pipeline.task_pool import PoolConfig
from pipeline.tasks import SOURCES

DEFAULT_PROFILE = "demo"


def config_dir() -> Path:
    return Path(os.environ.get("ROUTER_LITE_CONFIG", Path(__file__).resolve().parents[1] / "config"))


def active_profile_name() -> str:
    return os.environ.get("ROUTER_LITE_PROFILE", DEFAULT_PROFILE)


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    sources: dict  # source key -> {path|hub_id|hub_config|hub_split}
    task_pool: PoolConfig
    pool: dict
    collection: dict
    backbone: dict
    train: dict = field(default_factory=dict)
    benchmark: dict = field(default_factory=dict)
    path: str = ""

    @property
    def repetitions(self) -> int:
        return int(self.collection.get("repetitions", 3))


def load_profile(name: str | None = None) -> Profile:
    name = name or active_profile_name()
    path = config_dir() / "profiles" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in (config_dir() / "profiles").glob("*.yaml"))
        raise RouterLiteError(f"unknown profile {name!r} (ROUTER_LITE_PROFILE); known profiles: {', '.join(known)}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise RouterLiteError(f"{path}: not valid YAML ({exc})") from None
    sources = raw.get("sources") or {}
    unknown = sorted(set(sources) - set(SOURCES))
    if unknown:
        raise RouterLiteError(f"{path}: unknown source(s) {unknown}; known sources: {', '.join(SOURCES)}")
    if not sources:
        raise RouterLiteError(f"{path}: `sources` is empty; name at least one of {', '.join(SOURCES)}")
    tp = dict(raw.get("task_pool") or {})
    tp["ood_categories"] = tuple(tp.get("ood_categories") or ())
    ood = tp.pop("ood", None)  # {column: C, values: [...]}: the general form of `ood_categories`
    if ood is not None:
        if not isinstance(ood, dict) or not ood.get("values") or tp["ood_categories"]:
            raise RouterLiteError(f"{path}: task_pool.ood must be {{column: NAME, values: [...]}} (and replaces "
                                  "ood_categories)")
        tp["ood_column"], tp["ood_categories"] = str(ood.get("column", "category")), tuple(map(str, ood["values"]))
    try:
        pool_cfg = PoolConfig(**tp)
    except TypeError as exc:
        raise RouterLiteError(f"{path}: bad task_pool setting ({exc})") from None
    return Profile(
        name=raw.get("name", name), description=raw.get("description", ""),
        sources={k: dict(v or {}) for k, v in sources.items()}, task_pool=pool_cfg,
        pool=dict(raw.get("pool") or {}), collection=dict(raw.get("collection") or {}),
        backbone=dict(raw.get("backbone") or {}), train=dict(raw.get("train") or {}),
        benchmark=dict(raw.get("benchmark") or {}), path=str(path),
    )
