"""Fit cascades on the static matrix: search stages, agreement rules and prompt thresholds on train, per answer
format (grader), sweep the cost–quality trade-off, and resolve the operating points on validation with a guard
against the winner's curse.

The search (`candidates`): the last agent is one of the two best on train; the cheap stage is 1–3 of the cheapest
other agents (accept when all agree, or 2 of 3; one agent alone is accepted when it produced an answer); an optional
second check adds one more agent (accept when 2 of those called agree); with the prompt router, a skip threshold
and an accept-alone threshold on its predicted success of the lead agent (train quantiles). Single agents are
policies too (one stage), so the family reaches every corner of the individual frontier.

Per answer format (`fit_plans`): a cascade that pays where cheap agents agree reliably (GSM8K integers) may not pay
where replies are long and agreement is rare (MATH expressions), so every grader with enough train rows gets its own
candidates; a pooled fit is the default for other formats. For each λ of the sweep, each group takes the policy
maximising train reward − λ·cost (λ runs through every break point of the groups' train hulls, so every vertex of
the combined train frontier is a plan).

Choosing on validation (`cascade_path`, resolved by pipeline.route.targets.resolve): the path's points carry
quality, cost and the paired difference to the best single agent. Picking the cheapest passing point among many
is optimistic (the winner's curse: `quality>=0.98` held 98 % on validation and 96.8 % on test in the prompt-only
path), so the path carries `guard_z`: a quality target F must hold with a margin of z standard errors of the paired
difference (`quality − z·se ≥ F·best`), and max-quality is the best point whose one-sided 90 % lower bound of its
gain over the best single agent is > 0, else the best single agent. z is measured in docs/training.md.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from itertools import combinations

import numpy as np

from pipeline.core.progress import PhaseSteps, heartbeat, phase_progress
from pipeline.route.cascade import CascadeRouter, Plan, Policy, Stage, run_plan, run_policies
from pipeline.route.targets import bootstrap_mean_ci
from pipeline.route.train import Selection

log = logging.getLogger(__name__)
GUARD_Z = 1.0
MAX_QUALITY_CONFIDENCE_Z = 1.2816  # one-sided 90 %
CHEAP_POOL = 5  # cheap-stage agents are drawn from this many of the cheapest agents
MIN_GROUP_ROWS = 60  # train rows a grader needs for its own policies
SKIP_QUANTILES = (0.1, 0.2, 0.3, 0.45)
ACCEPT_QUANTILES = (0.5, 0.65, 0.8, 0.9)


def preference(R_train: np.ndarray) -> np.ndarray:
    """Agent indices by train quality, best first (the accepted reply within an agreeing class)."""
    return np.argsort(-R_train.mean(axis=0), kind="stable")


def candidates(R: np.ndarray, C: np.ndarray, P: np.ndarray | None, n_final: int = 2) -> list[Policy]:
    K = R.shape[1]
    q, c = R.mean(axis=0), C.mean(axis=0)
    order = list(np.argsort(-q, kind="stable"))
    out = [Policy((Stage((j,)),)) for j in range(K)]
    for final in order[:n_final]:
        cheap = [j for j in np.argsort(c, kind="stable") if j != final][:CHEAP_POOL]
        cheap = sorted(cheap, key=lambda j: order.index(j))  # most accurate first: the lead
        firsts = []
        for size in (1, 2, 3):
            for s in combinations(cheap, size):
                for k in ((1,) if size == 1 else (2,) if size == 2 else (2, 3)):
                    firsts.append(Stage(tuple(s), k))
        structures = []
        for s1 in firsts:
            structures.append((s1,))
            if len(s1.agents) <= 2 and s1.k == len(s1.agents):
                for g in order:
                    if g != final and g not in s1.agents:
                        structures.append((s1, Stage((g,), 2)))
        for st in structures:
            stages = (*st, Stage((final,)))
            out.append(Policy(stages))
            if P is None:
                continue
            p = P[:, st[0].agents[0]]
            skips = [None, *np.quantile(p, SKIP_QUANTILES).tolist()]
            accepts = [None, *np.quantile(p, ACCEPT_QUANTILES).tolist()]
            for sk in skips:
                for ac in accepts:
                    if (sk is None and ac is None) or (sk is not None and ac is not None and ac <= sk):
                        continue
                    out.append(Policy(stages, skip_below=sk, accept_above=ac))
    return out


def _hull_slopes(points: np.ndarray) -> list[float]:
    """The λ at which the argmax of reward − λ·cost changes along one group's (cost, reward) points: the slopes of
    their upper hull (pipeline.route.frontier.upper_hull; sums of rewards within 1e-12 count as ties)."""
    from pipeline.route.frontier import upper_hull

    h = upper_hull(points, tol=1e-12)
    return [float((y2 - y1) / (x2 - x1)) for (x1, y1), (x2, y2) in zip(h, h[1:]) if x2 > x1]


def fit_plans(R, C, E, P, graders, order, best: int) -> list[Plan]:
    """The train frontier of plans (see the module docstring), best single agent included."""
    graders = np.asarray(graders, dtype=object)
    groups = {None: np.ones(len(R), dtype=bool)}
    for g in sorted(set(graders.tolist())):
        m = graders == g
        if m.sum() >= MIN_GROUP_ROWS and len(set(graders.tolist())) > 1:
            groups[g] = m
    cands, sums = {}, {}
    for g, m in groups.items():
        pool = candidates(R[m], C[m], None if P is None else P[m])
        outs = run_policies(pool, R[m], C[m], E[m], order, None if P is None else P[m])
        cands[g] = pool
        sums[g] = np.array([(o.cost.sum(), o.reward.sum()) for o in outs])
    lams = sorted({0.0, *[x for g in sums for x in _hull_slopes(sums[g])]})
    grid = [0.0] + [(a + b) / 2 for a, b in zip(lams, lams[1:])] + [lams[-1] * 2 + 1.0]
    plans: list[Plan] = []
    for lam in grid:
        pick = {}
        for g in groups:
            v = sums[g][:, 1] - lam * sums[g][:, 0]
            ok = np.flatnonzero(v >= v.max() - 1e-9)
            pick[g] = cands[g][int(ok[np.argmin(sums[g][ok, 0])])]  # ties: the cheaper policy
        plan = Plan(pick[None], tuple(sorted((g, p) for g, p in pick.items() if g is not None)))
        if plan not in plans:
            plans.append(plan)
    single = Plan(Policy((Stage((best,)),)))
    if single not in plans:
        plans.append(single)
    return plans


def outcome_stats(reward: np.ndarray, cost: np.ndarray, by: np.ndarray, n_calls: np.ndarray, best_reward: np.ndarray,
                  agents: list[str]) -> dict:
    """Quality with a 95 % CI, cost per 1k queries, paired difference to the best single agent (CI and standard
    error), shares of the agent whose reply is returned, calls per query."""
    lo, hi = bootstrap_mean_ci(reward)
    diff = reward - best_reward
    dlo, dhi = bootstrap_mean_ci(diff)
    n = len(reward)
    counts = np.bincount(by, minlength=len(agents))
    return {"quality": float(reward.mean()), "ci_low": lo, "ci_high": hi, "cost_per_1k": float(1000 * cost.mean()),
            "gain": float(diff.mean()), "gain_low": dlo, "gain_high": dhi,
            "gain_se": float(diff.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0,
            "shares": {a: float(counts[j] / n) for j, a in enumerate(agents)},
            "calls_per_query": float(n_calls.mean())}


def cascade_path(plans: list[Plan], rows: Rows, order, best: int, agents: list[str], guard_z: float = GUARD_Z) -> dict:
    """The operating path on these (validation) `rows`: one point per plan (`as_path`)."""
    pts = []
    for plan in plans:
        o = run_plan(plan, rows.R, rows.C, rows.E, order, rows.P, rows.graders)
        pts.append({"plan": plan.to_dict(agents), "describe": plan.describe(agents),
                    **outcome_stats(o.reward, o.cost, o.answered_by, o.n_calls, rows.R[:, best], agents)})
    return as_path(pts, best, agents, guard_z, len(rows.R))


def as_path(pts: list[dict], best: int, agents: list[str], guard_z: float, n_rows: int,
            selection: dict | None = None) -> dict:
    """A path of points ({"plan", "describe", **outcome_stats}), sorted by cost; point 0 is the max-quality point
    (best quality among points whose gain's one-sided 90 % lower bound is > 0, else the best single agent, whose
    point must be among them) so that `targets.resolve` reads it like the head's path."""
    single = Plan(Policy((Stage((best,)),))).to_dict(agents)
    pts = sorted(pts, key=lambda s: (s["cost_per_1k"], -s["quality"]))
    base = next(i for i, s in enumerate(pts) if s["plan"] == single)
    sure = [i for i, s in enumerate(pts) if s["gain"] - MAX_QUALITY_CONFIDENCE_Z * s["gain_se"] > 0]
    top = max(sure, key=lambda i: (pts[i]["quality"], -pts[i]["cost_per_1k"])) if sure else base
    pts.insert(0, pts.pop(top))
    for i, s in enumerate(pts):
        s["lambda"] = float(i)  # a path index: cascades have no λ; `lambda=L` picks the L-th point
    b = next(s for s in pts if s["plan"] == single)
    return {"kind": "cascade", "agents": list(agents), "best_single": agents[best], "guard_z": guard_z,
            "best_single_validation": {k: b[k] for k in ("quality", "ci_low", "ci_high", "cost_per_1k")},
            "n_validation": int(n_rows), "selection": selection or {"method": "validation", "rows": int(n_rows)},
            "points": pts}


