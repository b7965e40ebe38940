"""Swapping the served router under load, and what client keys and /metrics cost.

1. Swap. A home with two heads registered on the static backbone (random weights: serving cost does not depend on how
   good a head is) and `registry/latest.json` on the first; `router-lite serve --workers 2` on it without `--head`
   (it follows the pointer, `--follow-interval`, default 2 s), replay pool `mmlu_pro`. 16 concurrent clients send
   recorded MMLU-Pro prompts; the pointer is moved to the second entry, and the script prints the seconds until all
   replies name the new router (the end of the last reply naming the old one, after the move) and the requests
   ok / failed from the move to then; then the pointer is moved back (a rollback) and measured the same way. After
   both it reads /metrics (summed over the workers): swaps done and swap failures.
2. Keys + /metrics overhead. Fresh `serve --workers 2` servers on the same home, in an order rotated each round:
   `plain` (no client keys, `--no-metrics`), `metrics` (the series alone) and `keys+metrics` (`--api-keys` with a
   key whose budget and rpm are far above what the run spends, a SQLite ledger, and the series). 16 clients send the
   same new prompts to each server of a round (each is embedded by the static backbone: the cheap path where a
   per-request cost shows); printed side by side: the client's latency p50 and p95 (rounds pooled) and their ratio
   to `plain` (the goal: keys + metrics within 1.10 at the p50), X-Router-Overhead-Ms p50, and the servers' CPU time
   per request (the steadier figure on a shared machine).

    .venv/bin/python bench/serve_swap.py                       # both parts, a few minutes after the static build
    .venv/bin/python bench/serve_swap.py --rounds 4 --requests 300   # a steadier overhead comparison
    .venv/bin/python bench/serve_swap.py --skip-overhead --follow-interval 1

On a real demo home (after `router-lite run`): the pointer's router and another registered entry of the same
profile, prompts from the home's held-out tasks; the pointer's bytes are restored at the end:

    ROUTER_LITE_HOME=.router-lite .venv/bin/python bench/serve_swap.py --home .router-lite --profile demo \
        --to .router-lite/registry/<another entry> --skip-overhead

Writes `--json` (default `$ROUTER_LITE_HOME/bench/serve_swap.json`).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _load import bench_dir, pct, phase, recorded_prompts, start_serve, stop_server, tree_cpu_seconds  # noqa: E402


def register_pair(root: Path, bb, prompts: list[str], second_pool: str = "mmlu_pro") -> tuple[Path, Path]:
    """Two heads with random weights on backbone `bb`, the first for the mmlu_pro pool, the second for `second_pool`
    (its wider pool: a router a wider re-collection promotes), registered under `root` (the OOD guard fitted on
    `prompts`); the pointer names the first."""
    from pipeline.route import registry
    from pipeline.route.head import Head
    from pipeline.route.ood import OODGuard
    from resources.pool import PoolResource

    X = bb.encode(prompts)
    guard = OODGuard(k=3).fit(X[: len(X) // 2], X[len(X) // 2:])
    out = []
    for seed, pool in ((1, "mmlu_pro"), (2, second_pool)):
        agents = PoolResource(kind="replay", pool=pool).agents()
        rng = np.random.default_rng(seed)
        head = Head(rng.normal(size=(bb.dim, len(agents))), np.zeros(len(agents)), agents=[a.name for a in agents])
        out.append(registry.register(
            root, head, registry.PromptFit(guard, 0), agents=[{"name": a.name, "model": a.model} for a in agents],
            backbone={"id": bb.model_id, "key": bb.key, "pooling": bb.pooling, "max_seq_length": bb.max_seq_length,
                      "dim": bb.dim, **bb.registry_fields()},
            training={"bench": "serve_swap", "seed": seed}, data_hashes={}, metrics={}))
    registry.mark_latest(root, out[0].name, out[0])
    return out[0], out[1]


def start(home: Path, profile: str, workers: int = 2, extra: tuple = (), timeout_s: float = 240.0):
    """`router-lite serve --workers N` on `home` following its pointer; (process, base URL, log lines) once the
    startup line is printed (with N workers: once every worker is ready) and /readyz answers 200."""
    return start_serve(["--profile", profile, "--workers", str(workers), "--access-log", "off", *extra],
                       env={"ROUTER_LITE_HOME": str(home)}, timeout_s=timeout_s)


async def client_loop(url: str, prompts: list[str], i: int, replies: list, done: asyncio.Event,
                      pause_s: float = 0.0) -> None:
    """Client `i` asks in a loop on one keep-alive connection until `done`, appending (end, status, the router
    named in the reply) to `replies` (status 0: the connection failed), `pause_s` between its requests."""
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        n = 0
        while not done.is_set():
            n += 1
            p = prompts[(i * 7919 + n) % len(prompts)]
            try:
                r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": p}]})
                replies.append((time.monotonic(), r.status_code, r.headers.get("x-router-name")))
            except httpx.HTTPError:
                replies.append((time.monotonic(), 0, None))
            if pause_s:
                await asyncio.sleep(pause_s)


async def swap_under_load(url: str, prompts: list[str], move, old: str, new: str, clients: int = 16,
                          window_s: float = 30.0) -> dict:
    """`clients` clients ask in a loop (keep-alive connections) until every reply names `new` (or `window_s` after
    `move()` moved the pointer); {seconds until all replies name new, ok, failed, replies}."""

    replies: list[tuple[float, int, str | None]] = []  # (end, status, router) of each reply
    done = asyncio.Event()
    tasks = [asyncio.create_task(client_loop(url, prompts, i, replies, done)) for i in range(clients)]
    while len(replies) < 2 * clients:  # every client under way on the old router
        await asyncio.sleep(0.05)
    moved = time.monotonic()
    move()
    settled = None
    while time.monotonic() - moved < window_s:
        await asyncio.sleep(0.1)
        if (settled := settled_at(replies, moved, old, new, clients)) is not None:
            break
    done.set()
    await asyncio.gather(*tasks)
    during = [r for r in replies if moved < r[0] <= (settled or time.monotonic())]
    return {"seconds_to_all_new": None if settled is None else round(settled - moved, 3),
            "ok": sum(r[1] == 200 for r in during), "failed": sum(r[1] != 200 for r in during),
            "replies": len(replies), "other_router": sum(r[2] not in (old, new) for r in replies if r[1] == 200)}


def settled_at(replies: list, moved: float, old: str, new: str, clients: int) -> float | None:
    """The end of the last reply naming `old` after the pointer moved at `moved`, once some reply names `new` and
    4 rounds of every client came since (all new); None until then."""
    after = [r for r in replies if r[0] > moved]
    last_old = max((r[0] for r in after if r[2] == old), default=moved)
    new_since = any(r[2] == new for r in after) and sum(1 for r in after if r[0] > last_old) >= 4 * clients
    return last_old if new_since else None


def metric_value(text: str, name: str) -> float:
    """The sum of every sample named `name` in a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def swap_part(home: Path, profile: str, a: Path, b: Path, prompts: list[str], args) -> dict:
    import httpx

    from pipeline.route import registry
    from resources.storage import home_of

    root = home_of(_profile(profile), home=home) / "registry"
    proc, url, _ = start(home, profile, args.workers, ("--follow-interval", str(args.follow_interval)))
    try:
        out = {}
        for label, (src, dst) in (("swap", (a, b)), ("rollback", (b, a))):
            out[label] = asyncio.run(swap_under_load(
                url, prompts, lambda dst=dst: registry.mark_latest(root, dst.name, dst), src.name, dst.name,
                args.clients, args.window))
            print(f"{label} {src.name} -> {dst.name}: {json.dumps(out[label])}", file=sys.stderr, flush=True)
        time.sleep(args.follow_interval + 1)
        text = httpx.get(url + "/metrics", timeout=30).text
        out["metrics"] = {"swaps": metric_value(text, "router_lite_router_swaps_total"),
                          "swap_failures": metric_value(text, "router_lite_router_swap_failures_total"),
                          "requests": metric_value(text, "router_lite_requests_total")}
    finally:
        stop_server(proc)
    return out


