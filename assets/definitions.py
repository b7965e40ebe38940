"""The code location: every asset, check, job, schedule and sensor, with resources for the active profile.

`workspace.yaml` loads this module; `dagster dev` and `router-lite run` see the same Definitions.
"""
from __future__ import annotations

from pathlib import Path

from dagster import Definitions, EnvVar, load_asset_checks_from_modules, load_assets_from_modules

from assets import benchmark, collection, pool_report, publish, router, tasks
from assets.automation import with_refresh_automation
from assets.ops import build_ops
from assets.partitions import collection_partitions_for, source_partitions_for
from pipeline.config import load_profile
from resources.backbone import BackboneResource
from resources.pool import OPENROUTER_KEY_ENV, PoolResource
from resources.profile import ProfileResource
from resources.storage import ParquetIOManager, StorageResource, default_home

ASSET_MODULES = [tasks, collection, router, pool_report, benchmark, publish]  # publish: opt-in, not in run


def pool_resource(profile: str = "", pool: str | None = None) -> PoolResource:
    """The pool of the profile (or another pool of config/agents.yaml, e.g. the wider one)."""
    cfg = load_profile(profile or None).pool
    kind = cfg.get("kind", "replay")
    key = {"api_key": EnvVar(OPENROUTER_KEY_ENV)} if kind == "openrouter" else {}
    return PoolResource(kind=kind, pool=pool or cfg.get("name", "demo"), base_url=cfg.get("base_url"),
                        key_hosts=list(cfg.get("key_hosts") or []), **key)


def build_resources(home: str | None = None, profile: str = "") -> dict:
    home = home or default_home()
    bb = load_profile(profile or None).backbone
    return {
        "pool": pool_resource(profile),
        "backbone": BackboneResource(**{"export_dir": str(Path(home) / "backbones"),
                                        **{k: v for k, v in bb.items() if k in BackboneResource.model_fields}}),
        "io_manager": ParquetIOManager(home=home),
        "storage": StorageResource(home=home),
        "profile": ProfileResource(name=profile),
        "hub": publish.hub_resource(),  # HF_TOKEN, only for the opt-in hub_release
    }


def build_assets(profile: str = "") -> list:
    """Every asset; `source_tasks` partitioned by the profile's sources and `graded_calls` by its sources ×
    repetitions, in the concurrency pool of the profile's provider (`provider:replay`, `provider:openrouter`, ...:
    limits in dagster.yaml / `dagster instance concurrency set`)."""
    prof = load_profile(profile or None)
    ours = {
        tasks.source_tasks.key: tasks.source_tasks_asset(source_partitions_for(prof.sources)),
        collection.graded_calls.key: collection.graded_calls_asset(
            collection.provider_pool(profile), collection_partitions_for(prof.sources, prof.repetitions)),
    }
    assets = [next((ours[k] for k in a.keys if k in ours), a) for a in load_assets_from_modules(ASSET_MODULES)]
    return with_refresh_automation(assets, prof.pool.get("kind", "replay"))  # eager refresh: assets/automation.py


def build_definitions(home: str | None = None, profile: str = "") -> Definitions:
    return Definitions(
        assets=build_assets(profile),
        asset_checks=load_asset_checks_from_modules(ASSET_MODULES),
        resources=build_resources(home, profile),
        **build_ops(profile),
    )


defs = build_definitions()