@dataclass(frozen=True)
class Rows:
    """The static matrix on some rows: rewards R (n, K), costs C (n, K), agreement E (n, K, K, or the lazy
    pipeline.collect.answers.Agreement), the prompt router's predicted success P (n, K; None: cascades without it)
    and each row's grader."""

    R: np.ndarray
    C: np.ndarray
    E: np.ndarray
    P: np.ndarray | None
    graders: np.ndarray

    def take(self, m: np.ndarray) -> Rows:
        return Rows(self.R[m], self.C[m], self.E[m], None if self.P is None else self.P[m], self.graders[m])


def fit_cascade(train: Rows, validation: Rows, best: int, agents: list[str],
                guard_z: float = GUARD_Z) -> tuple[list[Plan], dict, np.ndarray]:
    """(the train frontier plans, their validation path, agent preference); rows without P: cascade only."""
    order = preference(train.R)
    plans = fit_plans(train.R, train.C, train.E, train.P, train.graders, order, best)
    path = cascade_path(plans, validation, order, best, agents, guard_z)
    return plans, path, order


def plan_at(points: np.ndarray, lam: float) -> int:
    """Index of the plan whose (mean cost, mean reward) `points` on its fitting rows maximise reward − λ·cost (ties:
    the cheaper plan): the plan `fit_plans`' sweep chose at that λ (the plans are its λ vertices)."""
    v = points[:, 1] - lam * points[:, 0]
    ok = np.flatnonzero(v >= v.max() - 1e-12)
    return int(ok[np.argmin(points[ok, 0])])


