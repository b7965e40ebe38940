"""The code location: every asset, check, job, schedule and sensor, with resources for the active profile.

`workspace.yaml` loads this module; `dagster dev` and `router-lite run` see the same Definitions.
"""
from __future__ import annotations

from dagster import Definitions, load_asset_checks_from_modules, load_assets_from_modules

from assets import tasks
from resources.profile import ProfileResource
from resources.storage import ParquetIOManager, StorageResource, default_home

ASSET_MODULES = [tasks]


def build_resources(home: str | None = None, profile: str = "") -> dict:
    home = home or default_home()
    return {
        "io_manager": ParquetIOManager(home=home),
        "storage": StorageResource(home=home),
        "profile": ProfileResource(name=profile),
    }


def build_definitions(home: str | None = None, profile: str = "") -> Definitions:
    return Definitions(
        assets=load_assets_from_modules(ASSET_MODULES),
        asset_checks=load_asset_checks_from_modules(ASSET_MODULES),
        resources=build_resources(home, profile),
    )


defs = build_definitions()
