"""The Hugging Face Hub: the only place a release goes over the network (pipeline/report/hub_release.py builds it)."""
from __future__ import annotations

from dagster import ConfigurableResource

from pipeline.core.errors import RouterLiteError

HF_TOKEN_ENV = "HF_TOKEN"


def require_token(token: str | None) -> str:
    if not token:
        raise RouterLiteError(f"{HF_TOKEN_ENV} is not set: export a Hugging Face write token as {HF_TOKEN_ENV} "
                              f"(or use --dry-run to list what would be pushed)")
    return token


def push_release(releases, token: str | None) -> list[str]:
    """Create each repository (if missing) and commit its files in one commit; the commit URLs. The token goes to
    huggingface_hub only: never logged, printed or stored."""
    require_token(token)
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    api = HfApi(token=token)
    urls = []
    for r in releases:
        try:
            api.create_repo(r.repo_id, repo_type=r.repo_type, exist_ok=True)
            info = api.create_commit(r.repo_id, r.operations(), commit_message=r.commit_message,
                                     repo_type=r.repo_type)
        except OfflineModeIsEnabled:
            raise RouterLiteError("HF_HUB_OFFLINE is set: unset it to publish to the Hub") from None
        except HfHubHTTPError as exc:  # the message names the repo and the HTTP status, never the token
            raise RouterLiteError(f"publishing {r.repo_type} {r.repo_id} failed: {str(exc).splitlines()[0]}") from None
        urls.append(info.commit_url)
    return urls


class HubResource(ConfigurableResource):
    """Write access to the Hub; `token` comes from EnvVar("HF_TOKEN") (assets/hub_release.py), shown by name only."""

    token: str | None = None

    def push(self, releases) -> list[str]:
        return push_release(releases, self.token)


def hub_resource() -> HubResource:
    """The token as an EnvVar (resolved when a run launches, shown in the UI by name only) when HF_TOKEN is set for
    the code location; without it a dry run still works (an EnvVar of an unset variable would fail every run that
    uses the resource) and a push stops with one message saying to set it and reload."""
    import os

    from dagster import EnvVar

    return HubResource(token=EnvVar(HF_TOKEN_ENV)) if os.environ.get(HF_TOKEN_ENV) else HubResource()