def fold_fits(rows: Rows, train: np.ndarray, val: np.ndarray, best: int, selection: Selection, p_of=None,
              progress=None) -> list[dict]:
    """Per cross-fitting fold (pipeline.route.select.dev_folds): the plans fitted on the other folds' rows (with the
    prompt router's predicted success refitted there by `p_of(train_rows, val_rows)` when the rows carry one), their
    (mean cost, mean reward) on those rows, the agent preference, the held rows."""
    from dataclasses import replace

    from pipeline.route.select import dev_folds

    out = []
    for held, t, v in dev_folds(train, val, selection.folds, selection.seed):
        r = rows if rows.P is None or p_of is None else replace(rows, P=p_of(t, v))
        fit = r.take(t | v)
        order = preference(fit.R)
        plans = fit_plans(fit.R, fit.C, fit.E, fit.P, fit.graders, order, best)
        out.append({"held": held, "rows": r, "order": order, "plans": plans, "points": test_points(plans, fit, order)})
        if progress is not None:
            progress()
    return out


def crossfit_path(plans: list[Plan], points: np.ndarray, folds: list[dict], best: int, agents: list[str],
                  guard_z: float, selection: dict) -> dict:
    """The operating path read on the pooled out-of-fold outcomes: for each λ of reward − λ·cost (every break point
    of the final and the folds' train hulls), each fold's plan at λ runs on its held rows, and the point carries the
    final fit's plan at λ (`plans`, their train `points`); the best single agent is a point too."""
    lams = sorted({0.0, *(x for p in [points, *(f["points"] for f in folds)] for x in _hull_slopes(p))})
    grid = [0.0] + [(a + b) / 2 for a, b in zip(lams, lams[1:])] + [lams[-1] * 2 + 1.0]
    dev = np.logical_or.reduce([f["held"] for f in folds])
    R, C = folds[0]["rows"].R[dev], folds[0]["rows"].C[dev]  # every fold's rows are the same matrix
    runs: dict = {}
    pts, seen = [], set()
    for lam in grid:
        key = (plan_at(points, lam), *(plan_at(f["points"], lam) for f in folds))
        if key in seen:
            continue
        seen.add(key)
        o = {k: np.zeros(len(dev), t) for k, t in (("reward", float), ("cost", float), ("by", np.int64),
                                                    ("calls", np.int64))}
        for i, (f, k) in enumerate(zip(folds, key[1:])):
            h = f["rows"].take(f["held"])
            r = runs.setdefault((i, k), run_plan(f["plans"][k], h.R, h.C, h.E, f["order"], h.P, h.graders))
            for name, x in (("reward", r.reward), ("cost", r.cost), ("by", r.answered_by), ("calls", r.n_calls)):
                o[name][f["held"]] = x
        pts.append({"plan": plans[key[0]].to_dict(agents), "describe": plans[key[0]].describe(agents),
                    **outcome_stats(o["reward"][dev], o["cost"][dev], o["by"][dev], o["calls"][dev], R[:, best],
                                    agents)})
    single = Plan(Policy((Stage((best,)),)))
    pts.append({"plan": single.to_dict(agents), "describe": single.describe(agents),
                **outcome_stats(R[:, best], C[:, best], np.full(len(R), best), np.ones(len(R), np.int64), R[:, best],
                                agents)})
    return as_path(pts, best, agents, guard_z, int(dev.sum()), {**selection, "rows": int(dev.sum())})


