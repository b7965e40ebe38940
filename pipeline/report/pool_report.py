"""Pool report: which case a pool is in before anyone trains a router on it.

People adopt a router for more quality than any one model (the pool is *complementary*: different agents lead
different domains) or for about the same quality for much less money (the pool is *quality-dominated*: one agent
leads everywhere, and routing can pay only on cost). This module says which, from a reward matrix alone:

- per agent × domain (and × difficulty): mean reward with a 95 % CI (normal approximation of the mean, clipped to
  [0, 1]), cost per 1k queries, n;
- the leaders of each domain, by this rule: the domain's top agent (highest mean) and every agent whose paired 95 %
  bootstrap CI of (agent − top) on that domain's rows contains 0 are *tied leaders*; an agent *leads* a domain when it
  is one of its tied leaders;
- the verdict: ``quality-dominated: <agent> leads every domain`` when one agent is a (tied) leader of every domain
  (among several such, the best overall); otherwise ``complementary: <agents> lead different domains``;
- the routable headroom, by 5-fold cross-validation on the **training rows only**: the gain over the best single
  agent (chosen on each fold's training part) of a per-domain label router (best agent per domain on the fold's
  training part) and of a kNN router (k chosen on a slice of the fold's training part), with a paired 95 %
  bootstrap CI over all out-of-fold rows; and the oracle's headroom on the same rows;
- whether a cascade pays (`cascade_pays`): read off the lineage's own cascade fit, not fitted again.

Rows described: the development rows (train + validation, never test or out-of-distribution rows).
"""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from pipeline.collect.quality import quarantine_markdown
from pipeline.collect.rewards import cost_per_1k_label
from pipeline.core.bootstrap import bootstrap_means
from pipeline.core.errors import RouterLiteError
from pipeline.core.progress import heartbeat, phase_progress
from pipeline.route.value import label_router_picks

log = logging.getLogger(__name__)

DOMAIN_COLUMNS = ("source", "category", "domain")
WARNING = "routing can pay here on cost, not on quality"


def domain_column(tasks: pd.DataFrame) -> str | None:
    """The label a user would know about each query: the first of source, category, domain with >= 2 values."""
    for col in DOMAIN_COLUMNS:
        if col in tasks and tasks[col].fillna("").astype(str).nunique() >= 2:
            return col
    return None


def labels_of(tasks: pd.DataFrame, column: str | None) -> np.ndarray:
    if column is None or column not in tasks:
        return np.full(len(tasks), "all", dtype=object)
    return tasks[column].fillna("").astype(str).replace("", "unknown").to_numpy(dtype=object)


def _mean_ci(x: np.ndarray) -> tuple[float, float, float]:
    m = float(x.mean())
    se = float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")
    return m, max(0.0, m - 1.96 * se), min(1.0, m + 1.96 * se)


