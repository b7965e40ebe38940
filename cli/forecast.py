"""`router-lite forecast`: what the profile's collection will cost, before any paid call. No call to an
agent and no key: the task pool is built in this process from the profile's bundled sources (what `router-lite run
--upto task_pool` materialises), the call logs say what is done, and the pool's prices are the list prices (with a
key, the provider's models endpoint adds its own). Prints a table; writes reports/forecast.json. Then what a day of
`serve --explore` costs at the request rate of the traffic log's last 24 h, and its cap (cli/traffic.py;
`--exploration`: that alone)."""
from __future__ import annotations

import os
import sys
from pathlib import Path


def profile_task_pool(prof):
    """The profile's task pool, as the `task_pool` asset builds it (sources -> eligible tasks -> balanced pool)."""
    import pandas as pd

    from assets.tasks import eligible_tasks
    from pipeline.tasks.sources import load_source
    from pipeline.tasks.task_pool import build_task_pool

    frames = [load_source(k, path=s.path, hub_id=s.hub_id, hub_config=s.hub_config, hub_split=s.hub_split)
              for k, s in prof.sources.items()]
    return build_task_pool(eligible_tasks(pd.concat(frames, ignore_index=True), prof), prof.task_pool)


def _preflight_of(prof, home: str, pool_name: str):
    """The pre-flight materialised in `home` (read through the lineage's IO manager) when it ran on `pool_name`
    (its completion lengths), else None."""
    from cli import lineage

    pf = lineage.load("preflight", prof, home, default=None)
    return pf if pf is not None and "pool" in pf.columns and len(pf) and str(pf["pool"].iloc[0]) == pool_name \
        else None


def compute_forecast(prof, pool_name: str | None, home: str) -> tuple[dict, str]:
    """(the forecast of `prof`'s collection on `pool_name` (default: the profile's pool), the price note)."""
    from assets.collection_budget import collection_forecast
    from assets.definitions import pool_resource
    from resources.prices import provider_prices
    from resources.storage import StorageResource

    pool = pool_resource(prof, pool_name or None)
    agents = pool.agents()
    pool.check_setup(agents)  # a bad pool or base URL fails here; a missing key does not
    live, note = provider_prices(pool)
    from assets.collection import sampled_fractions

    storage = StorageResource(home=home)
    fc = collection_forecast(prof, pool.kind, storage, profile_task_pool(prof), agents,
                             _preflight_of(prof, home, pool.pool), live,
                             sampled_fractions(prof, [a.name for a in agents], storage, pool.pool))
    return {"profile": prof.name, "pool": pool.pool, "kind": pool.kind, "prices": note, **fc}, note


def cmd_forecast(args) -> int:
    from cli.options import use_override
    from pipeline.collect.forecast import forecast_line, forecast_table
    from pipeline.core.io import atomic_write_json
    from pipeline.profile import load_profile
    from resources.storage import home_of

    if args.profile:
        os.environ["ROUTER_LITE_PROFILE"] = args.profile
    use_override(args)
    prof = load_profile(args.profile)
    home = str(home_of(prof))  # this profile's folder: the home's root, or profiles/<name> beside another's lineage
    from cli.traffic import exploration_forecast_of, exploration_line

    exploration = exploration_forecast_of(args, prof, home)  # a day of `serve --explore` at the log's request rate
    if args.exploration:
        print(exploration_line(exploration))
        return 0
    fc, note = compute_forecast(prof, args.pool, home)
    fc["exploration"] = exploration
    out = Path(home) / "reports" / "forecast.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(fc, out)
    judges = [a for a in fc["per_agent"] if a.startswith("judge:")]  # the judge of open-ended tasks: no agent
    print(f"forecast: profile {prof.name}, pool {fc['pool']} ({fc['kind']}), {fc['tasks']:,} tasks x "
          f"{len(fc['per_agent']) - len(judges)} agents x {fc['repetitions']} repetitions"
          f"{', and their judge' if judges else ''}; prices: {note}")
    print(forecast_table(fc))
    print(forecast_line(fc))
    print(exploration_line(exploration))
    print(f"written: {out}", file=sys.stderr)
    return 0


def add_forecast_command(sub) -> None:
    p = sub.add_parser("forecast", help="calls and a USD range of the profile's collection, before any call (no key)")
    p.add_argument("--profile", default=None, help="profile name (default: $ROUTER_LITE_PROFILE or demo)")
    p.add_argument("--override", default=None, metavar="FILE", help="a YAML file merged over the profile")
    p.add_argument("--pool", default=None, help="another pool of config/agents.yaml (default: the profile's)")
    from cli.traffic import add_forecast_options

    add_forecast_options(p)
    p.set_defaults(fn=cmd_forecast)
