"""The code location: every asset, check, job, schedule and sensor, with resources for the active profile.

`workspace.yaml` loads this module; `dagster dev` and `router-lite run` see the same Definitions.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from dagster import Definitions, load_asset_checks_from_modules, load_assets_from_modules

from assets import benchmark, collection, pool_report, publish, router, tasks
from assets.automation import with_refresh_automation
from assets.ops import build_ops
from assets.partitions import collection_partitions_for, source_partitions_for
from pipeline.profile import Profile, as_profile
from resources.backbone import BackboneResource
from resources.pool import PoolResource, pool_kind
from resources.profile import ProfileResource
from resources.storage import ParquetIOManager, StorageResource, default_home

ASSET_MODULES = [tasks, collection, router, pool_report, benchmark, publish]  # publish: opt-in, not in run


def pool_resource(profile: Profile | str = "", pool: str | None = None) -> PoolResource:
    """The pool of the profile (or another pool of config/agents.yaml, e.g. the wider one). The key is not part of
    the resource's config: the pool reads the kind's key variable (`PoolKind.key_env`, OPENROUTER_API_KEY; set as
    `api_key_env`, shown in the UI by name) when an asset that calls the pool makes a client, so the assets that do
    not call it run without a key (an `EnvVar` would be resolved, and fail, for every run using the resource)."""
    cfg = as_profile(profile).pool
    return PoolResource(kind=cfg.kind, pool=pool or cfg.name, base_url=cfg.base_url, key_hosts=list(cfg.key_hosts),
                        api_key_env=pool_kind(cfg.kind).key_env)


def build_resources(home: str | None = None, profile: Profile | str = "") -> dict:
    home = home or default_home()
    prof = as_profile(profile)
    backbone = {k: v for k, v in dataclasses.asdict(prof.backbone).items() if k != "export_dir"}
    return {
        "pool": pool_resource(prof),
        "backbone": BackboneResource(export_dir=prof.backbone.export_dir or str(Path(home) / "backbones"), **backbone),
        "io_manager": ParquetIOManager(home=home),
        "storage": StorageResource(home=home),
        "profile": ProfileResource(name=Path(prof.path).stem if prof.path else prof.name),  # re-read in a run
        "hub": publish.hub_resource(),  # HF_TOKEN, only for the opt-in hub_release
    }


def build_assets(profile: Profile | str = "") -> list:
    """Every asset; `source_tasks` partitioned by the profile's sources and `graded_calls` by its sources ×
    repetitions, in the concurrency pool of the profile's provider (`provider:replay`, `provider:openrouter`, ...:
    limits in dagster.yaml / `dagster instance concurrency set`)."""
    prof = as_profile(profile)
    ours = {
        tasks.source_tasks.key: tasks.source_tasks_asset(source_partitions_for(prof.sources)),
        collection.graded_calls.key: collection.graded_calls_asset(
            collection.provider_concurrency_pool(prof), collection_partitions_for(prof.sources, prof.repetitions)),
    }
    assets = [next((ours[k] for k in a.keys if k in ours), a) for a in load_assets_from_modules(ASSET_MODULES)]
    return with_refresh_automation(assets, prof.pool.kind)  # eager refresh: assets/automation.py


def build_definitions(home: str | None = None, profile: Profile | str = "") -> Definitions:
    """The Definitions of `profile` (a name is read once here; every part below takes the typed `Profile`)."""
    prof = as_profile(profile)
    return Definitions(
        assets=build_assets(prof),
        asset_checks=load_asset_checks_from_modules(ASSET_MODULES),
        resources=build_resources(home, prof),
        **build_ops(prof),
    )


defs = build_definitions()
