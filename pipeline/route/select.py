"""Which prompt router ships: every prompt-only kind fitted, measured on validation, the best one chosen.

The candidates are the sep-CMA-ES head and every kind of the router table (pipeline/route/routers.py) whose class
takes ``agents=`` and has ``fit(X_train, R_train, X_val, R_val, best_train, best_val)``: the kNN baseline, the coarse
cluster router (pipeline/route/cluster.py), any kind a user registers. Kinds that need more than a prompt (the cascade
reads the agents' answers) have no such `fit` and are not candidates here.

`select_router` chooses by the **validation** reward of each kind's picks (the mean tie-aware reward; ties -> the
earlier kind of `candidate_kinds`, the head first), or, with `train.select: crossfit` (the default), by the
**cross-fitted** reward (`crossfit_picks`, `crossfit_rewards`): the train + validation rows are cut into
`train.folds` (5) seeded folds (`dev_folds`), every kind is fitted on the other folds exactly as the lineage fits it
(their training rows to train, their validation rows for early stopping and hyper-parameters) and scored on the held
fold, so the choice rests on every development row instead of one small validation split. The same folds and
out-of-fold picks serve the cross-fitted operating points (`train.operating_points`, pipeline/route/fit.py and
cascade_fit.py). The test rows choose nothing: `kind_figures` measures every kind
on the held-out rows afterwards, for the report only. Every kind chose its own hyper-parameters on the same validation
rows (the head's ridge alpha and early stopping, kNN's k; the cluster router chooses its k on train), so those
validation figures are a little optimistic; the ship gate (pipeline/route/fit.py) still demands that the chosen
router's validation gain over the best single agent be significant.
"""
from __future__ import annotations

import logging

import numpy as np

from pipeline.collect.rewards import effective_rewards
from pipeline.core.errors import RouterLiteError
from pipeline.core.progress import PhaseSteps, heartbeat, phase_progress
from pipeline.route.kinds import router_class, router_kinds
from pipeline.route.routers import Router
from pipeline.route.train import PromptRows, Selection

AUTO = "auto"
log = logging.getLogger(__name__)


FIT_PARAMS = ("X_train", "R_train", "X_val", "R_val", "best_train", "best_val")


def fits_from_prompts(cls: type) -> bool:
    """Does the class have the lineage's ``fit(X_train, R_train, X_val, R_val, best_train, best_val)``?"""
    import inspect

    fit = inspect.getattr_static(cls, "fit", None)
    if not inspect.isfunction(fit):  # absent, or a classmethod / staticmethod with another contract
        return False
    return list(inspect.signature(fit).parameters)[1:7] == list(FIT_PARAMS)


def candidate_kinds() -> list[str]:
    """"head" first, then every other table kind that the lineage can fit from prompts alone (sorted)."""
    return ["head", *(k for k in router_kinds() if k != "head" and fits_from_prompts(router_class(k)))]


def fit_kind(kind: str, agents: list[str], train: PromptRows, val: PromptRows | None) -> Router:
    """A router of table kind `kind` fitted the way `KnnRouter` is (`cls(agents=...).fit(...)`) on the `train` rows,
    its hyper-parameters chosen on the `val` rows (None: none)."""
    cls = router_class(kind)
    if not fits_from_prompts(cls):
        raise RouterLiteError(f"train.router {kind!r}: router kind {cls.__name__} has no fit(X_train, R_train, X_val, "
                              f"R_val, best_train, best_val); the lineage cannot train it")
    v = val or PromptRows(None, None)
    return cls(agents=agents).fit(train.X, train.R, v.X, v.R, train.B, v.B)


def fit_candidates(kinds: list[str], head: Router, agents: list[str], train: PromptRows,
                   val: PromptRows | None, step=None) -> dict[str, Router]:
    """{kind: fitted router}: the trained head as given, every other kind fitted the way `KnnRouter` is; `step()`
    (a `PhaseSteps`, or None) after each kind fitted here."""
    out = {}
    for k in kinds:
        out[k] = head if k == "head" else fit_kind(k, agents, train, val)
        if step is not None and k != "head":  # the trained head is given: no step of this phase
            step()
    return out