# ------------------------------------------------------------------------------------------- held-out value
def path_aiq(path: dict, cost_span: tuple[float, float]) -> float:
    """AIQ of a path's (cost per query, quality) points over `cost_span` (pipeline.route.frontier.aiq)."""
    from pipeline.route.frontier import aiq

    pts = np.array([(p["cost_per_1k"] / 1000.0, p["quality"]) for p in path["points"]])
    return float(aiq(pts, *cost_span))


def ratio_ci(reward: np.ndarray, best_reward: np.ndarray, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % paired bootstrap interval of mean(reward) / mean(best_reward) (the same rows resampled for both)."""
    idx = np.random.default_rng(seed).integers(0, len(reward), (n_boot, len(reward)))
    b = best_reward[idx].mean(axis=1)
    r = np.where(b > 0, reward[idx].mean(axis=1) / np.where(b > 0, b, 1), np.nan)
    return float(np.nanquantile(r, 0.025)), float(np.nanquantile(r, 0.975))


def held_out_cascade(path: dict, rows: Rows, order, best: int, agents: list[str], targets) -> dict:
    """Per target: the plan the validation path selects, scored on these (test) `rows`, in the shape of
    pipeline.route.value.held_out_value's targets (plus quality and cost ratios with their paired CIs, calls per query,
    plan). scripts/operating_points.py reports these very figures."""
    from pipeline.route.targets import resolve

    R, C = rows.R, rows.C
    bq, bc = float(R[:, best].mean()), float(1000 * C[:, best].mean())
    out = {}
    for name in targets:
        point = resolve(name, path)
        plan = Plan.from_dict(path["points"][point["index"]]["plan"], agents)
        o = run_plan(plan, R, C, rows.E, order, rows.P, rows.graders)
        s = outcome_stats(o.reward, o.cost, o.answered_by, o.n_calls, R[:, best], agents)
        lo, hi = ratio_ci(o.reward, R[:, best])
        clo, chi = ratio_ci(o.cost, C[:, best])
        out[point["target"]] = {
            **{k: s[k] for k in ("quality", "ci_low", "ci_high", "cost_per_1k", "gain", "gain_low", "gain_high",
                                 "shares", "calls_per_query")},
            "cost_ratio": s["cost_per_1k"] / bc if bc > 0 else None, "lambda": point["lambda"],
            "quality_ratio": s["quality"] / bq if bq > 0 else None, "quality_ratio_ci": [lo, hi],
            "cost_ratio_ci": [clo, chi],
            "val_quality": point["quality"], "val_cost_per_1k": point["cost_per_1k"],
            "plan": plan.describe(agents)}
    return out


def test_points(plans: list[Plan], rows: Rows, order) -> np.ndarray:
    """(L, 2) (cost per query, quality) of every plan of a family on these rows: its sweep on the frontier."""
    return np.array([(o.cost.mean(), o.reward.mean())
                     for o in (run_plan(p, rows.R, rows.C, rows.E, order, rows.P, rows.graders) for p in plans)])


VARIANTS = ("cascade", "combined")  # cascade only (answers), and with the prompt router's thresholds


@dataclass
class CascadeVariant:
    """One variant of `fit_cascades`: its validation path, agent preference, number of plans, AIQ on validation and
    test, the plans' test points and the held-out targets (`held_out_cascade`)."""

    path: dict
    order: list[int]
    n_plans: int
    aiq_validation: float
    aiq_test: float
    points_test: list
    targets: dict


