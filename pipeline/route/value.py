"""What a router is worth: the value scorer and the cost scorer behind the operating points (parts of a router,
saved next to its head), and the held-out value of the router.

Value scorer: a linear head whose scores are **predicted rewards** (reward units): per-agent ridge regression of the
(tie-aware) training rewards on the standardised embeddings, the ridge strength chosen by validation mean squared
error. `pipeline.route.targets.cost_aware_pick` subtracts λ × the predicted cost of each agent on the query (a second
ridge, the *cost scorer*, same features, fitted on the training costs; chosen over each agent's mean training cost by
the validation area under the λ path, docs/training.md) from these
predictions. (Ridge of ``reward − λ·cost`` is ridge of the reward minus λ × ridge of the cost; with the cost
predicted by its per-agent mean this is the same pick, so one fit serves every λ.)

Held-out value report (`held_out_value`): per named target, the λ chosen on validation applied to the test rows
(OOD guard included): quality with a 95 % bootstrap CI, cost per 1k queries, cost ratio to the best single agent,
shares; the per-domain label router fitted on train; RouteLLM's APGR and CPT(50 %) / CPT(80 %) for the best single
agent (strong) against the cheapest agent (weak).
The report side (the one-line summary, the Markdown tables, reports/router_value.json) is
pipeline/report/value.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.core.errors import RouterLiteError
from pipeline.route.head import Head
from pipeline.route.targets import REPORT_TARGETS, cost_aware_pick, point_stats, resolve
from pipeline.route.train import ridge_path

VALUE_ALPHAS = tuple(float(a) for a in np.logspace(0, 5, 11))


@dataclass(frozen=True)
class PromptParts:
    """What a prompt router's decisions need: the shipped router, its guard, the value and cost scorers and the
    operating path its targets resolve on, the best single agent (the guard's fallback), the agents' mean training
    costs (the cost term without a cost scorer)."""

    router: object
    guard: object
    scorer: object
    cost_scorer: object
    path: dict
    best: int
    agent_cost: np.ndarray


def agent_costs(C_train: np.ndarray) -> np.ndarray:
    """Mean cost (USD) per query of each agent on the training rows: the λ·cost term at pick time."""
    return np.asarray(C_train, dtype=np.float64).mean(axis=0)


def fit_cost_scorer(head: Head, X_train: np.ndarray, C_train: np.ndarray, X_val: np.ndarray, C_val: np.ndarray,
                    alphas=VALUE_ALPHAS) -> tuple[Head, dict]:
    """(head predicting each agent's cost per query in USD, {"alpha", "val_r2"}): the same ridge as the value scorer,
    on the cost matrix. A reply's length (so its cost) differs by query far more than by agent list price alone."""
    scorer, info = fit_value_scorer(head, X_train, C_train, X_val, C_val, alphas)
    pred = pick_costs(scorer, X_val, None)
    var = np.asarray(C_val, np.float64).var(axis=0)
    info["val_r2"] = [float(1 - ((pred[:, j] - C_val[:, j]) ** 2).mean() / var[j]) if var[j] > 0 else None
                      for j in range(pred.shape[1])]
    return scorer, info


def pick_costs(cost_scorer: Head | None, X: np.ndarray, agent_cost) -> np.ndarray:
    """The cost term at pick time: the cost scorer's prediction per query and agent (floored at 1e-9 USD: a linear
    prediction can dip below zero), or each agent's mean training cost when there is no cost scorer."""
    if cost_scorer is None:
        return np.tile(np.asarray(agent_cost, np.float64), (len(X), 1))
    return np.maximum(cost_scorer.scores(X).astype(np.float64), 1e-9)


def fit_scorers(head: Head, X: np.ndarray, R_eff: np.ndarray, C: np.ndarray, train: np.ndarray,
                val: np.ndarray) -> tuple[Head, Head | None, dict]:
    """(value scorer, cost scorer or None when the matrix has no costs, {"alpha", "val_mse", "cost_alpha",
    "cost_val_r2"}) fitted on the `train` rows, ridge strengths chosen on the `val` rows (on `train` without any).
    The lineage fits them once on its train split and, to cross-fit the operating points, once per fold."""
    fit_rows = val if val.any() else train
    scorer, info = fit_value_scorer(head, X[train], R_eff[train], X[fit_rows], R_eff[fit_rows])
    cost_scorer = None
    if np.any(C[train] > 0):
        cost_scorer, cinfo = fit_cost_scorer(head, X[train], C[train], X[fit_rows], C[fit_rows])
        info = {**info, "cost_alpha": cinfo["alpha"], "cost_val_r2": cinfo["val_r2"]}
    return scorer, cost_scorer, info


def fit_value_scorer(head: Head, X_train: np.ndarray, R_train: np.ndarray, X_val: np.ndarray,
                     R_val: np.ndarray, alphas=VALUE_ALPHAS) -> tuple[Head, dict]:
    """(scorer head predicting each agent's reward, {"alpha", "val_mse"}); standardisation from `head`."""
    def z(X):
        X = np.asarray(X, dtype=np.float32)
        return X if head.mean is None else (X - head.mean) / head.std

    Zt, Zv = z(X_train), z(X_val)
    best = None
    for a, th in ridge_path(Zt, np.asarray(R_train, np.float64), alphas):
        pred = Zv @ th[:-1].astype(np.float32) + th[-1].astype(np.float32)
        mse = float(((pred - R_val) ** 2).mean())
        if best is None or mse < best[1] - 1e-12:
            best = (a, mse, th)
    a, mse, th = best
    scorer = Head(th[:-1], th[-1], mean=head.mean, std=head.std, agents=head.agents)
    return scorer, {"alpha": a, "val_mse": mse}


def label_router_metrics(labels_train: np.ndarray, R_train: np.ndarray, labels_test: np.ndarray,
                         R_eff_test: np.ndarray, best_single: int, head_picks: np.ndarray, agents: list[str]) -> dict:
    """The per-domain label router (best agent per domain on train) on test, and the head's paired gain over it."""
    from pipeline.route.evaluate import paired_gain_ci

    picks = label_router_picks(np.asarray(R_train), np.asarray(labels_train, object), np.asarray(labels_test, object),
                               best_single)
    rows = np.arange(len(picks))
    per_domain = {g: agents[int(picks[np.asarray(labels_test, object) == g][0])]
                  for g in sorted(set(np.asarray(labels_test, object).tolist()))}
    ci = paired_gain_ci(head_picks, R_eff_test, picks)  # head − label router, paired over the test rows
    return {"quality": float(R_eff_test[rows, picks].mean()), "picks_per_domain": per_domain,
            "head_minus_label_router": ci}


def routellm_metrics(pred: np.ndarray, R_eff: np.ndarray, strong: int, weak: int, steps: int = 101) -> dict:
    """APGR, CPT(50 %), CPT(80 %) (RouteLLM, Ong et al. 2024) of the binary router strong-vs-weak that sends the
    queries with the largest predicted advantage ``pred[:, strong] − pred[:, weak]`` to the strong agent.

    PGR(s) = (quality at strong-call share s − weak) / (strong − weak); APGR = area under PGR over s ∈ [0, 1]
    (trapezoid over `steps` evenly spaced shares); CPT(x) = the smallest share s with PGR(s) ≥ x.
    None when the strong agent is not better than the weak one on these rows.
    """
    R = np.asarray(R_eff, dtype=np.float64)
    n = len(R)
    q_strong, q_weak = float(R[:, strong].mean()), float(R[:, weak].mean())
    if strong == weak or q_strong <= q_weak:
        return {"apgr": None, "cpt50": None, "cpt80": None, "strong_quality": q_strong, "weak_quality": q_weak}
    adv = np.asarray(pred, dtype=np.float64)[:, strong] - np.asarray(pred, dtype=np.float64)[:, weak]
    order = np.argsort(-adv, kind="stable")
    gain = (R[order, strong] - R[order, weak])
    cum = np.concatenate([[0.0], np.cumsum(gain)])           # quality gained by sending the first m to strong
    shares = np.linspace(0.0, 1.0, steps)
    m = np.rint(shares * n).astype(int)
    pgr = (cum[m] / n) / (q_strong - q_weak)
    apgr = float(np.sum((shares[1:] - shares[:-1]) * (pgr[1:] + pgr[:-1]) / 2.0))

    def cpt(x: float) -> float | None:
        ok = np.flatnonzero(pgr >= x - 1e-12)
        return float(shares[ok[0]]) if ok.size else None

    return {"apgr": apgr, "cpt50": cpt(0.5), "cpt80": cpt(0.8), "strong_quality": q_strong, "weak_quality": q_weak}


def target_picks(target: str, parts: PromptParts, X: np.ndarray, head_picks: np.ndarray) -> tuple[np.ndarray, dict]:
    """Picks of a target on rows X: λ = 0 → the shipped head's picks (given); λ > 0 → the cost-aware pick of the
    value scorer on `parts.path`, with the OOD guard sending far-away rows to the best single agent."""
    point = resolve(target, parts.path)
    if point["lambda"] == 0:
        return np.asarray(head_picks), point
    picks = cost_aware_pick(parts.scorer.scores(X), pick_costs(parts.cost_scorer, X, parts.agent_cost),
                            point["lambda"], parts.path.get("allowed"))
    if parts.guard is not None:
        picks = parts.guard.route(picks, X, parts.best)
    return picks, point


def held_out_value(parts: PromptParts, X_te: np.ndarray, R_eff_te: np.ndarray, C_te: np.ndarray,
                   head_picks: np.ndarray, agents: list[str], targets=REPORT_TARGETS,
                   extra_targets: list[str] | None = None) -> dict:
    """Per target on the test rows (see the module docstring) + best single, oracle, APGR/CPT."""
    scorer, agent_cost, best_single = parts.scorer, parts.agent_cost, parts.best
    if len(X_te) != len(R_eff_te):
        raise RouterLiteError(f"{len(X_te)} test embeddings for {len(R_eff_te)} reward rows")
    rows = np.arange(len(R_eff_te))
    bs_cost = float(1000.0 * C_te[:, best_single].mean())
    out_targets = {}
    for name in list(targets) + list(extra_targets or []):
        picks, point = target_picks(name, parts, X_te, head_picks)
        s = point_stats(picks, R_eff_te, C_te, best_single, agents)
        out_targets[point["target"]] = {
            "quality": s["quality"], "ci_low": s["ci_low"], "ci_high": s["ci_high"], "cost_per_1k": s["cost_per_1k"],
            "cost_ratio": s["cost_per_1k"] / bs_cost if bs_cost > 0 else None, "lambda": point["lambda"],
            "shares": s["shares"], "gain": s["gain"], "gain_low": s["gain_low"], "gain_high": s["gain_high"],
            "val_quality": point["quality"], "val_cost_per_1k": point["cost_per_1k"]}
    weak = int(np.argmin(agent_cost))
    rl = routellm_metrics(scorer.scores(X_te), R_eff_te, best_single, weak)
    oracle = np.argmax(R_eff_te - 1e-9 * C_te, axis=1)
    return {"targets": out_targets,
            "best_single": {"agent": agents[best_single], "quality": float(R_eff_te[:, best_single].mean()),
                            "cost_per_1k": bs_cost},
            "oracle": {"quality": float(R_eff_te.max(axis=1).mean()),
                       "cost_per_1k": float(1000.0 * C_te[rows, oracle].mean())},
            "weak": agents[weak], **{k: rl[k] for k in ("apgr", "cpt50", "cpt80")}, "n_test": len(rows)}


def label_router_picks(R_fit: np.ndarray, g_fit: np.ndarray, g_apply: np.ndarray, fallback: int) -> np.ndarray:
    """Per-domain label router: the best agent (mean reward on the fitting rows) of each domain; a domain unseen
    when fitting gets `fallback`."""
    best = {g: int(np.argmax(R_fit[g_fit == g].mean(axis=0))) for g in set(g_fit.tolist())}
    return np.array([best.get(g, fallback) for g in g_apply.tolist()], dtype=np.int64)