def validation_rewards(routers: dict[str, Router], X_val: np.ndarray, U_val: np.ndarray) -> dict[str, float]:
    """Mean (tie-aware) validation reward of each router's picks."""
    rows = np.arange(len(U_val))
    return {k: float(U_val[rows, np.asarray(r.pick(X_val))].mean()) for k, r in routers.items()}


def select_router(routers: dict[str, Router], X_val: np.ndarray | None, U_val: np.ndarray | None,
                  scores: dict[str, float] | None = None) -> tuple[str, dict]:
    """(chosen kind, {kind: figure}): the best by validation reward (or by the given `scores`, e.g. the cross-fitted
    rewards), the earlier kind on ties; without validation rows and scores the first kind (the head)."""
    if not routers:
        raise RouterLiteError("select_router: no router kinds to choose from")
    kinds = list(routers)
    if scores is not None:
        val = {k: scores[k] for k in kinds}
    elif X_val is None or U_val is None or len(U_val) == 0:
        return kinds[0], {}
    else:
        val = validation_rewards(routers, X_val, U_val)
    best = max(kinds, key=lambda k: (round(val[k], 12), -kinds.index(k)))
    return best, val


def dev_folds(train: np.ndarray, val: np.ndarray, folds: int = 5, seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """The cross-fitting folds of the train + validation rows, seeded: one (held, train & ~held, val & ~held) triple
    of row masks per fold (the held rows of the folds partition the development rows; test rows are in none). Every
    cross-fitted choice cuts its folds here: the prompt kinds (`crossfit_rewards`), the head's operating points
    (pipeline/route/fit.py) and the cascade's plans (pipeline/route/cascade_fit.py)."""
    if int(folds) < 2:
        raise RouterLiteError(f"cross-fitting needs at least 2 folds, got {folds}")
    from sklearn.model_selection import PredefinedSplit

    dev = np.flatnonzero(train | val)
    out = []
    # the seeded cut of row i into fold perm[i] % folds, as a scikit-learn splitter (same rows per fold as before)
    for _, rows in PredefinedSplit(np.random.default_rng(seed).permutation(len(dev)) % int(folds)).split():
        held = np.zeros(len(train), bool)
        held[dev[rows]] = True
        out.append((held, train & ~held, val & ~held))
    return out


def crossfit_picks(kinds: list[str], train_head_fn, agents: list[str], rows: PromptRows, train: np.ndarray,
                   val: np.ndarray, selection: Selection) -> dict[str, np.ndarray]:
    """{kind: (n,) out-of-fold picks}: each development row picked by the kind fitted on the other folds
    (`selection`'s folds and seed; see the module docstring); -1 on the other rows. `train_head_fn(rows_train,
    rows_val)` returns the head fitted on those row masks (the lineage's trainer and config)."""
    oof = {k: np.full(len(rows.R), -1, np.int64) for k in kinds}
    # one step per kind and fold (the head's training its own): a fold of a large matrix takes tens of seconds
    step = PhaseSteps(phase_progress(f"cross-fitting {len(kinds)} router kind(s) x {selection.folds} folds", "fits",
                                     log), len(kinds) * int(selection.folds))
    for held, tr, va in dev_folds(train, val, selection.folds, selection.seed):
        head = train_head_fn(tr, va) if "head" in kinds else None
        if head is not None:
            step()
        for k, r in fit_candidates(kinds, head, agents, rows.take(tr), rows.take_any(va), step).items():
            oof[k][held] = np.asarray(r.pick(rows.X[held]))
    return oof


def crossfit_rewards(picks: dict[str, np.ndarray], R, B) -> dict[str, float]:
    """{kind: out-of-fold mean (tie-aware) reward} over the development rows of `crossfit_picks`' picks."""
    U = effective_rewards(R, B)
    return {k: float(U[np.flatnonzero(p >= 0), p[p >= 0]].mean()) for k, p in picks.items()}


def kind_figures(routers: dict[str, Router], val: dict[str, float], guard, best: int, X_te: np.ndarray,
                 U_te: np.ndarray, crossfit: dict[str, float] | None = None,
                 shipped: str | None = None) -> dict[str, dict]:
    """Per kind: validation reward (the choice), held-out test reward with the OOD guard (the report), the paired 95 %
    CI of its test gain over the best single agent, the kind's own hyper-parameter (k) where it has one, and, beside
    the `shipped` kind, the paired 95 % CI of its test reward minus the shipped kind's (`minus_shipped`: whether a
    gap between kinds is more than row noise)."""
    from pipeline.route.evaluate import paired_gain_ci

    rows = np.arange(len(U_te))
    picks = {k: guard.route(np.asarray(r.pick(X_te)), X_te, best) if guard is not None else np.asarray(r.pick(X_te))
             for k, r in routers.items()}
    out = {}
    for k, r in routers.items():
        ci = paired_gain_ci(picks[k], U_te, best)
        out[k] = {"validation": val.get(k), **({"crossfit": crossfit[k]} if crossfit else {}),
                  "test": float(U_te[rows, picks[k]].mean()),
                  "test_gain": ci["gain"], "test_gain_low": ci["low"], "test_gain_high": ci["high"],
                  **({"k": int(r.k_)} if getattr(r, "k_", None) is not None else {})}
        if shipped in picks and k != shipped:  # paired over the test rows
            d = paired_gain_ci(picks[k], U_te, picks[shipped])
            out[k]["minus_shipped"] = {"gain": d["gain"], "low": d["low"], "high": d["high"]}
    return out


@heartbeat("router kinds", log)
def choose_router(cfg, head: Router, arrays, X: np.ndarray):
    """(every candidate kind fitted {kind: router}, the chosen kind, {kind: validation reward}, {kind: cross-fitted
    reward} or None, {kind: out-of-fold picks} or None): what `fit_router` ships before its ship gate, from the
    reward matrix `arrays` (pipeline.route.fit.RewardArrays) and the embeddings X of its rows. `cfg.router`
    "auto" lets every kind compete, a kind name ships that kind (all are still fitted, for the report); `cfg.select`
    says how "auto" chooses."""
    from dataclasses import replace

    from pipeline.route.train import train_head

    agents, R, B, train, val = arrays.agents, arrays.R, arrays.B, arrays.masks["train"], arrays.masks["validation"]
    rows = PromptRows(X, R, B, arrays.C)
    has_val = bool(val.any())
    U = effective_rewards(R, B)
    kinds = candidate_kinds()
    fitted = kinds if cfg.router in (AUTO, *kinds) else [*kinds, cfg.router]
    routers = fit_candidates(fitted, head, agents, rows.take(train), rows.take_any(val),
                             PhaseSteps(phase_progress("fitting the prompt router kinds", "kinds", log),
                                        sum(k != "head" for k in fitted)))
    allowed = {k: r for k, r in routers.items() if cfg.router in (AUTO, k)}
    crossfit = oof = None
    compete = cfg.select == "crossfit" and len(allowed) > 1
    if compete or (cfg.operating_points == "crossfit" and has_val):  # cross-fitted kinds and / or targets
        def head_on(t, v):
            return train_head(rows.take(t), rows.take_any(v), replace(cfg, log_every=0), agents)[0]
        oof = crossfit_picks(list(routers if compete else allowed), head_on, agents, rows, train, val,
                             Selection("crossfit", cfg.folds, cfg.fold_seed))
        crossfit = crossfit_rewards(oof, R, B) if compete else None
    chosen, _ = select_router(allowed, X[val] if has_val else None, U[val] if has_val else None, scores=crossfit)
    return routers, chosen, (validation_rewards(routers, X[val], U[val]) if has_val else {}), crossfit, oof
