"""Collection benchmarks.

1. Throughput (default): graded calls/s of `pipeline.pool.collect` (real openai client, durable call log, grading)
   against a local OpenAI-protocol endpoint with a fixed 100 ms latency (tests/fault_server.py, its own process),
   at concurrency 8, 32, 128. The ideal rate is concurrency / latency; the ratio to it is printed
   (goal: >= 0.9 at 32). Each level makes enough calls for >= 3.5 s at the ideal rate.

       python bench/collect.py [--levels 8 32 128] [--latency-ms 100] [--seconds 3.5]

2. Replay accuracy (`--replay-accuracy`): the demo pool (5 replayed agents) on every MMLU-Pro question (bundled
   task source) recorded for all 5 demo models, through `collect` on the in-process replay transport, graded with
   `pipeline.grading`; per-model accuracy next to the official accuracy (pred == answer) of the TIGER-Lab files
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

import pandas as pd  # noqa: E402

from pipeline.calls import CallLog  # noqa: E402
from pipeline.pool import AgentSpec, CollectionSettings, collect  # noqa: E402
from resources.pool import http_client  # noqa: E402

OFFICIAL_DIR = Path("/work/shared/data/reward-matrices/mmlu-pro-tiger-eval-results")


def start_endpoint(latency_ms: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fault_server.py"), "--latency-ms", str(latency_ms)],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith("listening "):
        proc.kill()
        raise SystemExit(f"endpoint did not start: {line!r}")
    return proc, line.split(" ", 1)[1]


def throughput(levels: list[int], latency_ms: float, seconds: float) -> list[dict]:
    import openai

    proc, base_url = start_endpoint(latency_ms)
    results = []
    try:
        # warm-up (not timed): the SDK imports part of itself lazily on the first request
        warm = pd.DataFrame({"task_id": ["warm/test/000000"], "prompt": ["warm"], "gold": "A", "grader": "mcq_letter"})
        with tempfile.TemporaryDirectory(prefix="bench-warm-") as d:
            asyncio.run(collect(warm, [AgentSpec("warm", "m", "local", None, 0, 0)], 0, CallLog(d),
                                lambda a: openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)))
        for c in levels:
            limit = c / (latency_ms / 1000.0)
            n = math.ceil(limit * seconds)
            tasks = pd.DataFrame({"task_id": [f"bench/test/{i:06d}" for i in range(n)],
                                  "prompt": [f"bench c={c} question {i}" for i in range(n)], "gold": "A",
                                  "grader": "mcq_letter"})
            agent = AgentSpec("bench", "bench-model", "local", None, 1.0, 1.0)
            settings = CollectionSettings(concurrency=c, timeout_s=30, max_retries=0)
            with tempfile.TemporaryDirectory(prefix="bench-collect-") as d:
                log = CallLog(d)

                def client_for(a):  # what PoolResource(kind="openai_compatible").client_for builds
                    return openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0,
                                              http_client=http_client(30.0, max(256, c)))

                t0, cpu0 = time.perf_counter(), time.process_time()
                df = asyncio.run(collect(tasks, [agent], 0, log, client_for, settings))
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                log.close()
            graded = int(df["correct"].notna().sum())
            rate = graded / wall
            results.append({"concurrency": c, "calls": n, "graded": graded, "wall_s": round(wall, 2),
                            "calls_per_s": round(rate, 1), "limit_per_s": round(limit, 1),
                            "ratio": round(rate / limit, 3), "cpu_ms_per_call": round(cpu / n * 1000, 2),
                            "load_avg_1m": round(os.getloadavg()[0], 2)})
            print(f"concurrency {c:4d}: {graded}/{n} graded calls in {wall:.2f}s = {rate:7.1f}/s, "
                  f"limit {limit:.0f}/s, ratio {rate / limit:.3f} (collector CPU {cpu / n * 1000:.2f} ms/call, "
                  f"load avg {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)", flush=True)
    finally:
        proc.kill()
        proc.wait()
    return results


def replay_accuracy(official_dir: Path | None, concurrency: int = 64) -> dict:
    import zipfile

    from pipeline.pool import load_agents
    from pipeline.prompts import mcq_prompt
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
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.replay_accuracy:
        result = replay_accuracy(args.official_dir)
    else:
        result = throughput(args.levels, args.latency_ms, args.seconds)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
