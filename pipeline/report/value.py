"""What a router is worth: the value scorer behind the operating points, and the held-out value report.

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
"""
from __future__ import annotations

import numpy as np

from pipeline.collect.rewards import cost_per_1k_label
from pipeline.core.errors import RouterLiteError
from pipeline.route.head import Head
from pipeline.route.targets import REPORT_TARGETS, cost_aware_pick, point_stats, resolve
from pipeline.route.train import ridge_path

VALUE_ALPHAS = tuple(float(a) for a in np.logspace(0, 5, 11))


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
    from pipeline.report.pool_report import label_router_picks
    from pipeline.route.evaluate import paired_gain_ci

    picks = label_router_picks(np.asarray(R_train), np.asarray(labels_train, object), np.asarray(labels_test, object),
                               best_single)
    rows = np.arange(len(picks))
    per_domain = {g: agents[int(picks[np.asarray(labels_test, object) == g][0])]
                  for g in sorted(set(np.asarray(labels_test, object).tolist()))}
    # head − label router, paired over the test rows
    diff_R = np.column_stack([R_eff_test[rows, head_picks], R_eff_test[rows, picks]])
    ci = paired_gain_ci(np.zeros(len(rows), np.int64), diff_R, 1)
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


def target_picks(target: str, path: dict, X: np.ndarray, head_picks: np.ndarray, scorer: Head,
                 agent_cost: np.ndarray, guard=None, fallback: int | None = None,
                 cost_scorer: Head | None = None) -> tuple[np.ndarray, dict]:
    """Picks of a target on rows X: λ = 0 → the shipped head's picks (given); λ > 0 → the cost-aware scorer pick,
    with the OOD guard sending far-away rows to `fallback`."""
    point = resolve(target, path)
    if point["lambda"] == 0:
        return np.asarray(head_picks), point
    picks = cost_aware_pick(scorer.scores(X), pick_costs(cost_scorer, X, agent_cost), point["lambda"],
                            path.get("allowed"))
    if guard is not None:
        picks = guard.route(picks, X, fallback)
    return picks, point


def held_out_value(path: dict, X_te: np.ndarray, R_eff_te: np.ndarray, C_te: np.ndarray, head_picks: np.ndarray,
                   scorer: Head, agent_cost: np.ndarray, best_single: int, agents: list[str], guard=None,
                   targets=REPORT_TARGETS, extra_targets: list[str] | None = None,
                   cost_scorer: Head | None = None) -> dict:
    """Per target on the test rows (see the module docstring) + best single, oracle, APGR/CPT."""
    if len(X_te) != len(R_eff_te):
        raise RouterLiteError(f"{len(X_te)} test embeddings for {len(R_eff_te)} reward rows")
    rows = np.arange(len(R_eff_te))
    bs_cost = float(1000.0 * C_te[:, best_single].mean())
    out_targets = {}
    for name in list(targets) + list(extra_targets or []):
        picks, point = target_picks(name, path, X_te, head_picks, scorer, agent_cost, guard, best_single,
                                    cost_scorer)
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


def value_line(value: dict, target: str = "parity", models: dict | None = None) -> str:
    """'parity: 0.82 (CI 0.80-0.84) at 48 % of gpt-4o's cost' for one target of a held-out value report
    (`models`: agent name -> model name, to name the best single agent by its model)."""
    t = value["targets"].get(target)
    if t is None:
        return f"{target}: not evaluated"
    bs = value["best_single"]["agent"]
    bs = (models or {}).get(bs, bs)
    ratio = "n/a" if t["cost_ratio"] is None else f"{100 * t['cost_ratio']:.0f} %"
    return (f"{target}: {t['quality']:.3f} (CI {t['ci_low']:.3f}-{t['ci_high']:.3f}) at {ratio} of {bs}'s cost "
            f"(best single {value['best_single']['quality']:.3f})")


def targets_markdown(value: dict) -> str:
    """The held-out per-target table (Markdown) of a value report, then the RouteLLM metrics."""
    import pandas as pd

    label = cost_per_1k_label(value.get("costs_estimated"))
    rows = []
    order = {name: i for i, name in enumerate(REPORT_TARGETS)}  # the report's order (stored JSON sorts its keys)
    for name, t in sorted(value["targets"].items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])):
        rows.append({"target": name, "λ": t["lambda"], "quality": t["quality"],
                     "95% CI": f"{t['ci_low']:.3f}-{t['ci_high']:.3f}",
                     "vs best single": f"{t['gain']:+.3f} [{t['gain_low']:+.3f}, {t['gain_high']:+.3f}]",
                     label: t["cost_per_1k"],
                     "cost ratio": t["cost_ratio"],
                     "shares": ", ".join(f"{a} {s:.0%}" for a, s in t["shares"].items() if s >= 0.005)})
    bs, orc = value["best_single"], value["oracle"]
    rows.append({"target": f"best single ({bs['agent']})", "quality": bs["quality"], label: bs["cost_per_1k"],
                 "cost ratio": 1.0})
    rows.append({"target": "oracle", "quality": orc["quality"], label: orc["cost_per_1k"],
                 "cost ratio": orc["cost_per_1k"] / bs["cost_per_1k"] if bs["cost_per_1k"] else None})
    fmt = lambda x: "n/a" if x is None else f"{x:.3f}"
    df = pd.DataFrame(rows)
    return (df.astype(object).where(df.notna(), None).to_markdown(index=False, floatfmt=".4f", missingval="")
            + f"\n\nRouteLLM metrics, {bs['agent']} (strong) vs {value['weak']} (weak): APGR {fmt(value['apgr'])}, "
              f"CPT(50%) {fmt(value['cpt50'])}, CPT(80%) {fmt(value['cpt80'])} (n_test={value['n_test']})\n")


