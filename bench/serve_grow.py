"""The pool grows while the endpoint serves: the wider-pool loop promotes its router under a live `serve`.

On a copy of a materialised demo home (`router-lite run` made it; `--home`, copied with its symlinks, never written
to), `router-lite serve --workers 2` follows the registry pointer while `--clients` clients (16) send the home's
held-out prompts, each with `--pause` seconds between its requests (the lineage needs the same 2 cores). Meanwhile
the re-collection schedule's loop runs on the same home through its own Dagster jobs, as docs/operations.md gives
them without a daemon (each a `dagster` command in its own process, printed as it runs):

    tick        the schedule `recollect_wide_pool` evaluated: its RunRequest (run config: pool = pool.wide_name)
    pre-flight  `recollect_preflight` with that run config; it logs the collection's forecast before any call
    forecast    `router-lite forecast --pool <wide>`: the table per agent (the new agents on their sample)
    sample      `collection_job`, one run per source x repetition: the existing agents from the call log, each new
                agent on `collection.new_agent_sample`'s sample only
    decision    `reward_matrix`: the new agents' estimates, intervals and join decisions (reports/new_agents.json);
                while an agent that may join is not complete, it stops as planned: `matrix_complete` warns naming
                them and the next step, the output is withheld (the run succeeds)
    complete    `collection_job` again: the remaining calls of the agents that may join, nobody else's
    refresh     `refresh_downstream`: rewards, routers retrained, benchmark, and `promotion` (its gate)

The script prints each step's wall seconds and its key lines, the gate's verdict, and, once the pointer moves, the
seconds until all replies name the new router and the requests ok / failed from the move to then (and over the
whole loop); then `router-lite rollback` on the running server, measured the same way. Writes `--json` (default
`$ROUTER_LITE_HOME/bench/serve_grow.json`).

    ROUTER_LITE_HOME=.router-lite .venv/bin/python bench/serve_grow.py --home .router-lite

The rollback needs the home's served router recorded in registry/promotions.jsonl (a home whose pointer predates
gated promotions: `router-lite promote <its router>` first). A run: docs/operations.md, "The loop, end to end".
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _load import REPO, bench_dir, stop_server  # noqa: E402
from serve_swap import _demo_prompts, client_loop, metric_value, settled_at, start  # noqa: E402

# the lines of a `dagster` command's output worth showing: the steps' own messages (INFO and up, with the lines that
# continue them) and the runs' outcome, not Dagster's bookkeeping events
SHOWN = re.compile(r" - (INFO|WARNING|ERROR|CRITICAL) - ")
NOISE = re.compile(r"LOGS_CAPTURED|STEP_WORKER|ENGINE_EVENT|RESOURCE_INIT|HANDLED_OUTPUT|LOADED_INPUT|STEP_INPUT|"
                   r"STEP_OUTPUT|Started execution|Executing steps|Finished execution|Started process|"
                   r"Multiprocess executor|Launching subprocess|Starting execution|Executing step")
STAMP = re.compile(r"^\d{4}-\d\d-\d\d ")


def shown(line: str, after_shown: bool) -> bool:
    """Whether a line of a `dagster` command is printed (a line without a timestamp continues the one before)."""
    if not STAMP.match(line):
        return after_shown
    return bool(SHOWN.search(line)) and not NOISE.search(line)


def dagster_home(tmp: Path) -> Path:
    """An instance of its own for the loop's runs: the repository's dagster.yaml with its folders under `tmp`."""
    d = tmp / "dagster"
    d.mkdir(parents=True, exist_ok=True)
    text = (REPO / "dagster.yaml").read_text().replace(".router-lite/dagster", str(d))
    (d / "dagster.yaml").write_text(text)
    return d


def loop_steps(profile: str, wide: str, config_file: Path, partitions: list[tuple[str, str]]) -> list[tuple]:
    """(step, commands) of the loop, as docs/operations.md runs it without a daemon (`config_file`: the tick's run
    config; `dagster job execute` reads run config from a file only)."""
    dg = [sys.executable, "-m", "dagster"]
    mod = ["-m", "assets.definitions"]
    collect = [[*dg, "job", "execute", *mod, "-j", "collection_job", "--tags", json.dumps(
        {"dagster/partition": f"{rep}|{src}", "dagster/partition/source": src, "dagster/partition/repetition": rep})]
        for src, rep in partitions]
    return [("pre-flight", [[*dg, "job", "execute", *mod, "-j", "recollect_preflight", "-c", str(config_file)]]),
            ("forecast", [[sys.executable, "-m", "cli.main", "forecast", "--profile", profile, "--pool", wide]]),
            ("sample", collect),
            ("decision", [[*dg, "asset", "materialize", *mod, "--select", "reward_matrix"]]),
            ("complete", collect),
            ("refresh", [[*dg, "job", "execute", *mod, "-j", "refresh_downstream"]])]


def tick(profile: str) -> tuple[dict, str, list[tuple[str, str]]]:
    """The schedule's tick, evaluated as the daemon does: (its run config, the wider pool, the partitions the
    collection sensor then requests as (source, repetition))."""
    from dagster import build_schedule_context

    from assets.definitions import build_definitions
    from assets.ops import SCHEDULE, collection_keys
    from pipeline.profile import load_profile

    prof = load_profile(profile)
    with build_schedule_context() as ctx:
        request = build_definitions(profile=profile).resolve_schedule_def(SCHEDULE).evaluate_tick(ctx).run_requests[0]
    parts = [(k.keys_by_dimension["source"], k.keys_by_dimension["repetition"]) for k in collection_keys(prof)]
    return request.run_config, prof.pool.wide_name, parts


def run_loop(steps, env: dict, log: list[str], times: dict) -> None:
    """Run every step's commands in order (stop at the first failure); each output line is kept in `log`, the key
    ones printed."""
    for name, commands in steps:
        t0 = time.monotonic()
        for cmd in commands:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
            last = name == "forecast"  # the forecast's table is shown whole
            for line in proc.stdout:
                log.append(f"[{name}] {line.rstrip()}")
                last = name == "forecast" or shown(line, last)
                if last:
                    print(f"[{name} +{time.monotonic() - t0:.0f}s] {line.rstrip()[:400]}", flush=True)
            if proc.wait() != 0:  # the decision's planned stop is a success (docs/operations.md)
                times[name] = None
                print(f"[{name}] failed: {' '.join(cmd[2:6])} exit {proc.returncode}", flush=True)
                return
        times[name] = round(time.monotonic() - t0, 1)
        print(f"[{name}] done in {times[name]} s", flush=True)


def pointer_name(root: Path) -> str | None:
    try:
        return json.loads((root / "latest.json").read_text())["name"]
    except (OSError, ValueError, KeyError):
        return None


async def clients_until(url: str, prompts: list[str], args, root: Path, old: str, work) -> dict:
    """`args.clients` clients ask in a loop while `work()` runs in a thread; when the pointer under `root` leaves
    `old`, the seconds until all replies name the new router (4 rounds of every client since the last old reply)
    and the replies ok / failed from the move to then, and over the whole time."""
    replies: list[tuple[float, int, str | None]] = []
    done = asyncio.Event()
    tasks = [asyncio.create_task(client_loop(url, prompts, i, replies, done, args.pause)) for i in range(args.clients)]
    while len(replies) < 2 * args.clients:
        await asyncio.sleep(0.05)
    started = time.monotonic()
    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    moved = new = settled = None
    while True:
        await asyncio.sleep(0.2)
        if moved is None:
            name = pointer_name(root)
            if name and name != old:
                moved, new = time.monotonic(), name
                print(f"pointer moved: {old} -> {new} at +{moved - started:.1f} s", flush=True)
            elif not worker.is_alive():
                break
            continue
        if (settled := settled_at(replies, moved, old, new, args.clients)) is not None:
            break
        if time.monotonic() - moved > args.window:
            break
    await asyncio.to_thread(worker.join)
    done.set()
    await asyncio.gather(*tasks)
    during = [r for r in replies if moved and moved < r[0] <= (settled or time.monotonic())]
    since = [r for r in replies if r[0] >= started]
    return {"old": old, "new": new, "seconds_to_all_new": None if settled is None else round(settled - moved, 3),
            "ok": sum(r[1] == 200 for r in during), "failed": sum(r[1] != 200 for r in during),
            "ok_whole": sum(r[1] == 200 for r in since), "failed_whole": sum(r[1] != 200 for r in since),
            "seconds_whole": round(time.monotonic() - started, 1),
            "routers_seen": sorted({r[2] for r in since if r[2]})}


def gate_verdict(home: Path) -> dict:
    """The last record of registry/promotions.jsonl (who promoted what, the gate's verdict)."""
    f = home / "registry" / "promotions.jsonl"
    lines = f.read_text().splitlines() if f.is_file() else []
    return json.loads(lines[-1]) if lines else {}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", required=True, help="a materialised demo home (copied; the copy is served and grown)")
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--pause", type=float, default=0.25, help="seconds each client waits between its requests")
    ap.add_argument("--follow-interval", type=float, default=2.0)
    ap.add_argument("--window", type=float, default=60.0, help="give up on a swap this many seconds after the move")
    ap.add_argument("--keep", default=None, help="copy the home here (kept afterwards) instead of a temp folder")
    ap.add_argument("--only-promotion", metavar="ROUTER", default=None,
                    help="on a home this loop already grew: `router-lite promote ROUTER` (the router served before "
                         "the loop) first, then under the same load run only the loop's last asset, `promotion` "
                         "(its gate reads the grown lineage), and the rollback")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    out = Path(args.json) if args.json else bench_dir() / "serve_grow.json"
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-grow-"))
    home = Path(args.keep) if args.keep else tmp / "home"
    shutil.copytree(args.home, home, symlinks=True, ignore=shutil.ignore_patterns("dagster"))
    env = {**os.environ, "ROUTER_LITE_HOME": str(home), "ROUTER_LITE_PROFILE": args.profile,
           "DAGSTER_HOME": str(dagster_home(tmp)), "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    os.environ.update(env)
    sys.path.insert(0, str(REPO))
    from pipeline.profile import load_profile
    from resources.storage import home_of

    root = home_of(load_profile(args.profile), home=home) / "registry"
    if args.only_promotion:  # the served router back, recorded in the history (the rollback returns to it)
        print(subprocess.run([sys.executable, "-m", "cli.main", "promote", "--profile", args.profile, "--force",
                              args.only_promotion], cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, check=True).stdout.strip(), flush=True)
    old = pointer_name(root)
    run_config, wide, parts = tick(args.profile)
    print(f"[tick] recollect_wide_pool -> recollect_preflight, run config {json.dumps(run_config)}; then "
          f"collection_job x {len(parts)} ({', '.join(f'{r}|{s}' for s, r in parts)})", flush=True)
    prompts = _demo_prompts(home, args.profile, 400)
    load0 = os.getloadavg()[0]
    proc, url, _ = start(home, args.profile, args.workers, ("--follow-interval", str(args.follow_interval)))
    log: list[str] = []
    times: dict = {}
    result = {"workers": args.workers, "clients": args.clients, "pause_s": args.pause,
              "follow_interval_s": args.follow_interval, "pool": wide, "run_config": run_config}
    try:
        (tmp / "tick.yaml").write_text(json.dumps(run_config))  # JSON is YAML
        steps = loop_steps(args.profile, wide, tmp / "tick.yaml", parts)
        if args.only_promotion:
            steps = [("promotion", [[sys.executable, "-m", "dagster", "asset", "materialize", "-m",
                                     "assets.definitions", "--select", "promotion"]])]
        result["grow"] = asyncio.run(clients_until(url, prompts, args, root, old,
                                                   lambda: run_loop(steps, env, log, times)))
        result["loop_seconds"] = times
        result["gate"] = gate_verdict(home_of(load_profile(args.profile), home=home))
        print(f"gate: {json.dumps(result['gate'])[:1500]}", flush=True)
        if result["grow"]["new"]:
            rb = [sys.executable, "-m", "cli.main", "rollback", "--profile", args.profile]
            result["rollback"] = asyncio.run(clients_until(
                url, prompts, args, root, result["grow"]["new"],
                lambda: print(subprocess.run(rb, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                             text=True).stdout.strip(), flush=True)))  # its line, or its error
        text = __import__("httpx").get(url + "/metrics", timeout=30).text
        result["metrics"] = {"swaps": metric_value(text, "router_lite_router_swaps_total"),
                             "swap_failures": metric_value(text, "router_lite_router_swap_failures_total")}
    finally:
        stop_server(proc)
    result["load_avg_1m"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    (tmp / "loop.log").write_text("\n".join(log))
    print(f"\nloop under serve --workers {args.workers}, {args.clients} clients (pause {args.pause:g} s), follow "
          f"interval {args.follow_interval:g} s, load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; full log "
          f"{tmp / 'loop.log'}")
    print("steps (s): " + ", ".join(f"{k} {v}" for k, v in times.items()))
    print("| move | seconds until all replies name the new router | ok | failed | ok / failed over the whole move "
          "|\n|---|---|---|---|---|")
    for label in ("grow", "rollback"):
        r = result.get(label)
        if r:
            print(f"| {label}: {r['old']} -> {r['new']} | {r['seconds_to_all_new']} | {r['ok']} | {r['failed']} | "
                  f"{r['ok_whole']} / {r['failed_whole']} in {r['seconds_whole']} s |")
    print(f"/metrics after both: {result.get('metrics')}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    if not args.keep:
        shutil.rmtree(tmp / "home", ignore_errors=True)
    ok = [result.get(k) for k in ("grow", "rollback")]
    return 0 if all(r and r["new"] and r["seconds_to_all_new"] is not None and r["failed_whole"] == 0
                    for r in ok) else 1


if __name__ == "__main__":
    sys.exit(main())
