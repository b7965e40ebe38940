"""The code location: every asset, check, job, schedule and sensor, with resources for the active profile.

`workspace.yaml` loads this module; `dagster dev` and `router-lite run` see the same Definitions. Importing it (or
any asset module) reads no profile: `defs` is built when Dagster loads the code location, so a plugin may register
an extension (a pool kind, a task source...) after the import and before the build.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from dagster import (
    Definitions,
    definitions,
    load_asset_checks_from_package_module,
    load_assets_from_package_module,
    map_asset_specs,
)

import assets
from assets import benchmark, collection, tasks, traffic
from assets.automation import with_refresh_automation
from assets.metadata import ui_text
from assets.ops import build_ops
from assets.partitions import collection_partitions_for, source_partitions_for, traffic_partitions
from pipeline.profile import Profile, as_profile
from resources.backbone import BackboneResource
from resources.hub import hub_resource
from resources.pool import PoolResource, pool_kind
from resources.profile import ProfileResource
from resources.storage import (
    ParquetIOManager,
    RouterIOManager,
    StorageResource,
    default_home,
    home_of,
    profile_name,
)


def pool_resource(profile: Profile | str = "", pool: str | None = None) -> PoolResource:
    """The pool of the profile (or another pool of config/agents.yaml, e.g. the wider one). The key is not part of
    the resource's config: the pool reads the kind's key variable (`PoolKind.key_env`, OPENROUTER_API_KEY; set as
    `api_key_env`, shown in the UI by name) when an asset that calls the pool makes a client, so the assets that do
    not call it run without a key (an `EnvVar` would be resolved, and fail, for every run using the resource)."""
    cfg = as_profile(profile).pool
    return PoolResource(kind=cfg.kind, pool=pool or cfg.name, base_url=cfg.base_url, key_hosts=list(cfg.key_hosts),
                        api_key_env=pool_kind(cfg.kind).key_env)


def build_resources(home: str | None = None, profile: Profile | str = "") -> dict:
    """The resources of `profile` on `home` (default ROUTER_LITE_HOME): its lineage where `home_of` puts it (the
    root, or profiles/<name> when another profile has the root), the shared caches at the root."""
    root = home or default_home()
    prof = as_profile(profile)
    home = str(home_of(prof, root))  # the root names its profile at its first write (ParquetIOManager.owner)
    backbone = {k: v for k, v in dataclasses.asdict(prof.backbone).items() if k != "export_dir"}
    return {
        "pool": pool_resource(prof),
        "backbone": BackboneResource(export_dir=prof.backbone.export_dir or str(Path(root) / "backbones"), **backbone),
        "io_manager": ParquetIOManager(home=home, owner=profile_name(prof) if home == str(Path(root).resolve())
                                       else ""),  # the lineage at the root names its profile there
        "router_io_manager": RouterIOManager(home=home),  # fitted routers of any kind (their save/from_files)
        "storage": StorageResource(home=home, shared=str(Path(root).resolve())),
        "profile": ProfileResource(name=Path(prof.path).stem if prof.path else prof.name),  # re-read in a run
        "hub": hub_resource(),  # HF_TOKEN, only for the opt-in hub_release
    }


def profile_assets(prof: Profile) -> list:
    """The assets whose definition depends on the profile, built here only (no module holds a default copy):
    `source_tasks` partitioned by the profile's sources, `routerbench_replication` by its replication suites and
    `graded_calls` by its sources × repetitions, in the concurrency pool of the profile's provider
    (`provider:replay`, `provider:openrouter`, ...: limits in dagster.yaml / `dagster instance concurrency set`)."""
    return [tasks.source_tasks_asset(source_partitions_for(prof.sources)),
            collection.graded_calls_asset(collection.provider_concurrency_pool(prof),
                                          collection_partitions_for(prof.sources, prof.repetitions)),
            benchmark.routerbench_replication_asset(benchmark.suite_partitions_for(prof.benchmark.suites)),
            traffic.traffic_asset(traffic_partitions())]


def build_assets(profile: Profile | str = "") -> list:
    """Every asset: those defined in the modules of the `assets` package (the same for every profile; a module added
    there is picked up, docs/architecture.md "How to add a report") and `profile_assets`."""
    prof = as_profile(profile)
    found = load_assets_from_package_module(assets)  # every module of assets/: a new report module is found
    shown = map_asset_specs(lambda spec: spec.replace_attributes(description=ui_text(spec.description))
                            if spec.description else spec, found + profile_assets(prof))  # `<kind>` stays visible
    return with_refresh_automation(shown, prof.pool.kind)  # eager refresh: automation.py


def build_definitions(home: str | None = None, profile: Profile | str = "") -> Definitions:
    """The Definitions of `profile` (a name is read once here; every part below takes the typed `Profile`)."""
    prof = as_profile(profile)
    ops = build_ops(prof)
    traffic_job, traffic_sensor = traffic.traffic_sensor(prof, traffic_partitions())
    return Definitions(
        assets=build_assets(prof),
        asset_checks=load_asset_checks_from_package_module(assets),
        resources=build_resources(home, prof),
        **{**ops, "jobs": [*ops["jobs"], traffic_job], "sensors": [*ops["sensors"], traffic_sensor]},
    )


@definitions
def defs() -> Definitions:
    """The code location (workspace.yaml, `-m assets.definitions`): the active profile's Definitions, built when
    Dagster loads it, not when the module is imported."""
    return build_definitions()
