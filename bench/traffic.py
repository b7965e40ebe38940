"""A simulated deployment, end to end, offline: does the served router learn from the traffic it serves?

1. the lineage (`router-lite run --profile P`) in a fresh home: the router the deployment starts with;
2. `router-lite serve` on that home with `--record-traffic --explore 1 --explore-usd-per-day CAP`, following promotions;
3. a stream of prompts the router was never trained on (recorded MMLU-Pro questions outside the profile's task pool,
   so the replay pool answers them; `--categories` for other topics than the benchmark's mix), cut in two by a seeded
   draw: the learned part is sent once, each request recorded and explored (every agent's reply, in the background,
   on the exploration's budget); the held-out part (`--held-out`, 25 %) is never sent before step 5;
4. the loop, as a deployment runs it: the `traffic_days` sensor is ticked and its run requests executed (the day's
   `traffic` partition: read, graded), the held-out part is sent to the router served (before), then the lineage's
   run (the schedule's retrain: the explored traffic's train and validation rows join the training rows) with its
   promotion gate (benchmark rows and the traffic's test rows); the running server follows a promotion;
5. the held-out part sent again, to the router served now (after); its replies graded last (the day's partition
   materialised again, after the loop: nothing in the lineage read the held-out part).

The served router's value on the held-out part, before and after, against the best single agent: quality (the served
reply's reward as graded in the `traffic` partition), cost (the decision's calls) and the OOD guard's firing rate.
Its last line is one JSON object: `before`, `after` (each {quality_ratio, cost_ratio, guard_rate, n}), `explore_usd`,
`explore_cap_usd`, `promoted` (the served router changed), the retrain's `gate` verdict and each step's seconds.

    python bench/traffic.py                                     # profile smoke, 400 stream prompts
    python bench/traffic.py --categories history,philosophy --stream 400   # topics the router never saw
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cli import lineage  # noqa: E402
from pipeline.collect.agents import load_agents  # noqa: E402
from pipeline.collect.replay import ReplayStore  # noqa: E402
from pipeline.collect.traffic_log import read_day  # noqa: E402
from pipeline.core.config import config_dir  # noqa: E402
from pipeline.profile import load_profile  # noqa: E402
from pipeline.serve.traffic import conversation_hash  # noqa: E402
from pipeline.tasks.sources import load_source  # noqa: E402
from resources.traffic import day_files  # noqa: E402

BIN = Path(sys.executable).parent / "router-lite"


def environment(home: Path, instance: Path) -> dict:
    """The lineage's environment: a fresh home, and an instance whose storage is under `instance` (the repository's
    dagster.yaml names its folders relative to the working directory: made absolute here, so neither the
    subprocesses nor this process's own Dagster calls write into the checkout)."""
    instance.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "dagster.yaml").read_text().replace("base_dir: .router-lite/dagster", f"base_dir: {instance}")
    (instance / "dagster.yaml").write_text(text)
    return {**os.environ, "ROUTER_LITE_HOME": str(home), "DAGSTER_HOME": str(instance), "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": str(ROOT)}