@dataclass
class CascadeFit:
    """`fit_cascades`' result: the variants fitted (VARIANTS), how many validation rows chose their points, the guard
    and the chosen variant (higher validation AIQ). `to_dict()`: the JSON summary the lineage keeps."""

    variants: dict[str, CascadeVariant]
    validation_rows: int
    guard_z: float
    chosen: str = ""
    selection: dict = field(default_factory=lambda: {"method": "validation"})  # how the operating points were chosen

    @property
    def best(self) -> CascadeVariant:
        return self.variants[self.chosen]

    def to_dict(self) -> dict:
        return asdict(self)


def fit_cascades(matrix: Rows, masks: dict, best: int, agents: list[str], targets, guard_z: float = GUARD_Z,
                 selection: Selection | None = None, p_of=None) -> CascadeFit:
    """Both variants fitted on train, pathed on validation (or, with a cross-fitting `selection`, on the pooled
    out-of-fold outcomes over train + validation: `fold_fits`, `crossfit_path`; `p_of` refits the prompt router's
    predicted success per fold) and scored on the held-out rows; `chosen` is the variant with the higher AIQ on the
    rows its path was read on (the held-out rows choose nothing). Zero API calls: the `matrix` (R, C, E, P,
    graders; P None: no combined variant) is the static matrix."""
    from dataclasses import replace

    from pipeline.route.frontier import aiq, cost_span

    R, C, P = matrix.R, matrix.C, matrix.P
    tr, va, te = masks["train"], masks["validation"], masks["held_out"]
    cross = selection is not None and selection.crossfit and bool(va.any())
    if not va.any():
        va = tr  # no validation rows: the path is read on train (said in the summary)
    read = (tr | va) if cross else va
    span_va, span_te = cost_span(R[read], C[read]), cost_span(R[te], C[te])
    out = CascadeFit({}, int(va.sum()), guard_z, selection=selection.as_dict(read.sum()) if cross
                     else Selection().as_dict(va.sum()))
    variants = [v for v in VARIANTS if v != "combined" or P is not None]
    steps = PhaseSteps(phase_progress("cascade search", "fits", log), len(variants) * (1 + (selection.folds if cross
                                                                                     else 0)))
    for variant in variants:
        use_p = variant == "combined"
        rows = replace(matrix, P=P if use_p else None, graders=np.asarray(matrix.graders, dtype=object))
        plans, path, order = fit_cascade(rows.take(tr), rows.take(va), best, agents, guard_z=guard_z)
        steps()
        if cross:
            folds = fold_fits(rows, tr, va, best, selection, p_of, steps)
            path = crossfit_path(plans, test_points(plans, rows.take(tr), order), folds, best, agents, guard_z,
                                 out.selection)
        test = rows.take(te)
        pts = test_points(plans, test, order)
        out.variants[variant] = CascadeVariant(
            path, order.tolist(), len(plans), path_aiq(path, span_va), float(aiq(pts, *span_te)), pts.tolist(),
            held_out_cascade(path, test, order, best, agents, targets))
    out.chosen = max(out.variants, key=lambda v: out.variants[v].aiq_validation)
    return out