def _paired_ci(diff: np.ndarray, n_boot: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    means = bootstrap_means(diff, n_boot, seed)
    return float(diff.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def group_table(R: np.ndarray, C: np.ndarray, groups: np.ndarray, agents: list[str]) -> pd.DataFrame:
    """One row per (group, agent): n, accuracy, ci_low, ci_high, cost_per_1k."""
    rows = []
    for g in sorted(set(groups.tolist())):
        m = groups == g
        for j, a in enumerate(agents):
            acc, lo, hi = _mean_ci(R[m, j])
            rows.append({"group": g, "agent": a, "n": int(m.sum()), "accuracy": acc, "ci_low": lo, "ci_high": hi,
                         "cost_per_1k": float(1000.0 * C[m, j].mean())})
    return pd.DataFrame(rows, columns=["group", "agent", "n", "accuracy", "ci_low", "ci_high", "cost_per_1k"])


def leaders(R: np.ndarray, groups: np.ndarray, agents: list[str]) -> dict[str, dict]:
    """Per group: top agent, tied leaders (paired CI of agent − top contains 0), and each agent's gap CI."""
    out = {}
    for g in sorted(set(groups.tolist())):
        m = groups == g
        means = R[m].mean(axis=0)
        top = int(np.argmax(means))
        tied = [agents[top]]
        for j in range(len(agents)):
            if j != top:
                _, _, hi = _paired_ci(R[m, j] - R[m, top])
                if hi >= 0:
                    tied.append(agents[j])
        out[g] = {"top": agents[top], "tied_leaders": tied, "n": int(m.sum())}
    return out


def verdict(lead: dict[str, dict], R: np.ndarray, agents: list[str]) -> dict:
    """quality-dominated (one agent leads or ties every domain) or complementary."""
    common = set(agents)
    for v in lead.values():
        common &= set(v["tied_leaders"])
    overall = R.mean(axis=0)
    if common:
        a = max(common, key=lambda x: overall[agents.index(x)])
        return {"kind": "quality-dominated", "agent": a,
                "text": f"quality-dominated: {a} leads every domain" + (
                    f" ({len(lead)} domains)" if len(lead) > 1 else " (one domain)")}
    tops = sorted({v["top"] for v in lead.values()}, key=lambda x: -overall[agents.index(x)])
    return {"kind": "complementary", "agents": tops,
            "text": f"complementary: {', '.join(tops)} lead different domains"}


def _folds(n: int, k: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(n) % k


def routable_headroom(X: np.ndarray | None, R: np.ndarray, groups: np.ndarray, folds: int = 5, seed: int = 0) -> dict:
    """Out-of-fold gains over the best single agent of the label router and kNN (paired 95 % CIs), and the oracle's."""
    from pipeline.route.fit import validation_slice
    from pipeline.route.knn import KnnRouter

    n = len(R)
    if n < 2 * folds:
        raise RouterLiteError(f"pool report: {n} training rows are too few for {folds}-fold cross-validation")
    f = _folds(n, folds, seed)
    label = np.empty(n, np.int64)
    knn = np.empty(n, np.int64)
    single = np.empty(n, np.int64)
    progress = phase_progress("pool report: routable headroom", "folds", log)
    for k in range(folds):
        tr, te = f != k, f == k
        bs = int(np.argmax(R[tr].mean(axis=0)))
        single[te] = bs
        label[te] = label_router_picks(R[tr], groups[tr], groups[te], bs)
        if X is not None:
            ids = [str(i) for i in np.flatnonzero(tr)]
            carve = validation_slice(ids)
            Xt, Rt = X[tr], R[tr]
            knn[te] = KnnRouter().fit(Xt[~carve], Rt[~carve], Xt[carve], Rt[carve]).pick(X[te])
        progress(k + 1, folds)
    rows = np.arange(n)
    base = R[rows, single]
    out = {"folds": folds, "n": n, "best_single_cv": float(base.mean()),
           "oracle_headroom": float((R.max(axis=1) - base).mean())}
    for name, picks in (("label_router", label), ("knn", knn if X is not None else None)):
        if picks is None:
            continue
        g, lo, hi = _paired_ci(R[rows, picks] - base)
        out[name] = {"gain": g, "low": lo, "high": hi, "quality": float(R[rows, picks].mean())}
    return out


@heartbeat("pool report", log)
def pool_report(R: np.ndarray, C: np.ndarray, agents: list[str], domains: np.ndarray, split: np.ndarray,
                X: np.ndarray | None = None, difficulty: np.ndarray | None = None,
                domain_name: str | None = None) -> dict:
    """The whole report (JSON-safe) on the development rows; the headroom on the training rows only. Its
    `costs_estimated` (None here) is the caller's to set (`rewards.costs_are_estimated`): it only labels the cost
    column."""
    split = np.asarray(split, dtype=object)
    dev = np.isin(split, ["train", "validation"])
    tr = split == "train"
    if not tr.any():
        raise RouterLiteError("pool report: no training rows")
    R = np.asarray(R, dtype=np.float64)
    C = np.asarray(C, dtype=np.float64)
    domains = np.asarray(domains, dtype=object)
    lead = leaders(R[dev], domains[dev], agents)
    v = verdict(lead, R[dev], agents)
    by_domain = group_table(R[dev], C[dev], domains[dev], agents)
    rep = {"domain_column": domain_name, "n_rows": int(dev.sum()), "verdict": v, "leaders": lead,
           "costs_estimated": None,
           "by_domain": by_domain.to_dict("records"),
           "overall": group_table(R[dev], C[dev], np.full(int(dev.sum()), "all", dtype=object),
                                  agents).to_dict("records"),
           "headroom": routable_headroom(None if X is None else np.asarray(X)[tr], R[tr], domains[tr])}
    if difficulty is not None:
        d = np.asarray(difficulty, dtype=object)[dev]
        rep["by_difficulty"] = group_table(R[dev], C[dev], d, agents).to_dict("records")
    return rep


def _pivot(records: list[dict], cost_label: str, lower_bound=()) -> str:
    df = pd.DataFrame(records)
    df["cell"] = [f"{a:.3f} [{lo:.3f}, {hi:.3f}]" for a, lo, hi in zip(df["accuracy"], df["ci_low"], df["ci_high"])]
    table = df.pivot(index="agent", columns="group", values="cell")
    cost = df.groupby("agent", sort=False)["cost_per_1k"].mean()
    table = table.loc[list(dict.fromkeys(df["agent"]))]
    table[f"cost {cost_label}"] = [("≥ " if a in lower_bound else "") + f"{cost[a]:.3f}" for a in table.index]
    n = df.groupby("group")["n"].first()
    table.columns = [f"{c} (n={n[c]})" if c in n else c for c in table.columns]
    return table.reset_index().to_markdown(index=False)


def pays(point: dict, target: str) -> bool:
    """A cascade pays at an operating point when it costs less than the best single agent and its quality is not
    below what the target asks beyond the noise (the CI's upper end reaches the target's fraction; 1 for a target
    without one): 57 % of the best agent's quality at a third of its cost is cheaper, not a cascade that pays."""
    from pipeline.route.targets import parse_target

    if point.get("cost_ratio") is None or point.get("quality_ratio_ci") is None:
        return False
    wanted = parse_target(target).value if parse_target(target).kind == "quality" else 1.0
    return point["cost_ratio"] < 1 and point["quality_ratio_ci"][1] >= wanted


def cascade_pays(cascade: dict, n_test: int, target: str = "quality>=0.98") -> dict | None:
    """Does a cascade pay on this pool? Read off the `cascade_router` fit (`cascade`: its summary): the answers-only
    variant (no prompt router) at `target`, its point chosen as the lineage chose it (cross-fitted or on
    validation), measured on the `n_test` test rows: quality and cost as fractions of the best single agent's. The
    report reuses that fit and its lazy agreement (the pairs the plans read), never a second fit over all pairs.
    None when the fit holds no such variant or target."""
    t = (((cascade.get("variants") or {}).get("cascade") or {}).get("targets") or {}).get(target)
    if t is None or t.get("quality_ratio") is None:
        return None
    best = cascade["agents"][cascade["best_single"]]
    sel = cascade.get("selection") or {}
    chosen = ("cross-fitted on train + validation" if sel.get("method") == "crossfit" else "chosen on validation")
    return {"target": target, "quality_ratio": t["quality_ratio"], "quality_ratio_ci": t["quality_ratio_ci"],
            "cost_ratio": t["cost_ratio"], "best_single": best, "n_test": int(n_test), "plan": t["plan"],
            "text": (("a cascade pays" if pays(t, target) else "a cascade does not pay here")
                     + f": {t['quality_ratio']:.1%} of {best}'s quality (95 % CI "
                     f"{t['quality_ratio_ci'][0]:.1%}–{t['quality_ratio_ci'][1]:.1%}) at {t['cost_ratio']:.0%} of "
                     f"its cost (target {target} {chosen}, test n={int(n_test)})")}


def report_markdown(rep: dict) -> str:
    """The pool report as Markdown, the verdict first."""
    h = rep["headroom"]
    lines = [f"**Pool verdict: {rep['verdict']['text']}**", ""]
    label = cost_per_1k_label(rep.get("costs_estimated"))
    est = "estimated " if rep.get("costs_estimated") else ""
    if rep["verdict"]["kind"] == "quality-dominated":
        lines += [f"Warning: {WARNING}.", ""]
    if rep.get("quarantined"):
        lines += [quarantine_markdown(rep["quarantined"])]
    lower = rep.get("cost_lower_bound") or {}
    lines += [(f"Accuracy with 95 % CI per agent × {rep.get('domain_column') or 'domain'} on {rep['n_rows']} "
               f"development rows (train + validation); cost is {est}USD per 1k queries:"), "",
              _pivot(rep["by_domain"], label, lower), ""]
    for a, why in lower.items():
        lines += [f"≥: the cost of {a} is a {why}.", ""]
    lines += ["Leaders (top agent, and agents whose paired 95 % CI of the gap to it contains 0): "
              + "; ".join(f"{g}: {', '.join(v['tied_leaders'])}" for g, v in rep["leaders"].items()), ""]
    if rep.get("by_difficulty"):
        lines += ["By difficulty:", "", _pivot(rep["by_difficulty"], label, lower), ""]
    parts = [f"best single (CV) {h['best_single_cv']:.4f}, oracle headroom +{h['oracle_headroom']:.4f}"]
    for name in ("label_router", "knn"):
        if name in h:
            g = h[name]
            parts.append(f"{name.replace('_', ' ')} {g['gain']:+.4f} [{g['low']:+.4f}, {g['high']:+.4f}]")
    lines += [f"Routable headroom ({h['folds']}-fold CV on {h['n']} training rows, gain over the best single "
              f"agent, paired 95 % CI): " + "; ".join(parts), ""]
    if rep.get("cascade"):
        lines += [f"Answers as evidence: {rep['cascade']['text']}.", ""]
    return "\n".join(lines)
