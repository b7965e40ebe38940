"""The active profile as a resource, so assets read configuration and tests can swap it."""
from __future__ import annotations

from typing import Any

from dagster import ConfigurableResource
from pydantic import PrivateAttr

from pipeline.profile import Profile, active_profile_name, load_profile


class ProfileResource(ConfigurableResource):
    """Which `config/profiles/<name>.yaml` drives the lineage (default: ROUTER_LITE_PROFILE, else demo). The
    definitions build passes the file name of the profile it was built from; a run reads the file once per resource
    instance (a run worker is another process) and every asset gets the same typed `Profile`."""

    name: str = ""

    _profile: Any = PrivateAttr(default=None)

    def get(self) -> Profile:
        if self._profile is None:
            self._profile = load_profile(self.name or active_profile_name())
        return self._profile
