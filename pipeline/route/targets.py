"""Operating points: the λ of ``reward − λ·cost`` as something a user chooses by name.

A registered head carries, next to its max-quality head, a *value scorer*: a linear head whose scores are predicted
rewards (reward units, calibrated per agent on validation) and the mean cost per query of each agent on the training
rows. At λ > 0 a query goes to ``argmax_j  predicted_reward_j(x) − λ·agent_cost_j`` (ties → the cheaper agent): a
real cost-aware pick, per query, with the same predictions at every λ. λ = 0 is the max-quality point: the shipped
head (the ship gate may have replaced it by the best single agent).

At training time the λ path is evaluated on the validation rows (`operating_path`): quality with a 95 % CI, cost per
1k queries, share per agent, and the paired quality difference to the best single agent. Named targets resolve on
that path (`resolve`):

- ``max-quality``: λ = 0 (the shipped head, with its ship gate);
- ``parity``: the cheapest point whose validation quality is not significantly below the best single agent's: the
  upper end of the paired 95 % bootstrap CI of (point − best single) is ≥ 0;
- ``quality>=F`` (0 < F ≤ 1): the cheapest point whose validation quality is ≥ F × the best single agent's;
- ``budget=B``: the best-quality point whose validation cost is ≤ B USD per 1k queries (the cheapest point, flagged
  ``over_budget``, when none is);
- ``lambda=L``: an explicit λ ≥ 0 (for experiments).
"""
from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass

import numpy as np

from pipeline.core.bootstrap import bootstrap_means
from pipeline.core.errors import RouterLiteError
from pipeline.core.progress import phase_progress

log = logging.getLogger(__name__)
NAMED = ("max-quality", "parity")
REPORT_TARGETS = ("max-quality", "parity", "quality>=0.98", "quality>=0.95")
_QUALITY = re.compile(r"^quality\s*>=\s*(.*)$")
_KEYED = re.compile(r"^(budget|lambda)\s*=\s*(.*)$")


@dataclass(frozen=True)
class Target:
    kind: str            # max-quality | parity | quality | budget | lambda
    value: float | None  # fraction (quality), USD per 1k queries (budget), λ (lambda)

    @property
    def name(self) -> str:
        if self.kind in NAMED:
            return self.kind
        if self.kind == "quality":
            return f"quality>={self.value:g}"
        return f"{self.kind}={self.value:g}"


def _cut(text: str, limit: int = 60) -> str:
    """A client's value in a message: cut before it is rendered (a target may come from a 1 MB body)."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text):,} characters)"


def _number(text: str, what: str, target: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise RouterLiteError(f"target {_cut(target)}: {what} {_cut(text.strip())} is not a number") from None
    if not math.isfinite(v):
        raise RouterLiteError(f"target {_cut(target)}: {what} must be finite")
    return v


def parse_target(text: str | None) -> Target:
    """'max-quality' | 'parity' | 'quality>=F' | 'budget=USD_PER_1K' | 'lambda=L'; None or '' = max-quality."""
    if text is None or not str(text).strip():
        return Target("max-quality", None)
    if not isinstance(text, str):
        raise RouterLiteError(f"target must be a string, got {type(text).__name__}")
    t = text.strip().lower()
    if t in NAMED:
        return Target(t, None)
    m = _QUALITY.match(t)
    if m:
        f = _number(m.group(1), "quality fraction", text)
        if not 0 < f <= 1:
            raise RouterLiteError(f"target {_cut(text)}: the quality fraction of the best single agent must be in "
                                  f"(0, 1], got {f:g}")
        return Target("quality", f)
    m = _KEYED.match(t)
    if m:
        key = m.group(1)
        v = _number(m.group(2), "budget (USD per 1k queries)" if key == "budget" else "lambda", text)
        if key == "budget" and v <= 0:
            raise RouterLiteError(f"target {_cut(text)}: the budget must be > 0 USD per 1k queries")
        if key == "lambda" and v < 0:
            raise RouterLiteError(f"target {_cut(text)}: lambda must be >= 0")
        return Target(key, v)
    raise RouterLiteError(f"unknown target {_cut(text)}; use max-quality, parity, quality>=F (0<F<=1, a fraction of "
                          "the best single agent's quality), budget=USD (per 1k queries) or lambda=L")


# ------------------------------------------------------------------------------------------------ picking
def cost_aware_pick(pred: np.ndarray, agent_cost: np.ndarray, lam: float, allowed=None) -> np.ndarray:
    """argmax_j pred[i, j] − λ·cost[i, j] over the `allowed` agents (None: all), ties → the cheaper agent, then the
    lower index. `agent_cost` is (K,) (one cost per agent) or (n, K) (a predicted cost per query and agent)."""
    pred = np.asarray(pred, dtype=np.float64)
    c = np.asarray(agent_cost, dtype=np.float64)
    c = np.broadcast_to(c[None, :] if c.ndim == 1 else c, pred.shape)
    v = pred - float(lam) * c
    if allowed is not None:
        v = np.where(np.asarray(allowed, dtype=bool)[None, :], v, -np.inf)
    vmax = v.max(axis=1, keepdims=True)
    cand = v >= vmax - 1e-12 * np.maximum(1.0, np.abs(vmax))
    return np.argmin(np.where(cand, c, np.inf), axis=1)


def hull_agents(quality: np.ndarray, agent_cost: np.ndarray) -> np.ndarray:
    """Mask of the agents on the upper cost–quality hull of the individual agents (mean quality vs mean cost):
    an agent that a mixture of two others beats at its cost is left out of the cost-aware picks."""
    from pipeline.route.frontier import upper_hull

    q = np.asarray(quality, dtype=np.float64)
    c = np.asarray(agent_cost, dtype=np.float64)
    h = upper_hull(np.column_stack([c, q]))
    return np.array([any(abs(c[j] - x) < 1e-15 and abs(q[j] - y) < 1e-12 for x, y in h) for j in range(len(q))])


def lambda_grid(pred: np.ndarray, agent_cost: np.ndarray, n: int = 120) -> np.ndarray:
    """0 and a log grid from 'cost barely matters' to 'only cost matters', from the spread of the predictions and
    of the agents' costs (the top makes the cheapest agent win every row)."""
    pred = np.asarray(pred, dtype=np.float64)
    c = np.asarray(agent_cost, dtype=np.float64)
    c = np.sort(np.unique(c.mean(axis=0) if c.ndim == 2 else c))
    dc = np.diff(c)
    span = float(np.max(pred.max(axis=1) - pred.min(axis=1))) if pred.size else 0.0
    if dc.size == 0 or span <= 0:
        return np.zeros(1)
    lo = 1e-3 * span / float(c[-1] - c[0])
    hi = 10.0 * span / float(dc[dc > 0].min())
    return np.concatenate([[0.0], np.geomspace(lo, hi, n - 1)])