def success_refit(scorer, X: np.ndarray, U: np.ndarray):
    """`p_of(train_rows, val_rows)` for `fold_fits`: the prompt router's predicted success (n, K) of a value scorer
    refitted on a fold's rows (`scorer`'s standardisation, ridge strength chosen on the fold's validation rows)."""
    from pipeline.route.value import fit_value_scorer

    def p_of(t: np.ndarray, v: np.ndarray) -> np.ndarray:
        v = v if v.any() else t
        return fit_value_scorer(scorer, X[t], U[t], X[v], U[v])[0].scores(X)

    return p_of


def selection_of(train_config: dict | None) -> Selection:
    """The operating-point selection of a stored TrainConfig dict (`operating_points`, `folds`, `fold_seed`;
    `TrainConfig.selection` of the config itself): an old lineage's config without them chose on validation."""
    tc = train_config or {}
    return Selection(tc.get("operating_points", "validation"), int(tc.get("folds", 5)), int(tc.get("fold_seed", 0)))


@heartbeat("cascade router fit", log)
def fit_cascade_router(arrays, agreement, X: np.ndarray, fallback, scorer, best: int, targets=None,
                       selection: Selection | None = None) -> tuple[CascadeRouter, CascadeFit]:
    """The cascade router of a reward matrix (`arrays`: pipeline.route.fit.RewardArrays) from the agreement of the
    agents' recorded answers (`agreement`: pipeline.collect.answers.Agreement, lazy, with each row's grader and the
    grading budget), falling back on the prompt router `fallback` whose value `scorer` gives the predicted success:
    (the router of the chosen variant, `fit_cascades`' result). The `cascade_router` asset and `router-lite train`
    call it. `selection` (`TrainConfig.selection`, `selection_of`): how the operating points are chosen (None: on
    validation)."""
    from pipeline.route.targets import REPORT_TARGETS

    U = arrays.R_eff
    matrix = Rows(U, arrays.C, agreement, scorer.scores(X), agreement.graders)
    fit = fit_cascades(matrix, arrays.masks, best, arrays.agents, REPORT_TARGETS if targets is None else targets,
                       selection=selection, p_of=success_refit(scorer, X, U))
    return CascadeRouter(fallback, fit.best.path, fit.best.order, arrays.agents), fit
