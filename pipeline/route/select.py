"""Which prompt router ships: every prompt-only kind fitted, measured on validation, the best one chosen.

The candidates are the sep-CMA-ES head and every kind of the router table (pipeline/route/routers.py) whose class
takes ``agents=`` and has ``fit(X_train, R_train, X_val, R_val, best_train, best_val)``: the kNN baseline, the coarse
cluster router (pipeline/route/cluster.py), any kind a user registers. Kinds that need more than a prompt (the cascade
reads the agents' answers) have no such `fit` and are not candidates here.

`select_router` chooses by the **validation** reward of each kind's picks (the mean tie-aware reward; ties -> the
earlier kind of `candidate_kinds`, the head first); the test rows choose nothing: `kind_figures` measures every kind
on the held-out rows afterwards, for the report only. Every kind chose its own hyper-parameters on the same validation
rows (the head's ridge alpha and early stopping, kNN's k; the cluster router chooses its k on train), so those
validation figures are a little optimistic; the ship gate (pipeline/route/fit.py) still demands that the chosen router's validation gain over
the best single agent be significant.
"""
from __future__ import annotations

import numpy as np

from pipeline.core.errors import RouterLiteError
from pipeline.route.routers import Router, router_class, router_kinds

AUTO = "auto"


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


def fit_kind(kind: str, agents: list[str], X_train, R_train, B_train, X_val, R_val, B_val) -> Router:
    """A router of table kind `kind` fitted the way `KnnRouter` is (`cls(agents=...).fit(...)`)."""
    cls = router_class(kind)
    if not fits_from_prompts(cls):
        raise RouterLiteError(f"train.router {kind!r}: router kind {cls.__name__} has no fit(X_train, R_train, X_val, "
                              f"R_val, best_train, best_val); the lineage cannot train it")
    return cls(agents=agents).fit(X_train, R_train, X_val, R_val, B_train, B_val)


def fit_candidates(kinds: list[str], head: Router, agents: list[str], X_train, R_train, B_train, X_val, R_val,
                   B_val) -> dict[str, Router]:
    """{kind: fitted router}: the trained head as given, every other kind fitted the way `KnnRouter` is."""
    return {k: head if k == "head" else fit_kind(k, agents, X_train, R_train, B_train, X_val, R_val, B_val)
            for k in kinds}


def validation_rewards(routers: dict[str, Router], X_val: np.ndarray, U_val: np.ndarray) -> dict[str, float]:
    """Mean (tie-aware) validation reward of each router's picks."""
    rows = np.arange(len(U_val))
    return {k: float(U_val[rows, np.asarray(r.pick(X_val))].mean()) for k, r in routers.items()}


def select_router(routers: dict[str, Router], X_val: np.ndarray | None, U_val: np.ndarray | None) -> tuple[str, dict]:
    """(chosen kind, {kind: validation reward}): the best by validation reward, the earlier kind on ties; without
    validation rows the first kind (the head)."""
    if not routers:
        raise RouterLiteError("select_router: no router kinds to choose from")
    kinds = list(routers)
    if X_val is None or U_val is None or len(U_val) == 0:
        return kinds[0], {}
    val = validation_rewards(routers, X_val, U_val)
    best = max(kinds, key=lambda k: (round(val[k], 12), -kinds.index(k)))
    return best, val


def kind_figures(routers: dict[str, Router], val: dict[str, float], guard, best: int, X_te: np.ndarray,
                 U_te: np.ndarray) -> dict[str, dict]:
    """Per kind: validation reward (the choice), held-out test reward with the OOD guard (the report), the paired 95 %
    CI of its test gain over the best single agent, and the kind's own hyper-parameter (k) where it has one."""
    from pipeline.route.evaluate import paired_gain_ci

    rows = np.arange(len(U_te))
    out = {}
    for k, r in routers.items():
        picks = guard.route(np.asarray(r.pick(X_te)), X_te, best) if guard is not None else np.asarray(r.pick(X_te))
        ci = paired_gain_ci(picks, U_te, best)
        out[k] = {"validation": val.get(k), "test": float(U_te[rows, picks].mean()),
                  "test_gain": ci["gain"], "test_gain_low": ci["low"], "test_gain_high": ci["high"],
                  **({"k": int(r.k_)} if getattr(r, "k_", None) is not None else {})}
    return out