ROUTER_VALUE_KEYS = ("profile", "pool_verdict", "best_single", "max_quality", "targets", "apgr", "cpt50", "cpt80",
                     "aiq", "label_router", "knn", "oracle", "n_test", "routers", "best_router")
TARGET_KEYS = ("quality", "ci_low", "ci_high", "cost_per_1k", "cost_ratio", "lambda", "shares")


CASCADE_TARGET_KEYS = (*TARGET_KEYS, "quality_ratio", "quality_ratio_ci", "gain", "gain_low", "gain_high",
                       "calls_per_query", "plan")


def router_value(profile: str, pool_verdict: str | None, value: dict, aiq: dict, cascade: dict | None = None,
                 head_validation_aiq: float | None = None, cascade_aiq: dict | None = None,
                 cascade_benchmark: dict | None = None) -> dict:
    """reports/router_value.json: exactly `ROUTER_VALUE_KEYS` (costs are estimated USD per 1k queries).

    `routers` holds one entry per router kind (the prompt-only head; the cascade's variants: answers only, and
    with the prompt router), each with its held-out targets and test AIQ; `best_router` is the kind with the best
    validation AIQ (the held-out rows choose nothing). `targets` / `max_quality` stay the head's (prompt-only)."""
    mq = value["targets"]["max-quality"]
    lr = value.get("label_router")
    bc = value["best_single"]["cost_per_1k"]
    routers = {"head": {"aiq_validation": head_validation_aiq, "aiq_test": aiq.get("head"),
                        "targets": {name: {**{k: t[k] for k in TARGET_KEYS},
                                           "quality_ratio": t["quality"] / value["best_single"]["quality"]
                                           if value["best_single"]["quality"] else None,
                                           "gain": t["gain"], "gain_low": t["gain_low"], "gain_high": t["gain_high"]}
                                    for name, t in value["targets"].items()}}}
    for variant, v in ((cascade or {}).get("variants") or {}).items():
        routers[f"cascade:{variant}"] = {
            "aiq_validation": v["aiq_validation"], "aiq_test": (cascade_aiq or {}).get(variant, v["aiq_test"]),
            "targets": {name: {k: t.get(k) for k in CASCADE_TARGET_KEYS} for name, t in v["targets"].items()}}
    if cascade_benchmark and cascade:  # {target: summary} of the routed benchmark (real calls through the pool)
        routers[f"cascade:{cascade['chosen']}"]["routed_benchmark"] = {
            name: {**{k: b[k] for k in ("n", "accuracy", "cost_per_1k", "calls_per_query")},
                   "cost_ratio": b["cost_per_1k"] / bc if bc else None}
            for name, b in cascade_benchmark.items()}
    scored = {k: r["aiq_validation"] for k, r in routers.items() if r["aiq_validation"] is not None}
    best = max(scored, key=scored.get) if scored else "head"
    return {
        "routers": routers, "best_router": best,
        "profile": profile, "pool_verdict": pool_verdict,
        "best_single": dict(value["best_single"]),
        "max_quality": {"quality": mq["quality"], "ci_low": mq["ci_low"], "ci_high": mq["ci_high"],
                        "gain": mq["gain"], "cost_per_1k": mq["cost_per_1k"]},
        "targets": {name: {k: t[k] for k in TARGET_KEYS} for name, t in value["targets"].items()},
        "apgr": value["apgr"], "cpt50": value["cpt50"], "cpt80": value["cpt80"],
        "aiq": {k: aiq.get(k) for k in ("head", "prior", "hull", "knn")},
        "label_router": None if lr is None else lr["quality"], "knn": value.get("knn"),
        "oracle": value["oracle"]["quality"], "n_test": value["n_test"],
    }


ROUTER_LABELS = {"head": "prompt-only (head)", "cascade:cascade": "cascade (answers only)",
                 "cascade:combined": "combined (cascade + prompt router)"}


def ablation_markdown(rv: dict, targets=REPORT_TARGETS) -> str:
    """The router kinds side by side (reports/router_value.json `routers`): AIQ on validation and test, and per
    target the held-out quality as a fraction of the best single agent's (95 % paired CI where measured) and the
    cost as a fraction of its cost. The best router is the one with the best validation AIQ."""
    import pandas as pd

    bs = rv["best_single"]
    rows = []
    for kind, r in rv["routers"].items():
        row = {"router": ROUTER_LABELS.get(kind, kind) + (" ★" if kind == rv["best_router"] else ""),
               "AIQ val": r["aiq_validation"], "AIQ test": r["aiq_test"]}
        for name in targets:
            t = r["targets"].get(name)
            if t is None:
                continue
            ci = t.get("quality_ratio_ci")
            q = f"{t['quality_ratio']:.1%}" + (f" [{ci[0]:.1%}, {ci[1]:.1%}]" if ci else "")
            row[name] = f"{q} at {t['cost_ratio']:.0%}" if t.get("cost_ratio") is not None else q
        rows.append(row)
    a = rv["aiq"]
    return (f"Held-out test n={rv['n_test']}; fractions of {bs['agent']}'s quality (paired 95 % CI) at a fraction "
            f"of its cost; ★ = best validation AIQ. Baselines' test AIQ: prior {a['prior']:.4f}, individual hull "
            f"{a['hull']:.4f}, kNN {a['knn']:.4f}.\n\n"
            + pd.DataFrame(rows).to_markdown(index=False, floatfmt=".4f") + "\n")