def overhead_variants(tmpdir: Path) -> dict[str, tuple[tuple, dict]]:
    """(serve arguments, client headers) of each server the overhead part compares: `plain` (no client keys, no
    /metrics), `metrics` (the /metrics series alone) and `keys+metrics` (both: bench/serve.py's key with a budget
    and an rpm far above what the run spends, its spend in a SQLite ledger, every request admitted and settled)."""
    from serve import auth_variants

    keys_args, headers = auth_variants(tmpdir)["keys"]
    return {"plain": (("--no-metrics",), {}), "metrics": ((), {}), "keys+metrics": (keys_args, headers)}


def overhead_part(home: Path, profile: str, router: str, prompts: list[str], args) -> dict:
    """Each of `overhead_variants` on a fresh server per round, in an order rotated each round, the same new prompts
    for every server of a round (each server embeds each one: the static path, where a per-request cost shows) from
    `--clients` clients: the client's latency p50 / p95 (all rounds pooled), its ratio to `plain`'s, the router
    overhead header's p50 and the servers' CPU time per request (the steadier figure on a shared machine)."""
    tmp = tempfile.TemporaryDirectory(prefix="bench-serve-overhead-")
    variants = overhead_variants(Path(tmp.name))
    names = list(variants)
    per = min(args.requests, (len(prompts) - 8) // args.rounds)
    rows = {name: [] for name in names}
    try:
        for r in range(args.rounds):
            chunk = prompts[r * per:(r + 1) * per]
            for name in names[r % len(names):] + names[:r % len(names)]:
                extra, headers = variants[name]
                proc, url, _ = start(home, profile, args.workers, ("--follow-interval", "0", *extra))
                try:
                    asyncio.run(phase(url, router, prompts[-8:], 1, 60, headers))  # first-call costs
                    cpu0 = tree_cpu_seconds(proc.pid)
                    res = asyncio.run(phase(url, router, chunk, args.clients, 120, headers))
                    cpu = tree_cpu_seconds(proc.pid) - cpu0
                finally:
                    stop_server(proc)
                rows[name].append({**res, "cpu_s": cpu, "round": r})
                lat = res["latency_ms"]
                print(f"round {r} {name}: e2e p50 {pct(lat, 50):.1f} ms, p95 {pct(lat, 95):.1f} ms, {len(lat)} "
                      f"requests, {res['errors']} errors, load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    finally:
        tmp.cleanup()
    out = {}
    for name, runs in rows.items():
        lat = [x for run in runs for x in run["latency_ms"]]
        out[name] = {"e2e_p50_ms": pct(lat, 50), "e2e_p95_ms": pct(lat, 95),
                     "overhead_p50_ms": pct([x for run in runs for x in run["overhead_ms"]], 50),
                     "cpu_ms_per_req": 1000 * sum(run["cpu_s"] for run in runs) / max(1, len(lat)),
                     "round_p50_ms": [round(pct(run["latency_ms"], 50), 2) for run in runs],
                     "requests": len(lat), "errors": sum(run["errors"] for run in runs)}
    for name in names:
        out[name]["p50_ratio"] = out[name]["e2e_p50_ms"] / out["plain"]["e2e_p50_ms"]
        out[name]["p95_ratio"] = out[name]["e2e_p95_ms"] / out["plain"]["e2e_p95_ms"]
        out[name]["cpu_ratio"] = out[name]["cpu_ms_per_req"] / out["plain"]["cpu_ms_per_req"]
    return out


def overhead_table(overhead: dict, args) -> None:
    """The overhead part side by side; the goal: keys + metrics within 10 % of plain at the p50."""
    print(f"\nclient keys and /metrics on the static path: fresh `serve --workers {args.workers}` servers, "
          f"{args.clients} clients, {args.rounds} rounds in rotated order (all rounds pooled)")
    print("| server | e2e p50 | e2e p95 | p50 / plain | p95 / plain | router overhead p50 | server CPU/req (/ plain) | "
          "p50 per round | requests | errors |\n|---|---|---|---|---|---|---|---|---|---|")
    for name, r in overhead.items():
        print(f"| {name} | {r['e2e_p50_ms']:.1f} ms | {r['e2e_p95_ms']:.1f} ms | {r['p50_ratio']:.3f} | "
              f"{r['p95_ratio']:.3f} | {r['overhead_p50_ms']:.2f} ms | {r['cpu_ms_per_req']:.2f} ms "
              f"({r['cpu_ratio']:.2f}) | {' / '.join(f'{x:.1f}' for x in r['round_p50_ms'])} | {r['requests']} | "
              f"{r['errors']} |")
    ratio = overhead["keys+metrics"]["p50_ratio"]
    print(f"keys + metrics vs plain, p50: {ratio:.3f} ({'within' if ratio <= 1.10 else 'above'} the 1.10 goal)")


def _profile(name: str):
    from pipeline.profile import load_profile

    return load_profile(name)


def _demo_prompts(home: Path, profile: str, n: int) -> list[str]:
    import pandas as pd

    from resources.storage import home_of

    return pd.read_parquet(home_of(_profile(profile), home=home) / "datasets" / "tasks" / "test.parquet",
                           columns=["prompt"])["prompt"].iloc[:n].tolist()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", default=None, help="a home whose pointer names A (default: a temp home, two heads)")
    ap.add_argument("--profile", default="mmlu_pro")
    ap.add_argument("--to", default=None, help="with --home: the entry B the pointer is moved to")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--follow-interval", type=float, default=2.0)
    ap.add_argument("--window", type=float, default=60.0, help="give up on a swap after this many seconds")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the keys + /metrics overhead part")
    ap.add_argument("--requests", type=int, default=200, help="requests per overhead round")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pipeline.route import registry
    from resources.storage import home_of

    tmp = tempfile.TemporaryDirectory(prefix="bench-serve-swap-")
    if args.home:
        home = Path(args.home)
        if not args.to:
            ap.error("--home needs --to: the registered entry the pointer is moved to")
        root = home_of(_profile(args.profile), home=home) / "registry"
        saved = (root / registry.LATEST).read_bytes()
        a, b = registry.latest_path(root), Path(args.to)
        prompts = _demo_prompts(home, args.profile, 400)
    else:
        from pipeline.embed.backbone import Backbone

        home = Path(tmp.name) / "home"
        root = home_of(_profile(args.profile), home=home) / "registry"
        saved = None
        prompts = recorded_prompts(2 * args.rounds * args.requests + 8)
        a, b = register_pair(root, Backbone("static"), prompts[:40])
    load0 = os.getloadavg()[0]
    result = {"workers": args.workers, "clients": args.clients, "follow_interval_s": args.follow_interval,
              "a": a.name, "b": b.name}
    try:
        result.update(swap_part(home, args.profile, a, b, prompts, args))
        if not args.skip_overhead:
            result["overhead"] = overhead_part(home, args.profile, a.name, prompts, args)
    finally:
        if saved is not None:
            (root / registry.LATEST).write_bytes(saved)
    result["load_avg_1m"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    print(f"\nswap under load: serve --workers {args.workers}, {args.clients} clients, follow interval "
          f"{args.follow_interval:g} s (load average {load0:.1f} -> {os.getloadavg()[0]:.1f})")
    print("| move | seconds until all replies name the new router | ok | failed |\n|---|---|---|---|")
    for label in ("swap", "rollback"):
        r = result[label]
        print(f"| {label} | {r['seconds_to_all_new']} | {r['ok']} | {r['failed']} |")
    print(f"/metrics after both: {result['metrics']}")
    if "overhead" in result:
        overhead_table(result["overhead"], args)
    out = Path(args.json) if args.json else bench_dir() / "serve_swap.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=float))
    tmp.cleanup()
    return 0 if all(result[k]["failed"] == 0 and result[k]["seconds_to_all_new"] is not None
                    for k in ("swap", "rollback")) else 1


if __name__ == "__main__":
    sys.exit(main())
