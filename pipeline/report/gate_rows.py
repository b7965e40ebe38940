"""Rows of the gate's evidence: which held-out rows are traffic (served requests) and which are benchmark, and the
paired figures every kind of evidence is judged with.

Evidence (`pipeline.report.promotion.evidence`) holds per-row lists (PER_ROW) aligned with `task_ids`; a row of the
task pool's source TRAFFIC is a request this deployment served, graded like any task (the traffic lineage). Its
`replied` says every agent of the evidence's pool has a collected reply on it (an explored request), False where a
cell was estimated (`imputed`): only such rows give both policies' outcomes without selection by the served
router's own decisions. Evidence without `source` (stored before traffic was recorded) is benchmark rows only.
"""
from __future__ import annotations

import numpy as np

from pipeline.collect.traffic import SOURCE as TRAFFIC  # the source of the requests `serve` recorded
from pipeline.route.evaluate import paired_gain_ci

PER_ROW = ("task_ids", "reward", "cost", "best_reward", "best_cost", "source", "replied")


def paired(a: np.ndarray, b: np.ndarray) -> dict:
    """mean(a − b) with its paired 95 % bootstrap CI (the project's paired_gain_ci on the two columns)."""
    ci = paired_gain_ci(np.zeros(len(a), np.int64), np.column_stack([a, b]), 1)
    return {k: ci[k] for k in ("gain", "low", "high", "n")}


def figures(ev: dict, idx=None) -> dict:
    """Held-out quality and cost per 1k queries of evidence `ev` (on its rows `idx`, all by default), and their
    ratios to the best single agent on the same rows (None when the evidence does not hold its outcome)."""
    whole, idx = idx is None, slice(None) if idx is None else idx
    r, c = np.asarray(ev["reward"], np.float64)[idx], np.asarray(ev["cost"], np.float64)[idx]
    q, cost = float(r.mean()) if len(r) else None, float(1000 * c.mean()) if len(c) else None
    out = {"quality": q, "quality_ratio": None, "cost_per_1k": cost, "cost_ratio": None, "n": int(len(r))}
    if isinstance(ev.get("best_reward"), list) and isinstance(ev.get("best_cost"), list) and len(r):
        bq = float(np.asarray(ev["best_reward"], np.float64)[idx].mean())
        bc = float(1000 * np.asarray(ev["best_cost"], np.float64)[idx].mean())
        out["quality_ratio"], out["cost_ratio"] = (q / bq if bq > 0 else None), (cost / bc if bc > 0 else None)
    elif ev.get("held_out") and whole:  # evidence of an older release: its stored figures
        out.update({k: ev["held_out"].get(k) for k in ("quality_ratio", "cost_ratio")})
    return out


def is_traffic(ev: dict) -> np.ndarray:
    """Per row of `ev`: a served request (source TRAFFIC)."""
    src, n = ev.get("source"), len(ev["task_ids"])
    return np.array([s == TRAFFIC for s in src], bool) if isinstance(src, list) and len(src) == n else np.zeros(n, bool)


def replied(ev: dict) -> np.ndarray:
    """Per row of `ev`: every agent of its pool replied (evidence that does not say: every row)."""
    got, n = ev.get("replied"), len(ev["task_ids"])
    return np.array([x is True for x in got], bool) if isinstance(got, list) and len(got) == n else np.ones(n, bool)


def rows_of(ev: dict, keep: np.ndarray) -> dict:
    """`ev` on its rows `keep` (a bool mask): every per-row list sliced (one of another length than `task_ids`, a
    hand-edited file's, left out), the rest as it is."""
    idx, n = np.flatnonzero(keep), len(ev["task_ids"])
    return {k: [v[i] for i in idx] if k in PER_ROW else v for k, v in ev.items()
            if k not in PER_ROW or (isinstance(v, list) and len(v) == n)}


def benchmark_part(ev: dict | None) -> dict | None:
    """`ev` on its rows of every source but traffic (itself when it holds no traffic row)."""
    if ev is None:
        return None
    t = is_traffic(ev)
    return rows_of(ev, ~t) if t.any() else ev


def with_traffic(ev: dict, fresh: dict) -> dict:
    """`ev` with its traffic rows replaced by `fresh`'s (evidence on traffic rows only): the served router scored on
    a later run's traffic. Per-row lists `ev` lacks stay absent; its rows without a source are benchmark rows."""
    keep = ~is_traffic(ev)
    old = rows_of(ev, keep)
    old.setdefault("source", [""] * int(keep.sum()))
    old["replied"] = [bool(x) for x in replied(ev)[keep]]
    return {**old, **{k: list(old[k]) + list(fresh[k]) for k in PER_ROW if isinstance(old.get(k), list)
                      and isinstance(fresh.get(k), list)}}


def money(x) -> str:
    return "n/a" if x is None else f"${x:.3f}"


def pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"
