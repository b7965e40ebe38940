"""Collection benchmarks.

1. Throughput (default): graded calls/s of `pipeline.collect.calls.collect` (real openai client, durable call log,
   grading) against a local OpenAI-protocol endpoint with a fixed 100 ms latency (tests/fault_server.py, its own
   process), at concurrency 8, 32, 128. The ideal rate is concurrency / latency; the ratio to it is printed
   (goal: >= 0.9 at each level). Each level makes enough calls for >= 3.5 s at the ideal rate. When one process
   misses the goal at a level and the machine has more than one core, the level is measured again sharded over
   `--processes` collector processes (default: the core count), each with concurrency/N and its own call log - what
   separate `graded_calls` partitions do - and the bench says so. Writes
   $ROUTER_LITE_HOME/bench/collect.json {"concurrency": {"8": ratio, ...}, "levels": [...]}.

       python bench/collect.py [--levels 8 32 128] [--latency-ms 100] [--seconds 3.5] [--processes N]

2. Realistic latencies (`--realistic`, also part of the default run): the same collector against
   bench/realistic_endpoint.py (its own process): lognormal latency, median 2 s, p99 20 s (capped at 60 s), 2 % of
   first requests answered 429 + Retry-After 1 s, every time multiplied by `--time-scale` (default 1: the provider's
   own times; 0.5 halves the run and doubles the call rate), at concurrency 32, 128, 512. Each level makes
   `--realistic-generations` x concurrency calls (default 10: each slot is reused ~10 times, ~35 s of issuing plus
   the tail's drain, at most the 60 s cap). The ratio is the time-averaged number of calls in flight (at the
   endpoint, or in a Retry-After wait the endpoint imposed) over the concurrency limit, from the first request to the
   start of the last new call (after that, slots empty by necessity): by Little's law that is calls/s over the limit
   (concurrency / mean latency) without the heavy tail's sampling noise. Also: collector CPU per call, and lost (a
   task without exactly one graded row, or no 200 reply) / doubled (a prompt answered 200 more than once) calls
   (goal: >= 0.95, 0, 0). Written under "realistic" in collect.json.

       python bench/collect.py --realistic [--realistic-levels 32 128 512] [--time-scale 1]

3. Replay accuracy (`--replay-accuracy`): the demo pool (5 replayed agents) on every MMLU-Pro question (bundled
   task source) recorded for all 5 demo models, through `collect` on the in-process replay transport, graded with
   `pipeline.collect.grading`; per-model accuracy next to the official accuracy (pred == answer) of the TIGER-Lab files
   on the same questions (when `--official-dir` holds them).

       python bench/collect.py --replay-accuracy [--official-dir DIR] [--json OUT]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd

from pipeline.collect.agents import AgentSpec
from pipeline.collect.call_log import CallLog
from pipeline.collect.calls import collect
from pipeline.collect.settings import CollectionSettings
from resources.pool import http_client

OFFICIAL_DIR = Path("/work/shared/data/reward-matrices/mmlu-pro-tiger-eval-results")


def start_endpoint(latency_ms: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fault_server.py"), "--latency-ms", str(latency_ms)],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith("listening "):
        proc.kill()
        raise SystemExit(f"endpoint did not start: {line!r}")
    return proc, line.split(" ", 1)[1]


def _bench_tasks(c: int, n: int, shard: int = 0) -> pd.DataFrame:
    return pd.DataFrame({"task_id": [f"bench/test/{shard:02d}{i:06d}" for i in range(n)],
                         "prompt": [f"bench c={c} shard {shard} question {i}" for i in range(n)], "gold": "A",
                         "grader": "mcq_letter"})


def _collect_level(base_url: str, c: int, n: int, shard: int = 0, go_at: float | None = None, timeout_s: float = 30,
                   max_retries: int = 0, rows: bool = False) -> dict:
    """One collector: `n` calls at concurrency `c` into a fresh call log; wall clock from `go_at` (epoch s) if given.
    `rows`: also return (task_id, status, correct) of every result row (the lost / doubled check)."""
    import openai

    tasks = _bench_tasks(c, n, shard)
    agent = AgentSpec("bench", "bench-model", "local", None, 1.0, 1.0)
    settings = CollectionSettings(concurrency=c, timeout_s=timeout_s, max_retries=max_retries)
    with tempfile.TemporaryDirectory(prefix="bench-collect-") as d:
        log = CallLog(d)

        def client_for(a):  # what PoolResource(kind="openai_compatible").client_for builds
            return openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0,
                                      http_client=http_client(30.0, max(256, c)))

        if go_at is not None:
            time.sleep(max(0.0, go_at - time.time()))
        t0, cpu0 = time.time(), time.process_time()
        df = asyncio.run(collect(tasks, [agent], 0, log, client_for, settings))
        t1, cpu = time.time(), time.process_time() - cpu0
        log.close()
    out = {"t0": t0, "t1": t1, "graded": int(df["correct"].notna().sum()), "cpu_s": cpu}
    if rows:
        out["rows"] = list(zip(df["task_id"].astype(str), df["status"].astype(str), df["correct"].notna()))
        out["prompts"] = dict(zip(tasks["task_id"], tasks["prompt"]))
    return out


def _shard_main(args):  # a top-level function: picklable for the process pool
    return _collect_level(*args)


def _sharded_level(base_url: str, c: int, n: int, processes: int, timeout_s: float = 30, max_retries: int = 0,
                   rows: bool = False) -> dict:
    import concurrent.futures
    import multiprocessing

    per = [c // processes + (1 if i < c % processes else 0) for i in range(processes)]
    calls = [n // processes + (1 if i < n % processes else 0) for i in range(processes)]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=ctx) as ex:
        list(ex.map(_shard_main, [(base_url, 1, 1, 90 + i, None) for i in range(processes)]))  # imports + warm-up
        go_at = time.time() + 0.5
        parts = list(ex.map(_shard_main, [(base_url, per[i], calls[i], i, go_at, timeout_s, max_retries, rows)
                                          for i in range(processes)]))
    out = {"t0": go_at, "t1": max(p["t1"] for p in parts), "graded": sum(p["graded"] for p in parts),
           "cpu_s": sum(p["cpu_s"] for p in parts)}
    if rows:
        out["rows"] = [r for p in parts for r in p["rows"]]
        out["prompts"] = {k: v for p in parts for k, v in p["prompts"].items()}
    return out


def throughput(levels: list[int], latency_ms: float, seconds: float, processes: int = 0) -> list[dict]:
    proc, base_url = start_endpoint(latency_ms)
    processes = processes or (os.cpu_count() or 1)
    results = []
    try:
        _collect_level(base_url, 1, 1, 99)  # warm-up (not timed): the SDK imports part of itself lazily
        for c in levels:
            limit = c / (latency_ms / 1000.0)
            n = math.ceil(limit * seconds)
            tries = [(1, _collect_level(base_url, c, n))]
            ratio1 = tries[0][1]["graded"] / (tries[0][1]["t1"] - tries[0][1]["t0"]) / limit
            if ratio1 < 0.9 and processes > 1 and c >= processes:
                tries.append((processes, _sharded_level(base_url, c, n, processes)))
            for nproc, r in tries:
                wall = r["t1"] - r["t0"]
                rate = r["graded"] / wall
                results.append({"concurrency": c, "processes": nproc, "calls": n, "graded": r["graded"],
                                "wall_s": round(wall, 2), "calls_per_s": round(rate, 1), "limit_per_s": round(limit, 1),
                                "ratio": round(rate / limit, 3), "cpu_ms_per_call": round(r["cpu_s"] / n * 1000, 2),
                                "load_avg_1m": round(os.getloadavg()[0], 2)})
                how = "1 process" if nproc == 1 else f"sharded over {nproc} processes (concurrency/{nproc} each)"
                print(f"concurrency {c:4d}, {how}: {r['graded']}/{n} graded calls in {wall:.2f}s = {rate:7.1f}/s, "
                      f"limit {limit:.0f}/s, ratio {rate / limit:.3f} (collector CPU {r['cpu_s'] / n * 1000:.2f} "
                      f"ms/call, load avg {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)", flush=True)
    finally:
        proc.kill()
        proc.wait()
    return results


def summary(results: list[dict]) -> dict:
    """{"concurrency": {level: best ratio}, "processes": {level: processes of that ratio}, "levels": rows}."""
    best: dict[str, dict] = {}
    for r in results:
        k = str(r["concurrency"])
        if k not in best or r["ratio"] > best[k]["ratio"]:
            best[k] = r
    return {"concurrency": {k: v["ratio"] for k, v in best.items()},
            "processes": {k: v["processes"] for k, v in best.items()}, "cores": os.cpu_count(), "levels": results}


def _get_stats(base_url: str, reset: bool = False) -> dict:
    import httpx

    return httpx.get(base_url.rsplit("/v1", 1)[0] + "/stats" + ("?reset=1" if reset else ""), timeout=60).json()


def in_flight_ratio(events: list, c: int) -> dict:
    """Calls in flight (at the endpoint, or waiting out a Retry-After it imposed), time-averaged from the first
    request to the first request of the last new prompt, over the limit `c`."""
    first_hit: dict[str, float] = {}
    for t_in, _, _, h, _ in events:
        first_hit[h] = min(t_in, first_hit.get(h, t_in))
    starts = sorted(first_hit.values())
    w1 = starts[-1]

    def ratio(w0: float) -> float:
        busy = 0.0
        for t_in, t_out, status, _, extra in events:
            end = t_out + (float(extra) if status == 429 else 0.0)  # the wait the endpoint imposed is its time too
            busy += max(0.0, min(end, w1) - max(t_in, w0))
        return busy / (c * (w1 - w0)) if w1 > w0 else float("nan")

    # ratio: from the first request (the ramp of starting c calls counts); steady: from the c-th new call's start
    ramp_end = starts[min(c, len(starts)) - 1]
    return {"ratio": ratio(starts[0]), "window_s": w1 - starts[0], "ramp_s": ramp_end - starts[0],
            "ratio_after_ramp": ratio(ramp_end)}


def realistic(levels: list[int], time_scale: float, generations: float, processes: int = 0) -> dict:
    """Collection against bench/realistic_endpoint.py (module docstring, part 2)."""
    k = time_scale
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "realistic_endpoint.py"), "--time-scale", str(k)],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith("listening "):
        proc.kill()
        raise SystemExit(f"realistic endpoint did not start: {line!r}")
    base_url = line.split(" ", 1)[1]
    processes = processes or (os.cpu_count() or 1)
    timeout_s = 60.0 * k + 30.0  # above the endpoint's latency cap: no call times out
    rows, lost_total, doubled_total = [], 0, 0
    try:
        _collect_level(base_url, 1, 1, 99)  # warm-up (not timed)
        _get_stats(base_url, reset=True)
        for c in levels:
            n = int(math.ceil(c * generations))
            tries = [1] + ([processes] if processes > 1 and c >= processes else [])
            for nproc in tries:
                r = (_collect_level(base_url, c, n, 0, None, timeout_s, 3, True) if nproc == 1
                     else _sharded_level(base_url, c, n, nproc, timeout_s, 3, True))
                stats = _get_stats(base_url, reset=True)
                ev = stats["events"]
                flight = in_flight_ratio(ev, c)
                ok_by_prompt: dict[str, int] = {}
                for _, _, status, h, _ in ev:
                    if status == 200:
                        ok_by_prompt[h] = ok_by_prompt.get(h, 0) + 1
                graded: dict[str, int] = {}
                for tid, status, has_grade in r["rows"]:
                    graded[tid] = graded.get(tid, 0) + int(status == "ok" and bool(has_grade))
                lost = sum(1 for tid, p in r["prompts"].items()
                           if graded.get(tid, 0) == 0 or ok_by_prompt.get(_phash(p), 0) == 0)
                doubled = (sum(1 for v in ok_by_prompt.values() if v > 1) + sum(1 for v in graded.values() if v > 1)
                           + sum(1 for row in r["rows"] if row[0] not in r["prompts"]))
                wall = r["t1"] - r["t0"]
                lat = [e[4] for e in ev if e[2] == 200]
                n429 = sum(1 for e in ev if e[2] == 429)
                row = {"concurrency": c, "processes": nproc, "calls": n, "graded": r["graded"],
                       "ratio": round(flight["ratio"], 4), "window_s": round(flight["window_s"], 1),
                       "ramp_s": round(flight["ramp_s"], 2), "ratio_after_ramp": round(flight["ratio_after_ramp"], 4),
                       "wall_s": round(wall, 1), "calls_per_s": round(r["graded"] / wall, 1),
                       "whole_run_over_limit": round(r["graded"] / wall / (c / (sum(lat) / len(lat))), 3),
                       "latency_p50_s": round(float(pd.Series(lat).median()), 3),
                       "latency_p99_s": round(float(pd.Series(lat).quantile(0.99)), 3), "rate_limited": n429,
                       "cpu_ms_per_call": round(r["cpu_s"] / n * 1000, 2), "lost": lost, "doubled": doubled,
                       "load_avg_1m": round(os.getloadavg()[0], 2)}
                rows.append(row)
                lost_total, doubled_total = lost_total + lost, doubled_total + doubled
                print(f"realistic concurrency {c:4d} ({nproc} process{'es' if nproc > 1 else ''}): {n} calls, "
                      f"in flight {row['ratio']:.3f} of the limit over {row['window_s']} s "
                      f"({row['ratio_after_ramp']:.3f} after the {row['ramp_s']} s ramp to {c} calls), "
                      f"{row['calls_per_s']}/s, "
                      f"{n429} x 429, CPU {row['cpu_ms_per_call']} ms/call, lost {lost}, doubled {doubled} "
                      f"(load avg {row['load_avg_1m']})", flush=True)
                if row["ratio"] >= 0.95:
                    break  # one process suffices: no sharded retry
    finally:
        proc.kill()
        proc.wait()
    best: dict[str, dict] = {}
    for r in rows:
        if str(r["concurrency"]) not in best or r["ratio"] > best[str(r["concurrency"])]["ratio"]:
            best[str(r["concurrency"])] = r
    return {"concurrency": {k: v["ratio"] for k, v in best.items()},
            "processes": {k: v["processes"] for k, v in best.items()},
            "cpu_ms_per_call": {k: v["cpu_ms_per_call"] for k, v in best.items()},
            "lost": lost_total, "doubled": doubled_total, "time_scale": k, "generations": generations,
            "endpoint": {"median_s": 2.0 * k, "p99_s": 20.0 * k, "cap_s": 60.0 * k, "p429_first_request": 0.02,
                         "retry_after_s": 1.0 * k},
            "goal": {"ratio": 0.95, "lost": 0, "doubled": 0}, "levels": rows}


def _phash(prompt: str) -> str:
    """tests/fault_server.py's prompt hash (what the endpoint logs)."""
    import hashlib

    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def replay_accuracy(official_dir: Path | None, concurrency: int = 64) -> dict:
    import zipfile

    from pipeline.collect.agents import load_agents
    from pipeline.core.prompts import mcq_prompt
    from resources.pool import PoolResource

    res = PoolResource(kind="replay", pool="mmlu_pro")
    agents = load_agents(ROOT / "config" / "agents.yaml", "mmlu_pro")
    store = res.store()
    src = pd.read_parquet(ROOT / "data" / "sources" / "mmlu_pro" / "test.parquet")
    src["prompt"] = [mcq_prompt(q, list(o)) for q, o in zip(src.question, src.options)]
    covered = src[[all(store.text_for(a.model, p) is not None for a in agents) for p in src.prompt]]
    per_model_recorded = {a.model: int(sum(store.text_for(a.model, p) is not None for p in src.prompt))
                          for a in agents}
    tasks = pd.DataFrame({"task_id": [f"mmlu_pro/test/{int(q):06d}" for q in covered.question_id],
                          "prompt": covered.prompt, "gold": covered.answer, "grader": "mcq_letter"})
    with tempfile.TemporaryDirectory(prefix="replay-acc-") as d:
        t0 = time.perf_counter()
        df = asyncio.run(collect(tasks, agents, 0, CallLog(d), res.client_for,
                                 CollectionSettings(concurrency=concurrency)))
        wall = time.perf_counter() - t0
    qid = dict(zip(tasks.task_id, covered.question_id.astype(int)))
    df["question_id"] = df.task_id.map(qid)
    out = {"questions_in_source": len(src), "questions_recorded_for_all_demo_agents": len(covered),
           "recorded_per_model": per_model_recorded, "calls": len(df), "wall_s": round(wall, 1),
           "status_counts": df.status.value_counts().to_dict(), "models": {}}
    official = {}
    if official_dir is not None and official_dir.exists():
        for a in agents:
            with zipfile.ZipFile(official_dir / f"model_outputs_{a.model}_5shots.zip") as zf:
                recs = [r for r in json.loads(zf.read(zf.namelist()[0])) if isinstance(r, dict)]
            official[a.model] = {int(r["question_id"]): r.get("pred") == r["answer"] for r in recs}
    qset = set(covered.question_id.astype(int))
    for a in agents:
        sub = df[df.agent == a.name]
        row = {"agent": a.name, "calls": len(sub), "errors": int((sub.status == "error").sum()),
               "empty": int((sub.status == "empty").sum()),
               "unextracted": int(sub.extracted.isna().sum()),
               "accuracy": round(float(sub.correct.fillna(False).astype(bool).mean()), 4)}
        if a.model in official:
            off = official[a.model]
            row["official_acc_same_questions"] = round(sum(off[q] for q in qset) / len(qset), 4)
            row["official_acc_all_12032"] = round(sum(off.values()) / 12032, 4)
            both = sub.set_index("question_id").correct.astype(bool)
            row["agree_with_official_pred"] = round(float(sum(both[q] == off[q] for q in qset) / len(qset)), 4)
        out["models"][a.model] = row
        print(json.dumps({a.model: row}), flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--latency-ms", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=3.5)
    ap.add_argument("--replay-accuracy", action="store_true")
    ap.add_argument("--official-dir", type=Path, default=OFFICIAL_DIR)
    ap.add_argument("--processes", type=int, default=0, help="collector processes for a sharded retry "
                    "(default: the core count; 1 = never shard)")
    ap.add_argument("--json", type=Path, help="also write the result here")
    ap.add_argument("--realistic", action="store_true", help="only the realistic-latency part (part 2)")
    ap.add_argument("--no-realistic", action="store_true", help="skip the realistic-latency part")
    ap.add_argument("--realistic-levels", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--time-scale", type=float, default=1.0, help="multiplies the realistic endpoint's times")
    ap.add_argument("--realistic-generations", type=float, default=10.0,
                    help="calls per level = this x concurrency")
    args = ap.parse_args(argv)
    home = Path(os.environ.get("ROUTER_LITE_HOME", ROOT / ".router-lite"))
    out = home / "bench" / "collect.json"
    if args.replay_accuracy:
        result = replay_accuracy(args.official_dir)
        print(json.dumps(result, indent=2))
    else:
        if args.realistic:  # keep the 100 ms figures of an earlier run
            result = json.loads(out.read_text()) if out.is_file() else {}
        else:
            result = summary(throughput(args.levels, args.latency_ms, args.seconds, args.processes))
            print(f"\n{'concurrency':>11} {'ratio':>6} {'processes':>9}   (goal >= 0.9; {args.latency_ms:.0f} ms "
                  "endpoint)")
            for k, v in result["concurrency"].items():
                print(f"{k:>11} {v:>6.3f} {result['processes'][k]:>9}")
        if not args.no_realistic:
            result["realistic"] = realistic(args.realistic_levels, args.time_scale, args.realistic_generations,
                                            args.processes)
            rr = result["realistic"]
            print(f"\nrealistic (lognormal median {rr['endpoint']['median_s']} s, p99 {rr['endpoint']['p99_s']} s, "
                  f"time x{args.time_scale}): in flight / limit {rr['concurrency']}, lost {rr['lost']}, doubled "
                  f"{rr['doubled']} (goal >= 0.95, 0, 0)")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"# wrote {out}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
