"""The traffic log from the command line (docs/serving.md, "Recording traffic"): `serve`'s recording and exploration
options and the recorder each serving process builds from them; `router-lite traffic ls` (days, rows, bytes) and
`router-lite traffic delete --day DAY | --before DAY | --all`; the exploration part of `router-lite forecast`."""
from __future__ import annotations

import json
import time


def add_traffic_serve_options(p) -> None:
    g = p.add_argument_group("traffic recording and exploration (docs/serving.md, \"Recording traffic\")")
    g.add_argument("--record-traffic", action="store_true", default=None,
                   help="record each request (routed text, messages, decision, every agent's reply, cost, latency, "
                        "the key's name) in <home>/traffic/<day>/ (default: the profile's serve.record_traffic, off "
                        "in the shipped profiles: nothing about prompts is kept)")
    g.add_argument("--traffic-retention-days", type=int, default=None, metavar="N",
                   help="days of the traffic log kept; older days are deleted (default: the profile's "
                        "serve.traffic_retention_days, 30)")
    g.add_argument("--explore", type=float, default=None, metavar="SHARE",
                   help="share (0..1) of recorded requests, seeded, whose un-asked agents are asked after the reply, "
                        "never charged to the client's key (default: the profile's serve.explore, 0)")
    g.add_argument("--explore-usd-per-day", type=float, default=None, metavar="USD",
                   help="the exploration's cap per UTC day, all workers together (required with --explore > 0)")
    g.add_argument("--explore-seed", type=int, default=0, metavar="N",
                   help="seed of the exploration draw (default %(default)s)")


def traffic_settings(args, profile):
    """The TrafficSettings of `serve` (the options over the profile's `serve` section); a bad one: RouterLiteError."""
    from pipeline.serve.traffic import TrafficSettings

    sp = profile.serve

    def pick(value, default):
        return default if value is None else value

    return TrafficSettings(record=bool(pick(args.record_traffic, sp.record_traffic)),
                           retention_days=int(pick(args.traffic_retention_days, sp.traffic_retention_days)),
                           explore=float(pick(args.explore, sp.explore)),
                           explore_usd_per_day=pick(args.explore_usd_per_day, sp.explore_usd_per_day),
                           explore_seed=int(args.explore_seed),
                           explore_concurrency=max(1, min(4, int(profile.collection.concurrency))))


def traffic_recorder(settings, home, serve_settings):
    """This process's TrafficRecorder (its own writer, so its own file), or None when recording is off."""
    from pipeline.serve.explore import Explorer
    from pipeline.serve.traffic import TrafficRecorder
    from resources.traffic import ExploreSpend, TrafficWriter

    if not settings.record:
        return None
    writer = TrafficWriter(home, settings.retention_days)
    explorer = None
    if settings.explore > 0:
        options = {"timeout": float(serve_settings.upstream_timeout_s), "max_retries": 0}
        explorer = Explorer(settings, writer, ExploreSpend.of_home(home), options, serve_settings.max_tokens_cap)
    return TrafficRecorder(settings, writer, explorer)


def traffic_banner(settings, home) -> str:
    from resources.traffic import traffic_root

    if not settings.record:
        return ""
    line = f"; recording traffic in {traffic_root(home)} (kept {settings.retention_days} days)"
    if settings.explore > 0:
        line += f", exploring {100 * settings.explore:g} % of it (cap ${settings.explore_usd_per_day:g} a day)"
    return line


def _home(args):
    from cli.options import use_override
    from pipeline.profile import load_profile
    from resources.storage import home_of

    use_override(args)
    prof = load_profile(args.profile)
    return prof, home_of(prof)


def cmd_traffic_ls(args) -> int:
    from resources.traffic import day_stats, days, traffic_root

    _, home = _home(args)
    stats = [day_stats(home, d) for d in days(home)]
    if args.json:
        print(json.dumps({"root": str(traffic_root(home)), "days": stats}))
        return 0
    if not stats:
        print(f"no traffic recorded in {traffic_root(home)}")
        return 0
    print(f"traffic log {traffic_root(home)}")
    print(f"{'day':<12}{'files':>6}{'requests':>10}{'explored':>10}{'torn':>6}{'bytes':>14}")
    for s in stats:
        print(f"{s['day']:<12}{s['files']:>6}{s['rows']:>10}{s['explorations']:>10}{s['torn']:>6}{s['bytes']:>14,}")
    return 0


