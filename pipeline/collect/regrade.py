"""Regrade stored calls from their stored completions: zero API calls.

Used after a grading fix: `router-lite regrade`, or the Dagster job `regrade_calls` (graded_calls partitions with
the run tag `router_lite/regrade=true`, then the downstream assets).
"""
from __future__ import annotations

import logging

import pandas as pd

from pipeline.collect import bounded

log = logging.getLogger(__name__)


def regrade(calls: pd.DataFrame, tasks: pd.DataFrame, budget: bounded.Budget | None = None) -> tuple[pd.DataFrame, int]:
    """(calls with `extracted`/`correct` recomputed, number of rows whose grade changed). Errors stay ungraded;
    an empty reply stays wrong; calls of tasks not in `tasks` are left as they are. Grading runs under `budget`
    (pipeline/collect/bounded.py): a reply that overruns it or raises is graded as unparsable and logged."""
    gold = tasks.set_index("task_id")[["gold", "grader"]]
    out = calls.copy()
    changed = 0
    for i, c in out.iterrows():
        if c["status"] == "error" or c["task_id"] not in gold.index:
            continue
        g = gold.loc[c["task_id"]]
        extracted, correct, status = bounded.grade(c["response_text"], str(g["gold"]), g["grader"], budget)
        if status != "ok":
            log.warning("regrade: call %s: grading %s (graded as unparsable)", c.get("call_key"), status)
        correct = bool(correct) if c["status"] == "ok" else False
        changed += int(extracted != c["extracted"] or correct != c["correct"])
        out.at[i, "extracted"], out.at[i, "correct"] = extracted, correct
    return out, changed
