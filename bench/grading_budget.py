"""The cost of grading with a budget (issue 25) on recorded replies: per cascade decision (the K cheap agents'
replies to one prompt extracted, then every pair compared, as serve's cascade does), side by side in one run:

- `old`: the graders before issue 25 (grading.py at the given git revision), in process, on the event loop;
- `new`: pipeline/collect/bounded.py as serve runs it: the linear fast path in a thread, sympy in the worker;
- `worker_only`: every extraction and comparison sent to the worker (the other mechanism the issue names);
- `new_inline` and `thread_hop`: the new path's two parts, its grading called in process and an empty thread hop.

Requests alternate between the three so they share the machine's noise. Prints per-decision ms (median, mean, p99)
and the ratio to `old`, and how many jobs needed the worker.

    python bench/grading_budget.py [--n 300] [--k 3] [--old-rev main]
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.collect import bounded  # noqa: E402
from pipeline.collect.replay import data_dir  # noqa: E402
from pipeline.core.prompts import prompt_hash  # noqa: E402
from pipeline.tasks.sources import load_source  # noqa: E402


def old_grading(rev: str):
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:pipeline/collect/grading.py"], check=True,
                         capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_grading.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("old_grading", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["old_grading"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def requests(n: int, k: int, seed: int = 0) -> list[tuple[list[str], str]]:
    """(k recorded replies to one prompt, its grader): zeroeval GSM8K / MATH / CRUXEval and MMLU-Pro prompts."""
    tasks = pd.concat([load_source(s) for s in ("zeroeval_gsm8k", "zeroeval_math_l5", "zeroeval_crux")])
    tasks["prompt_hash"] = tasks["prompt"].map(prompt_hash)
    rec = pd.read_parquet(data_dir() / "replay" / "zeroeval_outputs.parquet").merge(
        tasks[["prompt_hash", "grader"]], on="prompt_hash")
    mm = pd.read_parquet(data_dir() / "replay" / "mmlu_pro_outputs.parquet").assign(grader="mcq_letter")
    out = []
    for df, share in ((rec, 0.75), (mm, 0.25)):
        groups = [(d["text"].tolist()[:k], d["grader"].iloc[0]) for _, d in df.groupby("prompt_hash")
                  if len(d) >= k]
        rng = np.random.default_rng(seed)
        out += [groups[i] for i in rng.choice(len(groups), int(n * share), replace=False)]
    return out


def decide_old(g, texts, grader):
    spec = g.grader_spec(grader)
    answers = [g.extract_answer(t, grader) for t in texts]
    return [spec.agree(a, b) for i, a in enumerate(answers) for b in answers[i + 1:]]


async def decide_new(texts, grader):
    return await bounded.grade_stage_async(dict(enumerate(texts)), {}, grader)  # as serve's run_cascade does


def decide_worker_only(texts, grader):
    from pipeline.collect.grading import grader_spec

    spec = grader_spec(grader)
    budget = bounded.default_budget()
    answers = [bounded._pool.call(bounded._extract_job, (spec, t), budget.budget_ms / 1000).value for t in texts]
    return [bounded._pool.call(bounded._agree_job, (spec, a, b), budget.budget_ms / 1000).value
            for i, a in enumerate(answers) for b in answers[i + 1:] if a is not None and b is not None and a != b]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--old-rev", default="main")
    a = ap.parse_args(argv)
    g_old = old_grading(a.old_rev)
    reqs = requests(a.n, a.k)
    bounded.warm_up(background=False)
    for texts, grader in reqs[:20]:  # warm both paths (sympy's lazy imports, the thread pool)
        decide_old(g_old, texts, grader)
        asyncio.run(decide_new(texts, grader))
    times = {"old": [], "new": [], "worker_only": [], "new_inline": [], "thread_hop": []}
    before = bounded.counts()

    async def run_all():
        for texts, grader in reqs:
            t = time.perf_counter()
            decide_old(g_old, texts, grader)
            times["old"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await decide_new(texts, grader)
            times["new"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await asyncio.to_thread(decide_worker_only, texts, grader)
            times["worker_only"].append(time.perf_counter() - t)
            t = time.perf_counter()
            bounded.grade_stage(dict(enumerate(texts)), {}, grader)
            times["new_inline"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await asyncio.to_thread(int)
            times["thread_hop"].append(time.perf_counter() - t)

    asyncio.run(run_all())
    after = bounded.counts()
    base = float(np.mean(times["old"]))
    print(f"{len(reqs)} decisions of {a.k} recorded replies each; budget {bounded.default_budget().budget_ms:g} ms")
    print("| path | median ms | mean ms | p99 ms | mean / old |\n|---|---|---|---|---|")
    for k, v in times.items():
        v = np.array(v) * 1000
        print(f"| {k} | {np.median(v):.2f} | {v.mean():.2f} | {np.percentile(v, 99):.2f} | "
              f"{v.mean() / (base * 1000):.2f} |")
    d = {k: after[k] - before[k] for k in after}
    print(f"new path: {d['jobs']} jobs, {d['worker_jobs']} needed the worker, {d['overruns']} overruns, "
          f"{d['errors']} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