def cmd_traffic_delete(args) -> int:
    from pipeline.core.errors import RouterLiteError
    from resources.traffic import delete_days, traffic_root

    _, home = _home(args)
    if sum(x is not None and x is not False for x in (args.day, args.before, args.all)) != 1:
        raise RouterLiteError("traffic delete: say which days, with one of --day DAY, --before DAY or --all")
    gone = delete_days(home, before=args.before, everything=bool(args.all), day=args.day)
    for s in gone:
        print(f"deleted {s['day']}: {s['rows']} requests, {s['explorations']} explorations, {s['bytes']:,} bytes")
    if not gone:
        print(f"nothing to delete in {traffic_root(home)}")
    return 0


def cmd_exploration_forecast(args, prof=None, home=None) -> int:
    """The exploration forecast of the profile's traffic log: printed, and returned in reports/forecast.json by
    `router-lite forecast`."""
    fc = exploration_forecast_of(args, prof, home)
    print(exploration_line(fc))
    return 0


def exploration_forecast_of(args, prof=None, home=None) -> dict:
    import datetime

    from assets.definitions import pool_resource
    from pipeline.serve.explore import exploration_forecast
    from resources.traffic import days, read_day

    if prof is None:
        prof, home = _home(args)
    share = args.explore if args.explore is not None else prof.serve.explore
    cap = args.explore_usd_per_day if args.explore_usd_per_day is not None else prof.serve.explore_usd_per_day
    now = time.time()
    recent = {(datetime.datetime.fromtimestamp(now - h * 3600, datetime.UTC)).strftime("%Y-%m-%d") for h in (0, 24)}
    rows = [r for d in days(home) if d in recent for r in read_day(home, d)[0]]
    specs = {a.name: a for a in pool_resource(prof, None).agents()}
    return exploration_forecast(rows, specs, float(share or 0.0), cap, now)


def exploration_line(fc: dict) -> str:
    if not fc["requests_last_24h"]:
        return "exploration: no request recorded in the last 24 h (serve --record-traffic): nothing to forecast"
    rate = f"{fc['requests_per_day']:,.0f} requests a day" + (
        f" (extrapolated from {fc['extrapolated_from_hours']:.1f} h)" if fc["extrapolated_from_hours"] else "")
    cap = "no cap set" if fc["cap_usd_per_day"] is None else f"cap ${fc['cap_usd_per_day']:g} a day" + (
        " (reached: exploration stops for the rest of the day)" if fc["capped"] else "")
    measured = "" if fc["measured_usd_per_request"] is None else \
        f"; measured ${fc['measured_usd_per_request']:.6f} per explored request over {fc['explored_last_24h']}"
    return (f"exploration: {rate} x share {fc['share']:g} x ${fc['mean_unasked_usd']:.6f} (the un-asked agents of "
            f"a request, list prices) = ${fc['usd_per_day']:.4f} a day; {cap}{measured}")


def add_traffic_command(sub) -> None:
    p = sub.add_parser("traffic", help="the served traffic log: ls (days, rows, bytes), delete (docs/serving.md)")
    tsub = p.add_subparsers(dest="traffic_command", required=True)
    ls = tsub.add_parser("ls", help="the recorded days: files, requests, explorations, bytes")
    ls.add_argument("--json", action="store_true", help="one JSON object")
    ls.set_defaults(fn=cmd_traffic_ls)
    rm = tsub.add_parser("delete", help="delete recorded days (one of --day, --before, --all)")
    rm.add_argument("--day", default=None, metavar="DAY", help="delete this UTC day (YYYY-MM-DD)")
    rm.add_argument("--before", default=None, metavar="DAY", help="delete every day before DAY (DAY kept)")
    rm.add_argument("--all", action="store_true", default=None, help="delete the whole log")
    rm.set_defaults(fn=cmd_traffic_delete)
    for q in (ls, rm):
        q.add_argument("--profile", default=None, help="profile whose home holds the log (default: "
                                                       "$ROUTER_LITE_PROFILE or demo)")
        q.add_argument("--override", default=None, metavar="FILE", help="a YAML file merged over the profile")


def add_forecast_options(p) -> None:
    p.add_argument("--exploration", action="store_true",
                   help="only the exploration forecast: a day of `serve --explore` at the traffic log's request rate")
    p.add_argument("--explore", type=float, default=None, metavar="SHARE",
                   help="the exploration share to forecast (default: the profile's serve.explore)")
    p.add_argument("--explore-usd-per-day", type=float, default=None, metavar="USD",
                   help="the cap to compare with (default: the profile's serve.explore_usd_per_day)")