def run_lineage(profile: str, env: dict, cwd: Path) -> float:
    """`router-lite run`: the lineage's own steps (collection cached by the call log, embeddings by their cache)."""
    t0 = time.perf_counter()
    out = subprocess.run([str(BIN), "run", "--profile", profile], env=env, cwd=cwd, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"router-lite run failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return time.perf_counter() - t0


def stream_prompts(home: Path, profile, n: int, seed: int, categories: list[str] | None = None) -> list[str]:
    """`n` MMLU-Pro prompts outside the home's task pool (seeded) that the replay pool recorded for every agent of
    the profile's pool (so each request, and its exploration, gets a real recorded reply)."""
    pool = lineage.load("task_pool", profile.name, str(home))
    tasks = load_source("mmlu_pro")
    store = ReplayStore.load()
    models = [a.model for a in load_agents(config_dir() / "agents.yaml", profile.pool.name)]
    recorded = tasks["prompt"].map(lambda p: all(store.text_for(m, p) is not None for m in models))
    unseen = tasks[~tasks["task_id"].isin(pool["task_id"]) & recorded]
    if categories:  # traffic of other topics than the benchmark's mix
        unseen = unseen[unseen["category"].isin(categories)]
    pick = np.random.default_rng(seed).choice(len(unseen), size=min(n, len(unseen)), replace=False)
    return unseen.iloc[np.sort(pick)]["prompt"].tolist()


class Server:
    """`router-lite serve` on the home, recording and exploring, in its own process group (signalled as one)."""

    def __init__(self, profile: str, env: dict, cwd: Path, cap: float):
        self.proc = subprocess.Popen(
            [str(BIN), "serve", "--profile", profile, "--port", "0", "--record-traffic", "--explore", "1",
             "--explore-usd-per-day", str(cap), "--follow-interval", "2"],
            env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        deadline = time.monotonic() + 300
        for line in self.proc.stdout:  # the startup line names the port
            self.lines.append(line)
            m = re.search(r"on http://127\.0\.0\.1:(\d+)/v1", line)
            if m:
                self.url = f"http://127.0.0.1:{m.group(1)}/v1"
                break
            if time.monotonic() > deadline:
                break
        else:
            sys.exit("serve did not start:\n" + "".join(self.lines[-40:]))
        import threading

        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    def ask(self, prompts: list[str]) -> list[dict]:
        """Each prompt once (4 at a time); the decision headers of each reply."""
        def one(p):
            r = httpx.post(f"{self.url}/chat/completions", json={"messages": [{"role": "user", "content": p}]},
                           timeout=300)
            h = r.headers
            return {"status": r.status_code, "router": h.get("x-router-name"), "agent": h.get("x-router-agent"),
                    "ood": h.get("x-router-ood") == "true", "hash": conversation_hash([{"role": "user",
                                                                                       "content": p}])}
        with cf.ThreadPoolExecutor(4) as ex:
            return list(ex.map(one, prompts))

    def router(self) -> str | None:
        """The router served now (GET /v1/models lists it first)."""
        try:
            return httpx.get(f"{self.url}/models", timeout=30).json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            return None

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=120)


def explored_all(home: Path, day: str, timeout_s: float = 600) -> dict:
    """Wait until every request drawn for exploration has its exploration line; the day's log as read."""
    deadline = time.monotonic() + timeout_s
    while True:
        log = read_day(day_files(home, day))
        pending = [r for r in log.requests if r.request.explore and not r.explored and not r.explorations]
        if not pending or time.monotonic() > deadline:
            return log
        time.sleep(2)


def _defs_and_instance(home: Path, profile: str, env: dict):
    """The profile's Definitions on the home (cli/lineage.py's, as every bench reads the lineage) and the bench's
    instance (DAGSTER_HOME of `env`)."""
    os.environ.update({k: env[k] for k in ("ROUTER_LITE_HOME", "DAGSTER_HOME")})
    from dagster import DagsterInstance

    return lineage.definitions(profile, str(home)), DagsterInstance.get()


def tick_sensor(home: Path, profile: str, env: dict) -> list[str]:
    """The `traffic_days` sensor evaluated once and its run requests executed, as the daemon would."""
    from dagster import build_sensor_context

    defs, inst = _defs_and_instance(home, profile, env)
    with inst:
        result = defs.get_sensor_def("traffic_days")(
            build_sensor_context(instance=inst, resources={"storage": defs.resources["storage"]}))
        runs = getattr(result, "run_requests", None) or []
        for rr in runs:
            if not defs.resolve_job_def("traffic_job").execute_in_process(partition_key=rr.partition_key,
                                                                            instance=inst).success:
                sys.exit(f"traffic partition {rr.partition_key} failed")
    return [rr.partition_key for rr in runs]


def grade_day(home: Path, profile: str, env: dict, day: str) -> pd.DataFrame:
    """The day's `traffic` partition materialised now (the bench's own reading of the held-out part's replies,
    after the loop: nothing downstream reads it again), as stored."""
    defs, inst = _defs_and_instance(home, profile, env)
    with inst:
        if not defs.resolve_job_def("traffic_job").execute_in_process(partition_key=day, instance=inst).success:
            sys.exit(f"traffic partition {day} failed")
    return lineage.load("traffic", defs=defs, partition=day)


def scored(decisions: list[dict], rows: pd.DataFrame, best: str) -> dict[str, tuple]:
    """Per held-out prompt (conversation hash): (the served reply's reward, the decision's cost, the best single
    agent's reward and cost, whether the guard fired), from the graded traffic rows (every agent's reply: explored)."""
    graded = rows[rows["grade_state"].isin(["graded", "judged"])]
    by = graded.groupby(["conversation_hash", "agent"]).agg(reward=("reward", "mean"), cost=("cost_usd", "mean"))
    return {d["hash"]: (by.loc[(d["hash"], d["agent"]), "reward"], d["cost"], by.loc[(d["hash"], best), "reward"],
                        by.loc[(d["hash"], best), "cost"], d["ood"])
            for d in decisions if (d["hash"], d["agent"]) in by.index and (d["hash"], best) in by.index}


def figures(s: dict[str, tuple]) -> dict:
    """Quality and cost as fractions of the best single agent's on the same prompts; the guard's firing rate."""
    if not s:
        return {"quality_ratio": None, "cost_ratio": None, "guard_rate": None, "n": 0}
    q, c, qb, cb, ood = (np.array(x, dtype=float) for x in zip(*s.values()))
    return {"quality_ratio": round(float(q.mean() / qb.mean()), 4), "cost_ratio": round(float(c.sum() / cb.sum()), 4),
            "guard_rate": round(float(ood.mean()), 4), "n": len(q)}


def change(before: dict[str, tuple], after: dict[str, tuple], seed: int = 0) -> dict:
    """After − before on the prompts scored both times: quality and cost ratios with paired 95 % bootstrap CIs."""
    keys = sorted(set(before) & set(after))
    if not keys:
        return {}
    b, a = (np.array([d[k] for k in keys], dtype=float) for d in (before, after))
    rng, n = np.random.default_rng(seed), len(keys)
    boots = [(rng.integers(0, n, n)) for _ in range(2000)]

    def ci(col_q: int, col_best: int, f):
        d = [f(a[i], col_q, col_best) - f(b[i], col_q, col_best) for i in boots]
        return [round(float(np.percentile(d, 2.5)), 4), round(float(np.percentile(d, 97.5)), 4)]

    def quality(m, i, j):
        return m[:, i].mean() / m[:, j].mean()

    def cost(m, i, j):
        return m[:, i].sum() / m[:, j].sum()

    return {"n": n, "quality_ratio": round(float(quality(a, 0, 2) - quality(b, 0, 2)), 4),
            "quality_ratio_ci": ci(0, 2, quality), "cost_ratio": round(float(cost(a, 1, 3) - cost(b, 1, 3)), 4),
            "cost_ratio_ci": ci(1, 3, cost)}


def decision_costs(decisions: list[dict], log, router: str | None) -> None:
    """Each decision's cost: its calls' cost in the log (the request line of that prompt by that router)."""
    cost = {}
    for r in log.requests:
        req = r.request
        if router is None or req.router == router:
            cost[req.conversation_hash] = sum(cl.cost_usd or 0.0 for cl in req.calls)
    for d in decisions:
        d["cost"] = cost.get(d["hash"], float("nan"))


def gate_verdict(home: Path, profile: str) -> dict:
    """The retrain's promotion: its action, and what the benchmark rows and the traffic rows said."""
    out = lineage.load("promotion", profile, str(home))
    v = out.get("verdict") or {}
    return {"action": out.get("action"), "candidate": out.get("candidate"), "benchmark": v.get("benchmark_reason"),
            "traffic": (v.get("traffic") or {}).get("reason")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="smoke")
    ap.add_argument("--stream", type=int, default=400,
                    help="prompts the router never saw (default: %(default)s; the learned part must log at least "
                         "the profile's traffic.sensor_rows lines, 500 by default, for the sensor to read the open "
                         "day: a request and its exploration are two)")
    ap.add_argument("--explore-cap-usd", type=float, default=5.0, help="the exploration's cap per day")
    ap.add_argument("--categories", default=None, metavar="C1,C2",
                    help="stream only these MMLU-Pro categories (e.g. history,philosophy: the smoke profile's "
                         "out-of-distribution ones); default: every category")
    ap.add_argument("--held-out", type=float, default=0.25, metavar="SHARE",
                    help="the stream's share held out: sent only to measure, before and after the loop")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", default=None, metavar="DIR", help="work in DIR and keep it (default: a temp dir)")
    args = ap.parse_args(argv)
    work = Path(args.keep or tempfile.mkdtemp(prefix="bench-traffic-"))
    home, env = work / "home", environment(work / "home", work / "dagster")
    prof = load_profile(args.profile)
    seconds = {"lineage": run_lineage(args.profile, env, work)}
    value = json.loads((home / "reports" / "router_value.json").read_text())
    best = value["best_single"]["agent"]
    prompts = stream_prompts(home, prof, args.stream, args.seed,
                             args.categories.split(",") if args.categories else None)
    cut = np.random.default_rng(args.seed).random(len(prompts)) < args.held_out
    learn = [p for p, c in zip(prompts, cut) if not c]
    held = [p for p, c in zip(prompts, cut) if c]  # never sent before the loop has run: nothing learns from them
    server = Server(args.profile, env, work, args.explore_cap_usd)
    day = time.strftime("%Y-%m-%d", time.gmtime())
    try:
        t0 = time.perf_counter()
        server.ask(learn)
        explored_all(home, day)
        seconds["stream"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        partitions = tick_sensor(home, args.profile, env)  # the learned part, read and graded
        seconds["sensor"] = time.perf_counter() - t0
        before = server.ask(held)  # the router served now, on the held-out part
        served_before = before[0]["router"] if before else None
        seconds["retrain"] = run_lineage(args.profile, env, work)  # the schedule's retrain, its gate, a promotion
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and server.router() == served_before:  # the server follows (2 s poll)
            time.sleep(2)
        after = server.ask(held)
        explored_all(home, day)
    finally:
        server.stop()
    rows = grade_day(home, args.profile, env, day)  # every agent's graded reply to the held-out prompts
    log = read_day(day_files(home, day))
    for decisions in (before, after):
        decision_costs(decisions, log, decisions[0]["router"] if decisions else None)
    explore_usd = sum(e.usd for r in log.requests for e in r.explorations)
    out = {"profile": args.profile, "stream": len(learn), "held_out": len(held), "best_single": best,
           "partitions": partitions, "router_before": served_before,
           "router_after": after[0]["router"] if after else None,
           "promoted": bool(after and after[0]["router"] != served_before),
           "before": figures(scored(before, rows, best)), "after": figures(scored(after, rows, best)),
           "after_minus_before": change(scored(before, rows, best), scored(after, rows, best)),
           "gate": gate_verdict(home, args.profile),
           "explore_usd": round(explore_usd, 6), "explore_cap_usd": args.explore_cap_usd,
           "seconds": {k: round(v, 1) for k, v in seconds.items()}, "work": str(work)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
