"""The active profile as a resource, so assets read configuration and tests can swap it."""
from __future__ import annotations

from dagster import ConfigurableResource

from pipeline.config import Profile, active_profile_name, load_profile


class ProfileResource(ConfigurableResource):
    """Which `config/profiles/<name>.yaml` drives the lineage (default: ROUTER_LITE_PROFILE, else demo)."""

    name: str = ""

    def get(self) -> Profile:
        return load_profile(self.name or active_profile_name())
