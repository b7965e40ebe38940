"""Router overhead of `router-lite serve`: embed + pick per request, the agent's own latency excluded.

Starts `router-lite serve` in a subprocess on a free loopback port (replay pool of the profile, so the agents
answer at once), sends real MMLU-Pro prompts that the replay recorded, and reads the server's
`X-Router-Overhead-Ms` header (request body parsed -> agent picked: validation, waiting for the embedder, embedding,
head + OOD guard). Per serving mode (`batched`: the micro-batcher, up to 32 prompts collected for at most 2 ms;
`unbatched`: `--max-batch 1 --batch-wait-ms 0`, each prompt embedded alone, in turn) and level of concurrent clients
(default 1, 4, 16, 64) it runs

- cold: N prompts the server has not seen (each is embedded; the same N prompts in both modes),
- warm: the same N prompts again (the LRU of routing decisions answers; no embedding),

and prints p50 / p99 of the overhead and of the client's end-to-end latency (loopback HTTP + replay + JSON),
throughput, and the server process's CPU time per request (user + system, all its threads: less sensitive than
wall-clock latency to other jobs sharing the CPU). Bounded: N requests per phase and `--max-seconds` per phase,
whichever ends first. Writes `$ROUTER_LITE_HOME/bench/serve.json`: `{"clients": {"1": {"p50_ms", "p99_ms"}, ...}}`
for the batched mode on new prompts (the goal's case), plus the same for `unbatched` and `warm`, and every row.

    .venv/bin/python bench/serve.py                       # a head trained here on real rewards of 300 prompts
    .venv/bin/python bench/serve.py --head DIR --dtype auto bfloat16 --concurrency 1 16 --requests 200

`--auth` compares instead the same server with and without client keys (docs/serving.md, "Client keys and budgets"):
the static-backbone head, `--auth-clients` (16) clients, cold and warm prompts, alternating rounds, side by side
(`auth_variants` lists the servers compared; written to `$ROUTER_LITE_HOME/bench/serve_auth.json`):

    .venv/bin/python bench/serve.py --auth --requests 200 --auth-rounds 2

Without `--head`, a head is trained and registered in a temp dir, or in `--save-head DIR` (MiniLM, max_seq_length
128, rewards = whether each demo agent's recorded reply is correct): serving cost does not depend on how good the
head is.
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
from _load import (
    bench_dir,
    cpu_seconds,
    pct,
    phase,
    phase_row,
    recorded_prompts,
    start_serve,
    stop_server,
    tree_cpu_seconds,
)

GOALS_MS = {1: (10.0, 25.0), 16: (60.0, 150.0)}  # clients -> (p50, p99) of the router overhead, new prompts (issue 11)
MODES = {"batched": ("32", "2"), "unbatched": ("1", "0")}  # --max-batch, --batch-wait-ms


def build_head(out: Path, n: int = 300, max_seq_length: int = 128, backbone: str | None = None) -> Path:
    """Register a head trained on real rewards (recorded reply correct?) of `n` prompts, embedded by `backbone`
    (default MiniLM; `static`: the Model2Vec backbone); returns its dir."""
    import pandas as pd

    from pipeline.collect.grading import grade
    from pipeline.embed.backbone import Backbone
    from pipeline.route import registry
    from pipeline.route.fit import fit_router
    from pipeline.route.train import TrainConfig
    from pipeline.tasks.sources import load_source
    from resources.pool import PoolResource

    pool = PoolResource(kind="replay", pool="mmlu_pro")
    store, agents = pool.store(), pool.agents()
    names = [a.name for a in agents]
    tasks = load_source("mmlu_pro")
    tasks = tasks[tasks["prompt"].isin(set(recorded_prompts(n)))].reset_index(drop=True)
    R = np.array([[float(grade(store.text_for(a.model, t.prompt), t.gold, t.grader)[1]) for a in agents]
                  for t in tasks.itertuples()])
    rewards = pd.DataFrame({"task_id": tasks["task_id"], "agent_order": [names] * len(tasks),
                            "mean_reward": list(R)})
    split = pd.Series(np.where(np.arange(len(tasks)) % 5 < 3, "train",
                               np.where(np.arange(len(tasks)) % 5 == 3, "validation", "test")))
    bb = Backbone(backbone, max_seq_length=max_seq_length)
    X = bb.encode(tasks["prompt"].tolist())
    fit = fit_router(X, rewards, split, TrainConfig(generations=10, log_every=0))
    return registry.register(
        out, fit.head, registry.PromptFit(fit.guard, fit.best_single),
        backbone={"id": bb.model_id, "key": bb.key, "pooling": bb.pooling, "max_seq_length": bb.max_seq_length,
                  "dim": int(X.shape[1]), **bb.registry_fields()},
        agents=[{"name": a.name, "model": a.model} for a in agents], training={"generations": 10, "bench": True},
        data_hashes={"bench": f"mmlu_pro first {n} recorded"}, metrics=fit.metrics)


def start_server(head: Path, profile: str, dtype: str, device: str, threads: int = 0, timeout_s: float = 180.0,
                 mode: str = "batched", workers: int = 1, extra: tuple = ()):
    """`router-lite serve --head HEAD` in serving `mode`: (process, base URL, its output lines)."""
    return start_serve(["--head", str(head), "--profile", profile, "--dtype", dtype, "--device", device,
                        "--threads", str(threads), "--max-batch", MODES[mode][0], "--batch-wait-ms", MODES[mode][1],
                        "--workers", str(workers), *extra], ready="/healthz",
                       timeout_s=timeout_s, settle_s=0.5 if workers > 1 else 0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", default=None, help="registered head dir (default: train one in a temp dir)")
    ap.add_argument("--save-head", default=None, help="register the trained head here (reuse it with --head)")
    ap.add_argument("--profile", default="mmlu_pro", help="profile whose pool the server calls (a replay pool)")
    ap.add_argument("--requests", type=int, default=200, help="requests per phase")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES),
                    help="batched: the micro-batcher; unbatched: every prompt embedded alone")
    ap.add_argument("--dtype", nargs="+", default=["auto"], help="backbone dtype(s) to compare (auto = float32 on "
                                                                "CPU; bfloat16 uses AMX/AVX512-BF16 when present)")
    ap.add_argument("--threads", type=int, nargs="+", default=[0], help="torch threads of the server (0: default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-seconds", type=float, default=180.0, help="time limit per phase")
    ap.add_argument("--json", default=None, help="where to write the results (default: "
                                                  "$ROUTER_LITE_HOME/bench/serve.json)")
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2],
                    help="server processes to compare (cold prompts, --workers-clients clients, default backbone); "
                         "none: skip")
    ap.add_argument("--workers-clients", type=int, default=16)
    ap.add_argument("--workers-rounds", type=int, default=2, help="alternating rounds of the workers comparison")
    ap.add_argument("--static-clients", type=int, nargs="*", default=[1, 16, 64],
                    help="client levels for a head on the static backbone (cold prompts); none: skip")
    ap.add_argument("--static-workers", type=int, default=1, help="server processes for the static head")
    ap.add_argument("--auth", action="store_true",
                    help="the static head served side by side with and without client keys (AUTH_VARIANTS: a key "
                         "with a budget, an rpm and targets, SQLite ledger), --auth-clients clients, cold and warm "
                         "prompts, alternating rounds; then exit")
    ap.add_argument("--auth-clients", type=int, default=16)
    ap.add_argument("--auth-rounds", type=int, default=2)
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    from pipeline.route import registry

    tmp = tempfile.TemporaryDirectory(prefix="bench-serve-")
    if args.auth:
        return auth_main(Path(tmp.name), args)
    if args.head:
        head = Path(args.head)
    else:
        t = time.perf_counter()
        head = build_head(Path(args.save_head or tmp.name))
        print(f"trained a bench head in {time.perf_counter() - t:.0f}s: {head}", file=sys.stderr)
    reg = registry.load(head)
    # distinct prompts per concurrency level (a fresh server per mode and dtype, so every mode sees the same
    # prompts) so cold phases never hit the cache; the first 400 recorded prompts are skipped: the bench head trains
    # on the first 300
    n_levels = len(args.concurrency)
    pool = recorded_prompts(args.requests * n_levels + 8, skip=400)
    rows = []
    load_before = os.getloadavg()[0]
    for mode, dtype, threads in [(m, d, t) for m in args.modes for d in args.dtype for t in args.threads]:
        proc, url, _ = start_server(head, args.profile, dtype, args.device, threads, mode=mode)
        try:
            asyncio.run(phase(url, reg.name, pool[-8:], 1, 60))  # warm-up: first-call costs (allocations, JIT)
            for li, conc in enumerate(args.concurrency):
                prompts = pool[li * args.requests:(li + 1) * args.requests]
                for cache in ("cold", "warm"):
                    cpu0 = cpu_seconds(proc.pid)
                    r = asyncio.run(phase(url, reg.name, prompts, conc, args.max_seconds))
                    cpu = cpu_seconds(proc.pid) - cpu0
                    rows.append({"mode": mode, "dtype": dtype, "threads": threads, "clients": conc, "cache": cache,
                                 **phase_row(r, cpu)})
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        finally:
            stop_server(proc)

    goals = ", ".join(f"{c} client{'s' * (c > 1)} p50 <= {p50:.0f} ms, p99 <= {p99:.0f} ms"
                      for c, (p50, p99) in GOALS_MS.items())
    print(f"\nrouter overhead (embed + pick, server-side X-Router-Overhead-Ms) | head {reg.name} | backbone "
          f"{reg.manifest['backbone']['id']} L{reg.manifest['backbone'].get('max_seq_length')} | {os.cpu_count()} "
          f"CPUs (load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after) | goals (new prompts): "
          f"{goals}\n")
    hdr = ["mode", "dtype", "threads", "clients", "cache", "requests", "errors", "overhead p50", "overhead p99",
           "e2e p50", "e2e p99", "req/s", "server CPU/req"]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for r in sorted(rows, key=lambda r: (r["cache"], r["clients"], r["dtype"], r["threads"], r["mode"])):
        print(f"| {r['mode']} | {r['dtype']} | {r['threads'] or 'default'} | {r['clients']} | {r['cache']} | "
              f"{r['requests']} | {r['errors']} | "
              f"{r['overhead_p50_ms']:.1f} ms | {r['overhead_p99_ms']:.1f} ms | {r['e2e_p50_ms']:.1f} ms | "
              f"{r['e2e_p99_ms']:.1f} ms | {r['req_per_s']:.0f} | {r['server_cpu_ms_per_req']:.1f} ms |")
    extra = {}
    if args.workers:
        extra.update(workers_phase(head, reg, pool, args))
    if args.static_clients:
        rows += static_phase(Path(tmp.name), pool, args)
    result = summary(rows, args)
    result.update(extra)
    if args.static_clients:
        sel = [r for r in rows if r["mode"] == "static"]
        result["static"] = {"workers": args.static_workers, "backbone": "static", "goals": STATIC_GOALS_MS,
                            "clients": {str(r["clients"]): {
                                "p50_ms": r["overhead_p50_ms"], "p99_ms": r["overhead_p99_ms"],
                                "e2e_p50_ms": r["e2e_p50_ms"], "e2e_p99_ms": r["e2e_p99_ms"],
                                "req_per_s": r["req_per_s"], "server_cpu_ms_per_req": r["server_cpu_ms_per_req"],
                                "errors": r["errors"]} for r in sel}}
        result["static"]["goals_met"] = {c: result["static"]["clients"].get(c, {}).get("p50_ms", float("inf")) <= g
                                         for c, g in STATIC_GOALS_MS.items()}
        print(f"\nstatic backbone head: {json.dumps(result['static']['clients'])}", file=sys.stderr)
    result["load_avg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    out = Path(args.json) if args.json else bench_dir() / "serve.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=float))
    print(f"\nwrote {out}", file=sys.stderr)
    tmp.cleanup()
    return 0


STATIC_GOALS_MS = {"16": 20.0, "64": 60.0}  # clients -> p50 of the router overhead with the static backbone (issue 19)


def batch_throughput(reg, prompts: list[str], rounds: int = 2) -> float:
    """Prompts/s of the head's backbone embedding `prompts` in batches of 64 in this process (all cores, no server
    running): the physical limit a cold endpoint can approach."""
    from pipeline.embed.backbone import Backbone, Runtime

    m = reg.manifest["backbone"]
    bb = Backbone(m["id"], max_seq_length=int(m.get("max_seq_length", 256)), runtime=Runtime(log_every=10**9))
    bb.encode(prompts[:8])
    best = 0.0
    for _ in range(rounds):
        t = time.perf_counter()
        bb.encode(prompts)
        best = max(best, len(prompts) / (time.perf_counter() - t))
    return best


def workers_phase(head: Path, reg, pool: list[str], args) -> dict:
    """Cold requests/s at `--workers-clients` clients: one server process (the batcher) vs N worker processes behind
    one port, alternating rounds (fresh servers, so every prompt is new to them), next to the backbone's batch
    throughput measured here first."""
    prompts = pool[:args.requests]
    limit = batch_throughput(reg, prompts)
    print(f"backbone batch throughput (in-process, batch 64): {limit:.1f} prompts/s", file=sys.stderr, flush=True)
    per: dict[str, list[dict]] = {str(w): [] for w in args.workers}
    for rnd in range(args.workers_rounds):
        for w in args.workers:
            proc, url, _ = start_server(head, args.profile, args.dtype[0], args.device, 0, workers=w)
            try:
                asyncio.run(phase(url, reg.name, pool[-16:], 8, 60))  # warm-up on several connections (workers)
                cpu0 = tree_cpu_seconds(proc.pid)
                r = asyncio.run(phase(url, reg.name, prompts, args.workers_clients, args.max_seconds))
                cpu = tree_cpu_seconds(proc.pid) - cpu0
            finally:
                stop_server(proc)
            row = {"round": rnd, "req_per_s": len(r["latency_ms"]) / r["seconds"], "errors": r["errors"],
                   "overhead_p50_ms": pct(r["overhead_ms"], 50), "overhead_p99_ms": pct(r["overhead_ms"], 99),
                   "e2e_p50_ms": pct(r["latency_ms"], 50), "e2e_p99_ms": pct(r["latency_ms"], 99),
                   "server_cpu_ms_per_req": 1000 * cpu / max(1, len(r["latency_ms"]))}
            per[str(w)].append(row)
            print(f"workers {w} round {rnd + 1}: {json.dumps(row)}", file=sys.stderr, flush=True)
    out = {}
    for w, rs in per.items():
        out[w] = {k: float(np.mean([r[k] for r in rs])) for k in rs[0] if k != "round"}
        out[w]["rounds"] = rs
    best = max(out, key=lambda w: out[w]["req_per_s"])
    return {"workers": out, "backbone_batch_prompts_per_s": limit, "workers_best": int(best),
            "workers_clients": args.workers_clients,
            "cold_req_per_s_over_batch_throughput": out[best]["req_per_s"] / limit if limit else None}


def static_phase(tmpdir: Path, pool: list[str], args) -> list[dict]:
    """A head trained on the static backbone, served cold at `--static-clients` levels (new prompts per level)."""
    from pipeline.route import registry

    head = build_head(tmpdir / "static", backbone="static")
    reg = registry.load(head)
    rows = []
    proc, url, _ = start_server(head, args.profile, "auto", "cpu", 0, workers=args.static_workers)
    try:
        asyncio.run(phase(url, reg.name, pool[-8:], 1, 60))
        for li, conc in enumerate(args.static_clients):
            prompts = pool[li * args.requests:(li + 1) * args.requests]
            cpu0 = tree_cpu_seconds(proc.pid)
            r = asyncio.run(phase(url, reg.name, prompts, conc, args.max_seconds))
            cpu = tree_cpu_seconds(proc.pid) - cpu0
            rows.append({"mode": "static", "dtype": "static", "threads": 0, "clients": conc, "cache": "cold",
                         **phase_row(r, cpu), "upstream_p50_ms": pct(r["upstream_ms"], 50)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        stop_server(proc)
    return rows


def auth_variants(tmpdir: Path) -> dict[str, tuple[tuple, dict]]:
    """(serve arguments, client headers) of each server `--auth` compares: `plain` (no keys, loopback) and `keys`
    (every check on: a key with a budget far above what the run spends, an rpm far above its rate and a targets list,
    its spend in a SQLite ledger of its own). Another check to compare (a /metrics endpoint, ...) is one more row."""
    import hashlib
    import secrets

    key = "rl-bench-" + secrets.token_hex(16)
    keys = tmpdir / "bench-keys.yaml"
    keys.write_text(f"keys:\n  - {{name: bench, sha256: {hashlib.sha256(key.encode()).hexdigest()}, budget_usd: "
                    "1000000, budget_window: 1d, rpm: 1000000, targets: [max-quality]}\n")
    return {"plain": ((), {}),
            "keys": (("--api-keys", str(keys), "--ledger", str(tmpdir / "bench-ledger.sqlite")),
                     {"Authorization": f"Bearer {key}"})}


def auth_main(tmpdir: Path, args) -> int:
    """`--auth`: the static head behind each of `auth_variants`, fresh servers in alternating rounds, the same cold
    prompts then the same again (warm: the LRU answers, so what is left is HTTP, the checks and the replay agent)."""
    from pipeline.route import registry

    head = Path(args.head) if args.head else build_head(tmpdir / "static", backbone="static")
    reg = registry.load(head)
    prompts = recorded_prompts(args.requests + 8, skip=400)
    variants = auth_variants(tmpdir)
    rows, load_before = [], os.getloadavg()[0]
    for rnd in range(args.auth_rounds):
        for name, (extra, headers) in variants.items():
            proc, url, _ = start_server(head, args.profile, "auto", "cpu", 0, workers=1, extra=extra)
            try:
                asyncio.run(phase(url, reg.name, prompts[-8:], 1, 60, headers))
                for cache in ("cold", "warm"):
                    cpu0 = cpu_seconds(proc.pid)
                    r = asyncio.run(phase(url, reg.name, prompts[:args.requests], args.auth_clients,
                                          args.max_seconds, headers))
                    cpu = cpu_seconds(proc.pid) - cpu0
                    rows.append({"variant": name, "round": rnd, "cache": cache, "requests": len(r["latency_ms"]),
                                 "errors": r["errors"], "overhead_p50_ms": pct(r["overhead_ms"], 50),
                                 "e2e_p50_ms": pct(r["latency_ms"], 50), "e2e_p99_ms": pct(r["latency_ms"], 99),
                                 "req_per_s": len(r["latency_ms"]) / r["seconds"],
                                 "server_cpu_ms_per_req": 1000 * cpu / max(1, len(r["latency_ms"]))})
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            finally:
                stop_server(proc)
    return auth_report(rows, args, load_before)


def auth_report(rows: list[dict], args, load_before: float) -> int:
    """The `--auth` table (means over rounds, side by side), written to $ROUTER_LITE_HOME/bench/serve_auth.json."""
    keys = ["e2e_p50_ms", "e2e_p99_ms", "overhead_p50_ms", "req_per_s", "server_cpu_ms_per_req"]
    table = {}
    for (variant, cache) in dict.fromkeys((r["variant"], r["cache"]) for r in rows):
        sel = [r for r in rows if r["variant"] == variant and r["cache"] == cache]
        table.setdefault(cache, {})[variant] = {k: float(np.mean([r[k] for r in sel])) for k in keys} | {
            "errors": sum(r["errors"] for r in sel), "requests": sum(r["requests"] for r in sel)}
    print(f"\nclient keys on the static head: {args.auth_clients} clients, {args.requests} prompts, "
          f"{args.auth_rounds} alternating rounds (means) | load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after\n")
    print("| prompts | server | e2e p50 | e2e p99 | router overhead p50 | req/s | server CPU/req | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for cache, per in table.items():
        for variant, m in per.items():
            print(f"| {cache} | {variant} | {m['e2e_p50_ms']:.1f} ms | {m['e2e_p99_ms']:.1f} ms | "
                  f"{m['overhead_p50_ms']:.2f} ms | {m['req_per_s']:.0f} | {m['server_cpu_ms_per_req']:.2f} ms | "
                  f"{m['errors']} |")
    out = Path(args.json) if args.json else bench_dir() / "serve_auth.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"clients": args.auth_clients, "table": table, "rows": rows,
                               "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}, indent=2))
    print(f"\nwrote {out}", file=sys.stderr)
    return 0


def summary(rows: list[dict], args) -> dict:
    """`clients` holds the goal's case (batched mode, new prompts, first dtype/threads); the rest alongside."""
    def table(mode: str, cache: str) -> dict:
        sel = [r for r in rows if r["mode"] == mode and r["cache"] == cache and r["dtype"] == args.dtype[0]
               and r["threads"] == args.threads[0]]
        return {str(r["clients"]): {"p50_ms": r["overhead_p50_ms"], "p99_ms": r["overhead_p99_ms"],
                                    "e2e_p50_ms": r["e2e_p50_ms"], "e2e_p99_ms": r["e2e_p99_ms"],
                                    "req_per_s": r["req_per_s"], "server_cpu_ms_per_req": r["server_cpu_ms_per_req"],
                                    "requests": r["requests"], "errors": r["errors"]} for r in sel}

    main_mode = "batched" if "batched" in args.modes else args.modes[0]
    out = {"mode": main_mode, "cache": "cold", "dtype": args.dtype[0], "clients": table(main_mode, "cold"),
           "warm": table(main_mode, "warm"), "cpus": os.cpu_count(),
           "goals": {str(c): {"p50_ms": p50, "p99_ms": p99} for c, (p50, p99) in GOALS_MS.items()}, "rows": rows}
    for m in [m for m in args.modes if m != main_mode]:
        out[m] = {"clients": table(m, "cold"), "warm": table(m, "warm")}
    return out


if __name__ == "__main__":
    sys.exit(main())
