"""The gate's traffic evidence: the candidate against the promoted router on held-out rows of this deployment's own
traffic (the task pool's source `traffic`, test split), beside the benchmark rows (pipeline/report/promotion_gate.py).

Only rows where every agent either router can ask replied are compared (explored requests; `replied` in the
evidence): there both routers' outcomes are read off replies that were collected whatever the served router decided,
so the paired difference is an unbiased estimate of each policy's quality and cost on this traffic. On a request
that was not explored only the agents the served router asked replied; comparing on those rows would score every
other decision on estimates, and select the rows by the served router's own choices.

A candidate worse in quality beyond noise (the paired 95 % CI of candidate − promoted entirely below 0) or dearer
beyond noise (the cost CI entirely above 0: the gate's paired cost rule) on these rows is refused, whatever the
benchmark rows say. Fewer than MIN_TRAFFIC rows: not judged, and not blocking.
"""
from __future__ import annotations

import numpy as np

from pipeline.report.gate_rows import figures, is_traffic, money, paired, replied

MIN_TRAFFIC = 30  # below it a paired bootstrap CI is not evidence: on 10 rows where the candidate lost 4 and won
# none, the 95 % interval is [−0.7, −0.1] (a resample without a loss has chance 0.6^10 < 1 %), so 4 prompts would
# refuse a router; the percentile interval nears its nominal coverage only from a few dozen rows (the floor of the
# gate's shared tasks, MIN_SHARED, too)
TRAFFIC_RULE = ("traffic rows: paired 95 % bootstrap CIs over the held-out traffic rows both routers were scored on "
                "where every agent of either pool replied (explored requests): quality (candidate − promoted) upper "
                f"bound ≥ 0 and cost (candidate − promoted) lower bound ≤ 0; fewer than {MIN_TRAFFIC} such rows: not "
                "judged, not blocking")


def traffic_pairs(candidate: dict, incumbent: dict) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(the candidate's rows, the same tasks' rows of the incumbent) on the held-out traffic rows both were scored on
    where every agent of both pools replied; and how many traffic rows of the candidate were left out because an
    agent did not reply, and because the incumbent was not scored on them."""
    pos = {str(incumbent["task_ids"][j]): j for j in np.flatnonzero(is_traffic(incumbent))}
    mine_ok, theirs_ok = replied(candidate), replied(incumbent)
    mine, theirs, unreplied, unscored = [], [], 0, 0
    for i in np.flatnonzero(is_traffic(candidate)):
        j = pos.get(str(candidate["task_ids"][i]))
        if j is None:
            unscored += 1
        elif not (mine_ok[i] and theirs_ok[j]):
            unreplied += 1
        else:
            mine.append(i)
            theirs.append(j)
    return np.asarray(mine, np.int64), np.asarray(theirs, np.int64), unreplied, unscored


def _counted(n: int, unreplied: int, unscored: int) -> str:
    left = [f"{unreplied} left out: an agent a router can ask did not reply"] if unreplied else []
    left += [f"{unscored} the promoted router was not scored on"] if unscored else []
    return f"{n} held-out traffic rows every agent replied to" + (f" ({'; '.join(left)})" if left else "")


def traffic_evidence(candidate: dict, incumbent: dict | None) -> dict:
    """The traffic verdict: {"passed" (None: not judged, never blocking), "rule", "reason", "dearer", "n" (rows
    compared), "left_out" (an agent did not reply), "unscored", "task_ids" (the rows compared), and when judged the
    paired CIs and both routers' figures on those rows}."""
    base = {"rule": TRAFFIC_RULE, "dearer": False, "n": 0, "left_out": 0, "unscored": 0, "task_ids": []}
    held = int(is_traffic(candidate).sum())
    if incumbent is None:
        return {**base, "passed": None, "unscored": held,
                "reason": f"not enough traffic rows (0): {held} held out, no promoted router's evidence to pair "
                          "them with; not judged, not blocking"}
    mine, theirs, unreplied, unscored = traffic_pairs(candidate, incumbent)
    counted = {**base, "n": len(mine), "left_out": unreplied, "unscored": unscored,
               "task_ids": [str(candidate["task_ids"][i]) for i in mine]}
    said = _counted(len(mine), unreplied, unscored)
    if len(mine) < MIN_TRAFFIC:
        return {**counted, "passed": None,
                "reason": f"not enough traffic rows ({len(mine)} < {MIN_TRAFFIC}): {said}; not judged, not blocking"}
    r, c = np.asarray(candidate["reward"], np.float64)[mine], np.asarray(candidate["cost"], np.float64)[mine]
    ri, ci = np.asarray(incumbent["reward"], np.float64)[theirs], np.asarray(incumbent["cost"], np.float64)[theirs]
    q, cost = paired(r, ri), paired(1000 * c, 1000 * ci)
    worse, dearer = q["high"] < 0, cost["low"] > 0
    fc, fi = figures(candidate, mine), figures(incumbent, theirs)
    refused = [w for w, bad in (("worse in quality on traffic beyond noise", worse),
                                ("dearer on traffic beyond noise", dearer)) if bad]
    return {**counted, "passed": not refused, "dearer": bool(dearer),
            "reason": f"{said}: quality {fi['quality']:.4f} -> {fc['quality']:.4f} ({q['gain']:+.4f} "
                      f"[{q['low']:+.4f}, {q['high']:+.4f}]), cost {money(fi['cost_per_1k'])} -> "
                      f"{money(fc['cost_per_1k'])} per 1k queries ({cost['gain']:+.3f} [{cost['low']:+.3f}, "
                      f"{cost['high']:+.3f}])" + (f"; refused: {', '.join(refused)}" if refused else ""),
            "quality_minus_promoted": q, "cost_per_1k_minus_promoted": cost, "candidate": fc,
            "incumbent": {"name": incumbent.get("name"), **fi}}
