"""Routed benchmark: a multiple-choice file routed question by question, the picked agent's real reply scored.

Benchmark file (JSONL, CSV or Parquet), one question per row:
    id        str   question id
    question  str   the stem
    options   list  option texts, lettered A, B, C, ... in order
    answer    str   gold letter
    group     str   difficulty or category the report breaks down by (optional; `category`/`difficulty` accepted)
The prompt sent is `pipeline.core.prompts.mcq_prompt(question, options)`, the same format the pool was measured with.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.core.errors import RouterLiteError
from pipeline.core.prompts import LETTERS, mcq_prompt
from pipeline.report.frontier import HULL, PRIOR
from pipeline.tasks.sources import read_table

# The names the benchmark report reads back, in one place. Policies of its frontier table (beside the baselines of
# pipeline.report.frontier.baseline_policies):
HEAD_POINTS = "router (operating points)"  # what the registered head does at each stored λ, guard included
HEAD = "trained head"  # the head's frontier: the better on validation of its score sweep and its λ-trained heads
HEAD_SCORE_SWEEP = "trained head (score sweep)"  # the other one, shown too
HEAD_LAMBDA = "trained head (λ-trained)"
KNN = "kNN router"
CASCADE_POLICY_NAMES = {"cascade": "cascade (answers)", "combined": "cascade + prompt router"}
# Targets: the cascade's routed benchmark runs these besides the report's own target and the serving target (the
# headline's: pipeline.report.value.report_headline).
CASCADE_TARGETS = ("parity", "quality>=0.98")


def load_benchmark(path: str | Path) -> pd.DataFrame:
    rows = read_table(Path(path))
    out = []
    for i, r in enumerate(rows):
        where = f"{path}: row {i}"
        for col in ("question", "options", "answer"):
            if r.get(col) is None or (isinstance(r.get(col), str) and not r[col].strip()):
                raise RouterLiteError(f"{where}: missing {col!r}")
        options = list(r["options"])
        gold = str(r["answer"]).strip().upper()
        if gold not in LETTERS[:len(options)]:
            raise RouterLiteError(f"{where}: answer {gold!r} is not one of the {len(options)} option letters")
        out.append({"id": str(r.get("id", i)), "prompt": mcq_prompt(r["question"], options), "gold": gold,
                    "grader": "mcq_letter",
                    "group": str(r.get("group") or r.get("category") or r.get("difficulty") or "all")})
    return pd.DataFrame(out)


def benchmark_from_tasks(tasks: pd.DataFrame) -> pd.DataFrame:
    """The demo benchmark: pool tasks (already in prompt form, with their grader) as benchmark rows."""
    out = pd.DataFrame({"id": tasks["task_id"], "prompt": tasks["prompt"], "gold": tasks["gold"],
                        "group": tasks["category"].where(tasks["category"] != "", tasks["difficulty"]),
                        "grader": tasks["grader"]})
    if "user_text" in tasks:  # what a router embeds (pipeline.core.prompts.task_texts); agents get the prompt
        out["user_text"] = tasks["user_text"]
    return out


def score(bench: pd.DataFrame, picks: np.ndarray, fired: np.ndarray, calls: pd.DataFrame,
          agents: list[str]) -> dict:
    """Per-question table of the routed answers + summary, per group, per agent and oracle on the same questions.

    `calls` holds one graded call per (id as task_id, agent): the real replies of the pool on these questions.
    """
    from pipeline.collect.rewards import call_rewards

    calls = calls.assign(reward=call_rewards(calls))  # a judged call's probability, else 1 / 0 for right / wrong
    by = calls.set_index(["task_id", "agent"])
    rows = []
    for i, q in bench.reset_index(drop=True).iterrows():
        agent = agents[int(picks[i])]
        c = by.loc[(q["id"], agent)]
        rows.append({"id": q["id"], "group": q["group"], "picked_agent": agent, "ood_guard": bool(fired[i]),
                     "status": c["status"], "answer": c["extracted"], "gold": q["gold"],
                     "correct": float(c["reward"]),
                     "cost_usd": float(c["cost_usd"] or 0.0), "latency_ms": float(c["latency_ms"] or 0.0)})
    per_q = pd.DataFrame(rows)
    ok = calls[calls["status"] != "error"]
    single = ok.assign(correct=ok["reward"]).pivot_table(
        index="task_id", columns="agent", values="correct").reindex(columns=agents)
    comparison = pd.DataFrame(
        [{"policy": "router", "accuracy": per_q["correct"].mean(), "cost_usd": per_q["cost_usd"].sum()}]
        + [{"policy": a, "accuracy": single[a].mean(),
            "cost_usd": calls[calls["agent"] == a]["cost_usd"].fillna(0).sum()} for a in agents]
        + [{"policy": "oracle", "accuracy": single.max(axis=1).mean(), "cost_usd": float("nan")}])
    groups = per_q.groupby("group").agg(n=("correct", "size"), router_accuracy=("correct", "mean")).join(
        single.join(bench.set_index("id")["group"]).groupby("group")[agents].mean())
    return {
        "per_question": per_q, "comparison": comparison, "by_group": groups.reset_index(),
        "summary": {"n": len(per_q), "accuracy": float(per_q["correct"].mean()),
                    "empty_responses": int((per_q["status"] == "empty").sum()),
                    "errors": int((per_q["status"] == "error").sum()),
                    "ood_guard_fired": float(per_q["ood_guard"].mean()),
                    "distribution": per_q["picked_agent"].value_counts(normalize=True).round(4).to_dict(),
                    "cost_usd": float(per_q["cost_usd"].sum()), "mean_latency_ms": float(per_q["latency_ms"].mean())},
    }


def cascade_benchmark(bench: pd.DataFrame, X: np.ndarray, view_of, collect, order, agents: list[str]) -> dict:
    """The routed benchmark of a cascade: per question its grader's policy (`view_of(grader)` -> a registry
    CascadeView), every stage's calls really made through `collect(agent_index, bench_rows) -> graded call rows`
    (task_id, status, extracted, correct, cost_usd), the accepted reply scored. Returns summary + per question."""
    from pipeline.collect.grading import grader_spec
    from pipeline.route.cascade import execute

    bench = bench.reset_index(drop=True)
    graders = bench["grader"].astype(str).to_numpy()
    policies, direct, fired = [None] * len(bench), np.full(len(bench), -1), np.zeros(len(bench), dtype=bool)
    for g in sorted(set(graders)):
        m = np.flatnonzero(graders == g)
        view = view_of(g)
        picks, f = view.route(X[m])
        for k, i in enumerate(m):
            policies[i], direct[i], fired[i] = view.policy, picks[k], f[k]

    from pipeline.collect.rewards import call_rewards

    def ask(j: int, rows: list[int]) -> dict:
        calls = collect(j, bench.iloc[rows])
        calls = calls[calls["agent"] == agents[j]] if "agent" in calls else calls  # a judge's reference: not routed
        calls = calls.assign(reward=call_rewards(calls)).set_index("task_id")
        out = {}
        for i in rows:
            c = calls.loc[bench.at[i, "id"]]
            ok = c["status"] == "ok"
            out[i] = (c["extracted"] if ok and isinstance(c["extracted"], str) else None,
                      float(c["reward"]), float(c["cost_usd"] or 0.0))
        return out

    o = execute(policies, direct, order, ask, lambda i, a, b: grader_spec(graders[i]).agree(a, b))
    per_q = pd.DataFrame({"id": bench["id"], "group": bench["group"], "grader": graders,
                          "answered_by": [agents[j] if j >= 0 else "" for j in o.answered_by],
                          "stage": o.stage, "calls": o.n_calls, "ood_guard": fired, "correct": o.reward,
                          "cost_usd": o.cost})
    shares = per_q["answered_by"].value_counts(normalize=True).to_dict()
    return {"per_question": per_q,
            "summary": {"n": len(per_q), "accuracy": float(o.reward.mean()), "cost_usd": float(o.cost.sum()),
                        "cost_per_1k": float(1000 * o.cost.mean()), "calls_per_query": float(o.n_calls.mean()),
                        "answered_by": {k: float(v) for k, v in shares.items()},
                        "ood_guard_fired": float(fired.mean())}}


# ------------------------------------------------------------------------------------------------ the report text
def variant_markdown(variant: str, res: dict, cost_basis: str | None = None) -> list[str]:
    """The routed benchmark of the prompt router on one variant (`score`'s result), as Markdown lines."""
    s = res["summary"]
    return ([f"Cost columns (USD): {cost_basis}.", ""] if cost_basis is not None else []) + [
        f"### {variant}: n={s['n']}, router accuracy {s['accuracy']:.4f}, OOD guard fired on "
        f"{s['ood_guard_fired']:.1%}, empty {s['empty_responses']}, errors {s['errors']}", "",
        res["comparison"].to_markdown(index=False, floatfmt=".4f"), "",
        f"Routing distribution: {s['distribution']}", "",
        "<details><summary>by group</summary>", "",
        res["by_group"].to_markdown(index=False, floatfmt=".3f"), "", "</details>", ""]


def cascade_line(variant: str, target: str, s: dict) -> str:
    """One routed-benchmark line of the cascade (`cascade_benchmark`'s summary) at one target."""
    return (f"- {variant}, target {target}: n={s['n']}, accuracy {s['accuracy']:.4f}, "
            f"${s['cost_per_1k']:.3f} per 1k, {s['calls_per_query']:.2f} calls per query, answered by "
            + ", ".join(f"{a} {v:.0%}" for a, v in s["answered_by"].items()))


def head_aiq(aiq: dict) -> dict:
    """The AIQ entries of router_value.json from the frontier table's AIQ by policy name (`head`: the cost–quality
    policy the head ships, its operating points on test; the trained head without them)."""
    return {"head": aiq.get(HEAD_POINTS, aiq.get(HEAD)), "prior": aiq.get(PRIOR), "hull": aiq.get(HULL),
            "knn": aiq.get(KNN)}


def report_markdown(profile: str, head: str, point: dict, routed: list[str], cascade: str, cascade_routed: list[str],
                    value_section: list[str], frontier_section: list[str]) -> str:
    """benchmark_report.md: the value section, the routed benchmarks (prompt router, then cascade), the frontier."""
    return "\n".join(value_section + [
        f"## Routed benchmark ({profile}, head {head}), target {point['target']} (λ {point['lambda']:.4g})", "",
        *routed, f"## Routed benchmark of the cascade ({cascade}): every stage's calls made through the pool", "",
        *cascade_routed, ""] + frontier_section)
