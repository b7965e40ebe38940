"""Opt-in stage: publish the tasks and rewards datasets and the registered head to the Hugging Face Hub.

Not one of `router-lite run`'s stages (cli/run.py): materialise `hub_release` in the UI with run config
`repo_id` (and `dry_run: true` to only list the commit), or use `router-lite publish`.
"""
import tempfile
from pathlib import Path

import pandas as pd
from dagster import AssetExecutionContext, Config, MetadataValue, Output, asset

from assets.automation import OPT_IN_TAG
from pipeline.report.datasets import publish_datasets
from pipeline.report.hub_release import build_release
from resources.hub import HubResource
from resources.profile import ProfileResource


class PublishConfig(Config):
    repo_id: str  # OWNER/NAME: datasets OWNER/NAME-tasks, OWNER/NAME-rewards, model OWNER/NAME
    dry_run: bool = False


@asset(group_name="publish", io_manager_key="io_manager", tags={OPT_IN_TAG: "true"},
       description="The tasks dataset, the rewards dataset (no prompt text) and the registered head with their "
                   "cards, pushed to the Hub (token: env HF_TOKEN). Opt-in: not part of `router-lite run`.")
def hub_release(context: AssetExecutionContext, config: PublishConfig, task_pool: pd.DataFrame,
                reward_matrix: pd.DataFrame, registered_head: dict, hub: HubResource,
                profile: ProfileResource) -> Output[dict]:
    prof = profile.get()
    with tempfile.TemporaryDirectory(prefix="hub-release.") as tmp:  # the datasets, written from this run's inputs
        folder = publish_datasets(task_pool, reward_matrix, Path(tmp), prof.name, prof.description)
        releases = build_release(config.repo_id, folder, registered_head["path"])
        plan = [r.describe() for r in releases]
        urls = [] if config.dry_run else hub.push(releases)
    for r, url in zip(plan, urls or [None] * len(plan)):
        context.log.info(f"{r['repo_type']} {r['repo_id']}: {len(r['operations'])} files"
                         + (f" → {url}" if url else " (dry run)"))
    return Output({"repo_id": config.repo_id, "dry_run": config.dry_run, "repos": plan, "commits": urls},
                  metadata={"repo_id": config.repo_id, "dry_run": config.dry_run,
                            "repositories": MetadataValue.md("\n".join(
                                f"- {r['repo_type']} `{r['repo_id']}`: " + ", ".join(
                                    f"`{o['path_in_repo']}`" for o in r["operations"]) for r in plan)),
                            "commits": MetadataValue.json(urls)})