def bootstrap_mean_ci(x: np.ndarray, n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return float("nan"), float("nan")
    means = bootstrap_means(x, n_boot, seed)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def point_stats(picks: np.ndarray, R_eff: np.ndarray, C: np.ndarray, best_single: int, agents: list[str],
                seed: int = 0) -> dict:
    """Quality (with a 95 % bootstrap CI), cost per 1k queries, shares and the paired difference to the best single
    agent of one set of picks on (R_eff, C)."""
    picks = np.asarray(picks, dtype=np.int64)
    rows = np.arange(len(picks))
    q = R_eff[rows, picks].astype(np.float64)
    diff = q - R_eff[:, best_single]
    lo, hi = bootstrap_mean_ci(q, seed=seed)
    dlo, dhi = bootstrap_mean_ci(diff, seed=seed)
    counts = np.bincount(picks, minlength=len(agents))
    return {"quality": float(q.mean()), "ci_low": lo, "ci_high": hi,
            "cost_per_1k": float(1000.0 * C[rows, picks].mean()),
            "gain": float(diff.mean()), "gain_low": dlo, "gain_high": dhi,
            "shares": {a: float(counts[j] / len(picks)) for j, a in enumerate(agents)}}


@dataclass(frozen=True)
class PathRows:
    """The rows a λ path is read on: the value scorer's predicted rewards `pred` (n, K), the max-quality picks
    `picks0` (the shipped router's), tie-aware rewards `R_eff` and costs `C`, and the pick-time costs `pick_cost`
    ((n, K) predicted per query; None: the agents' mean costs)."""

    pred: np.ndarray
    picks0: np.ndarray
    R_eff: np.ndarray
    C: np.ndarray
    pick_cost: np.ndarray | None = None


def operating_path(rows: PathRows, agent_cost: np.ndarray, best_single: int, agents: list[str],
                   lambdas: np.ndarray | None = None, allowed=None) -> dict:
    """The λ path on validation: point 0 = max-quality (`rows.picks0`, the shipped head), then one point per λ > 0
    of the cost-aware pick on `rows.pred` with the pick-time costs (`rows.pick_cost`, else `agent_cost`);
    consecutive λ with identical picks are merged (the first λ kept)."""
    pred_val, picks0_val, R_eff_val, C_val = rows.pred, rows.picks0, rows.R_eff, rows.C
    pick_cost = agent_cost if rows.pick_cost is None else rows.pick_cost
    lams = lambda_grid(pred_val, pick_cost) if lambdas is None else np.asarray(lambdas, dtype=np.float64)
    points = [{"lambda": 0.0, **point_stats(picks0_val, R_eff_val, C_val, best_single, agents)}]
    last = None
    progress = phase_progress("operating points: λ path", "λ", log)
    for i, lam in enumerate(lams[lams > 0]):
        if i:  # the λ before this one are done
            progress(i, int((lams > 0).sum()))
        picks = cost_aware_pick(pred_val, pick_cost, lam, allowed)
        if last is not None and np.array_equal(picks, last):
            continue
        last = picks
        points.append({"lambda": float(lam), **point_stats(picks, R_eff_val, C_val, best_single, agents)})
    bs = point_stats(np.full(len(R_eff_val), best_single), R_eff_val, C_val, best_single, agents)
    return {"agents": list(agents), "agent_cost": [float(c) for c in agent_cost], "best_single": agents[best_single],
            "allowed": None if allowed is None else [bool(a) for a in allowed],
            "best_single_validation": {"quality": bs["quality"], "ci_low": bs["ci_low"], "ci_high": bs["ci_high"],
                                       "cost_per_1k": bs["cost_per_1k"]},
            "n_validation": len(R_eff_val), "points": points}


def resolve(target: Target | str | None, path: dict) -> dict:
    """The path point a target selects: {"target", "lambda", "index" (into path["points"]), ...validation stats}."""
    t = target if isinstance(target, Target) else parse_target(target)
    pts = path["points"]
    bs_q = path["best_single_validation"]["quality"]
    if t.kind == "max-quality":
        i = 0
    elif t.kind == "lambda":
        i = _nearest_lambda(pts, t.value)
    elif t.kind == "budget":
        ok = [k for k, p in enumerate(pts) if p["cost_per_1k"] <= t.value + 1e-12]
        if ok:
            i = max(ok, key=lambda k: (pts[k]["quality"], -pts[k]["cost_per_1k"]))
        else:
            i = min(range(len(pts)), key=lambda k: pts[k]["cost_per_1k"])
            return {"target": t.name, "index": i, "over_budget": True, **_public(pts[i])}
    else:
        if t.kind == "parity":
            ok = [k for k, p in enumerate(pts) if p["gain_high"] >= 0]
        else:
            # a path may carry a guard against the winner's curse (cascades: pipeline/route/cascade_fit.py):
            # the fraction must hold by guard_z standard errors of the point's paired difference
            z = float(path.get("guard_z") or 0.0)
            ok = [k for k, p in enumerate(pts) if p["quality"] - z * p.get("gain_se", 0.0) >= t.value * bs_q - 1e-12]
        i = min(ok, key=lambda k: (pts[k]["cost_per_1k"], -pts[k]["quality"])) if ok else 0
    return {"target": t.name, "index": i, **_public(pts[i])}


def _nearest_lambda(pts: list[dict], lam: float) -> int:
    """The point in force at λ: the last path point whose λ is ≤ lam (points are in increasing λ)."""
    i = 0
    for k, p in enumerate(pts):
        if p["lambda"] <= lam + 1e-15:
            i = k
    return i


def _public(p: dict) -> dict:
    return {k: p[k] for k in ("lambda", "quality", "ci_low", "ci_high", "cost_per_1k", "gain", "gain_low",
                              "gain_high", "shares")}


def path_table(path: dict, targets=REPORT_TARGETS, extra: list[str] | None = None) -> list[dict]:
    """Rows (target, λ, validation quality, cost per 1k, shares) for the report targets on a stored path."""
    out = []
    for name in list(targets) + list(extra or []):
        r = resolve(name, path)
        out.append({"target": r["target"], "lambda": r["lambda"], "val_quality": r["quality"],
                    "val_cost_per_1k": r["cost_per_1k"],
                    "shares": ", ".join(f"{a} {s:.0%}" for a, s in r["shares"].items() if s > 0)})
    return out


# ------------------------------------------------------------------------------------------------ serving
TARGET_HEADER = "X-Router-Target"
TARGET_FIELD = "router_target"


def request_target(headers, body: dict, default: str | None = None) -> str | None:
    """The target a chat request asks for: the field `router_target` of its (already parsed) body, else the
    `X-Router-Target` header, else the server's default; raises RouterLiteError naming the bad value (not a string,
    unknown target)."""
    value = body.get(TARGET_FIELD) if isinstance(body, dict) else None
    if value is not None and not isinstance(value, str):
        raise RouterLiteError(f"'{TARGET_FIELD}' must be a string, got {type(value).__name__}")
    if value is None:
        value = headers.get(TARGET_HEADER) if headers is not None else None
    if value is None or not str(value).strip():
        value = default
    return None if value is None else parse_target(value).name
