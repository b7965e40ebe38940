"""How well traffic grading by agreement stands in for a gold answer, on the demo pool's recorded ZeroEval replies.

    python bench/traffic_agreement.py [--per-source 200] [--seed 0]

Writes `--per-source` questions of each ZeroEval source as explored traffic requests (every demo agent's recorded
reply, in the log format `router-lite serve` writes) into a scratch home, reads and grades them as the `traffic`
partition does (pipeline/collect/traffic.py: the reference is the answer a strict majority of the strongest agents
give), and compares with the benchmark's gold: per source the requests with a reference, the references equal to the
gold answer, and the share of calls whose grade equals their grade against the gold. Reads only bundled files.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.collect import bounded  # noqa: E402
from pipeline.collect.agents import load_agents  # noqa: E402
from pipeline.collect.grading import grader_spec  # noqa: E402
from pipeline.collect.traffic import TrafficSettings, traffic_reward_rows, traffic_rows  # noqa: E402
from pipeline.collect.traffic_log import read_day  # noqa: E402
from pipeline.core.prompts import routed_text  # noqa: E402
from resources.pool import default_agents_file  # noqa: E402
from resources.traffic import day_files, traffic_day_dir  # noqa: E402

DAY = "2026-11-30"
FORMATS = {"gsm": ("integer", "integer"), "math-l5": ("expression", "math_expression"),
           "crux": ("literal", "python_literal")}


def _call(agent: str, model: str, reply: str) -> dict:
    return {"agent": agent, "model": model, "reply": reply, "cost_usd": None, "latency_ms": 0.0,
            "finish_reason": "stop", "error": None}


def _lines(rid: str, prompt: str, replies: dict[str, tuple[str, str]], fmt: str) -> list[dict]:
    messages = [{"role": "user", "content": prompt}]
    agents = list(replies)
    head = {"v": 1, "request_id": rid, "ts": f"{DAY}T00:00:00.000Z", "day": DAY}
    return [{**head, "record": "request", "router": "bench", "target": None, "pool": agents,
             "agent_models": {a: m for a, (m, _) in replies.items()}, "routed_text": routed_text([prompt]),
             "messages": messages, "conversation_hash": hashlib.sha256(
                 json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest(),
             "decision": {"agent": agents[0], "policy": "bench", "ood": False, "format": fmt},
             "calls": [_call(agents[0], *replies[agents[0]])], "explore": True, "key_name": None},
            {**head, "record": "exploration", "calls": [_call(a, *replies[a]) for a in agents[1:]], "complete": True,
             "usd": 0.0}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-source", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    agents = load_agents(default_agents_file(), "demo")
    models = {a.name: a.model for a in agents}
    tasks = pd.read_parquet(ROOT / "data/sources/zeroeval/tasks.parquet")
    rec = pd.read_parquet(ROOT / "data/replay/zeroeval_outputs.parquet")
    rec = rec[rec["model"].isin(models.values())]
    text = {(q, m): x for q, m, x in zip(rec["question_id"], rec["model"], rec["text"])}
    sample = pd.concat([tasks[tasks["task"] == k].sample(args.per_source, random_state=args.seed) for k in FORMATS])
    home, lines, gold = Path(tempfile.mkdtemp()), [], {}
    for i, r in enumerate(sample.itertuples()):
        rid = uuid.UUID(int=i + 1).hex
        lines += _lines(rid, r.prompt, {a: (m, text[(r.qid, m)]) for a, m in models.items()}, FORMATS[r.task][0])
        g = r.gold.lstrip("#").strip().replace(",", "") if r.task == "gsm" else r.gold.strip()
        gold[f"traffic/{DAY}/{rid}"] = (g, FORMATS[r.task][1], r.task)
    path = traffic_day_dir(home, DAY) / "1.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines))
    t0 = time.perf_counter()
    rows = traffic_rows(read_day(day_files(home, DAY)).requests, DAY, agents, TrafficSettings(),
                        {"train": 0.6, "validation": 0.2, "test": 0.2})
    took = time.perf_counter() - t0
    rows["source"] = rows["task_id"].map(lambda t: gold[t][2])
    for src, d in rows.groupby("source"):
        g = d[d["grade_state"] == "graded"]
        vs_gold = [bounded.grade(x, gold[t][0], gold[t][1])[1] for x, t in zip(g["response_text"], g["task_id"])]
        refs = g.drop_duplicates("task_id")
        right = sum(grader_spec(gold[t][1]).equal(str(a), gold[t][0]) for a, t in zip(refs["reference"],
                                                                                     refs["task_id"]))
        same = float((g["correct"].astype(bool).to_numpy() == pd.Series(vs_gold).to_numpy()).mean()) if len(g) else 0
        print(f"{src:8s} requests {d['task_id'].nunique()}  with a reference {refs['task_id'].nunique()}  "
              f"reference = gold {right}  call grade = gold grade {same:.3f}")
    print(f"reward rows {len(traffic_reward_rows(rows, list(models)))} of {rows['task_id'].nunique()} requests; "
          f"{len(rows)} calls graded in {took:.1f} s")


if __name__ == "__main__":  # the grading workers import this module: nothing runs on import
    main()
