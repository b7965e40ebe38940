"""Fit a router on (embeddings, reward rows, split) and measure it on held-out rows.

One function serves the `router_head` asset and `router-lite train`: sep-CMA-ES head, kNN baseline, OOD guard,
held-out metrics, routing report. Pure: same inputs and config → same head and numbers.

The head and the kNN baseline are both routers of the protocol in pipeline/route/routers.py: the ship gate, the guard
and the held-out metrics use only `pick`, so either (or a new type) can be measured, shipped and registered alike.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from pipeline.collect.rewards import costs_are_estimated, effective_rewards, to_arrays
from pipeline.core.errors import RouterLiteError
from pipeline.core.progress import heartbeat, phase_progress
from pipeline.route.evaluate import held_out_metrics, paired_gain_ci, routing_report
from pipeline.route.fitted import FittedRouter
from pipeline.route.head import Head
from pipeline.route.knn import KnnRouter
from pipeline.route.ood import OODGuard
from pipeline.route.routers import Router
from pipeline.route.select import (
    choose_router,
    kind_figures,
)
from pipeline.route.targets import PathRows
from pipeline.route.train import (
    PromptRows,
    Selection,
    TrainConfig,
    best_single_agent,
    lambda_sweep,
    sweep_points,
    train_head,
)

log = logging.getLogger(__name__)
KIND_ROLE = "kind_"  # a FittedRouter companion "kind_<kind>": a prompt-only kind as fitted, for the report
# the FittedRouter companion holding the kNN baseline as fitted (`RouterFit.knn`: raw rewards of the train rows, k
# chosen on validation): the frontier reads it rather than fitting one again. Not the "kind_knn" candidate, which is
# fitted on tie-aware rewards
KNN_ROLE = "knn"


def fitted_kinds(companions: dict) -> dict[str, Router]:
    """{kind: router} of the prompt-only kinds a FittedRouter carries (`RouterFit.kinds`)."""
    return {role[len(KIND_ROLE):]: r for role, r in companions.items() if role.startswith(KIND_ROLE)}


def fitted_knn(fitted: FittedRouter) -> Router:
    """The kNN baseline a prompt router's fit carries (`KNN_ROLE`); one error when it was stored without one."""
    knn = fitted.companions.get(KNN_ROLE)
    if knn is None:
        raise RouterLiteError("router_head carries no fitted kNN baseline (stored by an older version): materialise "
                              "router_head again")
    return knn


@dataclass
class RouterFit:
    agents: list[str]
    head: Router  # the shipped router: the trained Head, or a constant head when the ship gate refused it
    guard: OODGuard
    best_single: int
    knn_k: int
    curve: list[dict]
    metrics: dict  # held-out metrics (METRIC_KEYS) of the head with its OOD guard
    extra: dict = field(default_factory=dict)  # train fit, unguarded head, guard fire rate, routing report, ...
    scorer: Head | None = None  # value scorer: predicted rewards, for the cost-aware operating points
    cost_scorer: Head | None = None  # predicted cost per query and agent (None when the matrix has no costs)
    operating_points: dict = field(default_factory=dict)  # the λ path on validation (pipeline.route.targets)
    value: dict = field(default_factory=dict)  # held-out value report (pipeline.route.value.held_out_value)
    knn: Router | None = None  # the fitted kNN baseline (registrable like the head: kind "knn")
    kinds: dict[str, Router] = field(default_factory=dict)  # every prompt-only kind fitted (`extra["kinds"]`'s)

    def to_fitted(self, summary: dict | None = None) -> FittedRouter:
        """The shipped router with its scorers and guard as it travels along the lineage and into the registry
        (`registry.register_fitted`); `summary` holds at least best_single and operating_points."""
        summary = dict(summary or {})
        summary.setdefault("best_single", self.best_single)
        summary.setdefault("operating_points", self.operating_points)
        companions = {"scorer": self.scorer, **({"cost_scorer": self.cost_scorer} if self.cost_scorer is not None
                                                 else {}),
                      **({KNN_ROLE: self.knn} if self.knn is not None else {}),  # the frontier's kNN row
                      **{KIND_ROLE + k: r for k, r in self.kinds.items()}}  # RouterArena's measures re-run them
        return FittedRouter(self.head, summary, companions, self.guard)


@dataclass(frozen=True)
class RewardArrays:
    """A reward frame as arrays (pipeline.collect.rewards.to_arrays) with its split masks (`split_masks`): what
    fitting a router, a cascade or a value scorer starts from."""

    agents: list[str]
    R: np.ndarray  # (n, K) rewards
    B: np.ndarray  # (n, K) best-agent mask
    C: np.ndarray  # (n, K) costs
    masks: dict[str, np.ndarray]  # train / validation / held_out

    @property
    def R_eff(self) -> np.ndarray:
        """Rewards the router is fitted on (pipeline.collect.rewards.effective_rewards)."""
        return effective_rewards(self.R, self.B)

    def prompt_rows(self, X: np.ndarray) -> PromptRows:
        """The rows with their prompt embeddings X (in row order): what a prompt router is fitted on."""
        return PromptRows(X, self.R, self.B, self.C)


@dataclass(frozen=True)
class Shipped:
    """The prompt routers `fit_router` settled on: the trained head (its scorers set the operating points), the
    router shipped (the chosen kind, or the constant best single agent when the ship gate refused it), the OOD
    guard, the best single agent and the shipped kind's out-of-fold picks (None: not cross-fitted, or refused)."""

    trained: Head
    router: Router
    guard: OODGuard
    best: int
    oof_picks: np.ndarray | None = None


def training_split(rewards: pd.DataFrame, tasks: pd.DataFrame) -> pd.Series:
    """Split per reward row (the task pool's `split`); out-of-distribution tasks become `ood`: never trained on,
    reported apart. The one home of that rule: the lineage, bench/ and scripts/ all split this way."""
    t = rewards[["task_id"]].merge(tasks[["task_id", "split", "ood"]], on="task_id", how="left")
    return t["split"].where(~t["ood"].fillna(False).astype(bool), "ood")


def reward_embeddings(prompt_embeddings: pd.DataFrame, rewards: pd.DataFrame) -> np.ndarray:
    """Embeddings of the reward rows' tasks, in reward-row order."""
    emb = prompt_embeddings.set_index("task_id").loc[rewards["task_id"]]
    return np.stack(emb["embedding"].to_numpy()).astype(np.float32)


def reward_arrays(rewards: pd.DataFrame, split: pd.Series, held_out: str = "test") -> RewardArrays:
    """`rewards` (one row per task) as arrays, with the masks of `split` (one entry per reward row)."""
    agents, R, B, C = to_arrays(rewards)
    return RewardArrays(agents, R, B, C, split_masks(split.reset_index(drop=True), held_out,
                                                     rewards["task_id"].astype(str).tolist()))


def validation_slice(ids: list[str], fraction: float = 0.2) -> np.ndarray:
    """A stable slice of training rows (hash of the id), for when the data has no validation split."""
    return np.array([int(hashlib.sha256(str(q).encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < fraction for q in ids])


def split_masks(split: pd.Series, held_out: str = "test", ids: list[str] | None = None) -> dict[str, np.ndarray]:
    s = split.fillna("").astype(str).to_numpy()
    masks = {"train": s == "train", "validation": s == "validation", "held_out": s == held_out}
    if not masks["validation"].any() and ids is not None:  # early stopping, kNN's k and the guard need one
        carve = masks["train"] & validation_slice(ids)
        masks["train"], masks["validation"] = masks["train"] & ~carve, carve
    if not masks["train"].any():
        raise RouterLiteError("no training rows: the tasks need a `split` column with 'train' rows")
    if not masks["held_out"].any():
        raise RouterLiteError(f"no held-out rows: no task has split {held_out!r}")
    return masks


def ship_gate(head: Router, best: int, X_val: np.ndarray, R_val: np.ndarray, B_val: np.ndarray,
              margin: float = 0.0, confidence: float = 0.0) -> dict:
    """Ship the trained head only if it beats the best single agent on validation; otherwise the router falls back
    to that agent (a router that cannot beat it should not pretend to).

    With `confidence` 0 (default) the point gain must exceed `margin`; with confidence c > 0 the gain's one-sided
    c lower bound (paired bootstrap over the validation rows) must. The head was chosen on these same rows (ridge
    alpha, early stopping), so its validation gain is optimistic: at a few hundred rows a +0.005 point gain is noise
    (docs/training.md). The 95 % interval of the validation gain is always reported (`validation_gain_ci`).
    """
    R_eff = effective_rewards(R_val, B_val)
    picks = head.pick(X_val)
    head_val = float(R_eff[np.arange(len(R_eff)), picks].mean())
    best_val = float(R_eff[:, best].mean())
    ci = paired_gain_ci(picks, R_eff, best, one_sided=confidence if confidence > 0 else None)
    gate = {"head_validation": head_val, "best_single_validation": best_val, "margin": margin,
            "confidence": confidence, "validation_gain_ci": ci}
    if confidence > 0:
        gate["gain_lower_bound"] = ci["lower_one_sided"]
        ok = gate["gain_lower_bound"] > margin
    else:
        ok = head_val > best_val + margin
    return {"shipped": "head" if ok else "best_single", **gate}


def constant_head(like: Router, best: int) -> Head:
    """A head that always picks agent `best` (same input dim and agents as the router `like`, so the registry treats
    it alike)."""
    b1 = np.zeros(like.K, np.float32)
    b1[best] = 1.0
    return Head(np.zeros((like.d, like.K), np.float32), b1, agents=like.agents)


@heartbeat("prompt router fit", log)
def fit_router(X: np.ndarray, rewards: pd.DataFrame, split: pd.Series, cfg: TrainConfig | None = None,
               held_out: str = "test", cost_lambda: float = 0.0, labels=None, frontier: bool = False) -> RouterFit:
    """X[i] embeds the task of reward row i; `split[i]` is its split (train / validation / test ...); `labels[i]`
    (optional) the domain a user knows for it (the per-domain label router's input). `frontier`: also measure the
    head's own cost–quality frontier (`extra["head_sweep"]`: one λ-trained head per point, ~9 more trainings)."""
    arrays = reward_arrays(rewards, split, held_out)
    agents, R, B, C, m = arrays.agents, arrays.R, arrays.B, arrays.C, arrays.masks
    if len(X) != len(R):
        raise RouterLiteError(f"{len(X)} embeddings for {len(R)} reward rows")
    tr, va, te = m["train"], m["validation"], m["held_out"]
    has_val = bool(va.any())
    cfg = cfg or TrainConfig()
    if cost_lambda:
        cfg = replace(cfg, cost_lambda=cost_lambda)
    rows = arrays.prompt_rows(X)
    head, curve = train_head(rows.take(tr), rows.take_any(va), cfg, agents)
    best = best_single_agent(R[tr], B[tr])
    trained = head
    # every prompt kind fitted and reported, one shipped (pipeline/route/select.py); the head sets the operating points
    routers, chosen, val_rewards, crossfit, oof = choose_router(cfg, head, arrays, X)
    head = routers[chosen]
    gate = (ship_gate(head, best, X[va], R[va], B[va], confidence=cfg.ship_confidence) if has_val
            else {"shipped": "head"})
    if not cfg.ship_gate:
        gate = {**gate, "shipped": "head", "gate": "off"}
    gate["router"] = chosen
    if gate["shipped"] != "head":
        head = constant_head(trained, best)
    knn = KnnRouter(agents=agents).fit(X[tr], R[tr], X[va] if has_val else None, R[va] if has_val else None)
    guard = OODGuard().fit(X[tr], X[va] if has_val else X[tr])  # threshold: in-distribution rows not trained on
    raw_picks = head.pick(X[te])
    picks = guard.route(raw_picks, X[te], best)
    knn_picks = knn.pick(X[te])
    metrics = held_out_metrics(picks, R[te], B[te], knn_picks=knn_picks, best_single=best, agents=agents,
                               n_train=int(tr.sum()))
    unguarded = held_out_metrics(raw_picks, R[te], B[te], best_single=best, agents=agents)["head"]
    U_te = effective_rewards(R[te], B[te])
    extra = {
        "head_unguarded": unguarded, "ood_fire_rate": guard.fire_rate(X[te]),
        "train_fit": float(held_out_metrics(head.pick(X[tr]), R[tr], B[tr], best_single=best)["head"]),
        "n_validation": int(va.sum()), "gate": gate,
        "routing": routing_report(picks, R[te], B[te], best_single=best, agents=agents),
        # is the held-out gain over the best single agent more than row-sampling noise?
        "head_gain_ci": paired_gain_ci(picks, U_te, best),
        "knn_gain_ci": paired_gain_ci(knn_picks, U_te, best),
        # every prompt kind side by side: validation (the choice) and test (the report only)
        "kinds": kind_figures(routers, val_rewards, guard, best, X[te], U_te, crossfit, shipped=chosen),
    }
    extra["shipped"] = {"kind": chosen if gate["shipped"] == "head" else "best_single", "chosen": chosen,
                        "selection": "crossfit" if crossfit else "validation",
                        "validation": gate.get("head_validation") if gate["shipped"] == "head"
                        else gate.get("best_single_validation"), "test": metrics["head"]}
    shipped = Shipped(trained, head, guard, best, (oof or {}).get(chosen) if gate["shipped"] == "head" else None)
    value = operating_points(arrays, X, shipped, labels, picks, knn_picks, cfg)
    value["costs_estimated"] = costs_are_estimated(rewards)  # labels the cost column only
    if frontier and np.any(C[tr] > 0):  # the head's own frontier: one λ-trained head per point (train.lambda_sweep)
        extra["head_sweep"] = head_sweep(arrays, X, cfg, score_head=head)
    return RouterFit(agents, head, guard, best, int(knn.k_), curve, metrics, extra, value.pop("scorer"),
                     value.pop("cost_scorer"), value.pop("path"), value, knn=knn, kinds=dict(routers))


@heartbeat("the head's λ frontier", log)
def head_sweep(arrays: RewardArrays, X: np.ndarray, cfg: TrainConfig, score_head: Router | None = None) -> dict:
    """λ-trained heads' (cost, quality) points on validation and held-out rows, with their AIQ over each split's
    individual cost span (pipeline/route/frontier.py); with `score_head`, also the validation AIQ of that head's
    score sweep and `kept`: the better of the two on validation (the frontier's "trained head")."""
    from pipeline.route.frontier import aiq, cost_span, policy_points

    R, B, C, m = arrays.R, arrays.B, arrays.C, arrays.masks
    tr, va, te = m["train"], m["validation"], m["held_out"]
    has_val = bool(va.any())
    rows = arrays.prompt_rows(X)
    heads = lambda_sweep(rows.take(tr), rows.take_any(va), cfg, arrays.agents)
    out = {"lambdas": [lam for lam, _ in heads]}
    for name, rows in (("validation", va if has_val else tr), ("test", te)):
        R_eff = effective_rewards(R[rows], B[rows])
        pts = sweep_points(heads, X[rows], R_eff, C[rows])
        out[f"points_{name}"] = pts.tolist()
        out[f"aiq_{name}"] = float(aiq(pts, *cost_span(R_eff, C[rows])))
    if score_head is not None:
        rows = va if has_val else tr
        R_eff = effective_rewards(R[rows], B[rows])
        out["aiq_validation_score_sweep"] = float(aiq(policy_points(score_head.scores(X[rows]), R_eff, C[rows]),
                                                      *cost_span(R_eff, C[rows])))
        out["kept"] = "lambda-trained" if out["aiq_validation"] >= out["aiq_validation_score_sweep"] else "score"
    return out


@heartbeat("operating points", log)
def operating_points(arrays: RewardArrays, X: np.ndarray, shipped: Shipped, labels, picks_te, knn_picks_te,
                     cfg: TrainConfig | None = None) -> dict:
    """The value scorer, the λ path the targets resolve on (on validation, or cross-fitted: `choice_rows`) and the
    held-out value report."""
    from pipeline.route.targets import operating_path
    from pipeline.route.value import PromptParts, agent_costs, fit_scorers, held_out_value, label_router_metrics

    C, m, agents, best = arrays.C, arrays.masks, arrays.agents, shipped.best
    tr, te = m["train"], m["held_out"]
    R_eff = arrays.R_eff
    scorer, cost_scorer, info = fit_scorers(shipped.trained, X, R_eff, C, tr, m["validation"])
    cost = agent_costs(C[tr])
    rows, selection = choice_rows(shipped, arrays, X, scorer, cost_scorer, cfg or TrainConfig())
    path = operating_path(rows, cost, best, agents)
    path["scorer"] = info
    path["cost_model"] = "predicted per query" if cost_scorer is not None else "agent mean"
    path["selection"] = selection
    parts = PromptParts(shipped.router, shipped.guard, scorer, cost_scorer, path, best, cost)
    value = held_out_value(parts, X[te], R_eff[te], C[te], picks_te, agents)
    n = np.arange(int(te.sum()))
    value["knn"] = float(R_eff[te][n, knn_picks_te].mean())
    if labels is not None:
        labels = np.asarray(labels, dtype=object)
        value["label_router"] = label_router_metrics(labels[tr], R_eff[tr], labels[te], R_eff[te], best, picks_te,
                                                     agents)
    value["head_minus_knn"] = paired_gain_ci(picks_te, R_eff[te], knn_picks_te)
    return {"scorer": scorer, "cost_scorer": cost_scorer, "path": path, **value}


def choice_rows(shipped: Shipped, arrays: RewardArrays, X: np.ndarray, scorer: Head, cost_scorer: Head | None,
                cfg: TrainConfig) -> tuple[PathRows, dict]:
    """The rows the targets choose their λ on (`PathRows`: predicted rewards, max-quality picks, rewards, costs,
    pick-time costs) and how they were chosen ({"method", ...}): the validation rows with the scorers fitted on train
    (`operating_points: validation`, or no validation rows), or every train + validation row with the predictions
    of the scorers fitted on the other folds (`crossfit`, pipeline.route.select.dev_folds) and the shipped router's
    out-of-fold picks (the best single agent's when the ship gate refused). The test rows are never read."""
    from pipeline.route.select import dev_folds
    from pipeline.route.value import agent_costs, fit_scorers, pick_costs

    R_eff, C, best, sel = arrays.R_eff, arrays.C, shipped.best, cfg.selection
    tr, va = arrays.masks["train"], arrays.masks["validation"]
    if not sel.crossfit or not va.any():
        rows = va if va.any() else tr
        picks0 = shipped.guard.route(shipped.router.pick(X[rows]), X[rows], best)
        return (PathRows(scorer.scores(X[rows]), picks0, R_eff[rows], C[rows],
                         pick_costs(cost_scorer, X[rows], agent_costs(C[tr]))), Selection().as_dict(rows.sum()))
    pred, pick_cost = np.zeros(R_eff.shape), np.zeros(R_eff.shape)
    progress = phase_progress("operating points: cross-fitted scorers", "folds", log)
    for f, (held, t, v) in enumerate(dev_folds(tr, va, sel.folds, sel.seed)):
        s, cs, _ = fit_scorers(shipped.trained, X, R_eff, C, t, v)
        pred[held], pick_cost[held] = s.scores(X[held]), pick_costs(cs, X[held], agent_costs(C[t]))
        progress(f + 1, int(sel.folds))
    rows = tr | va
    picks0 = np.full(int(rows.sum()), best) if shipped.oof_picks is None else shipped.oof_picks[rows]
    return PathRows(pred[rows], picks0, R_eff[rows], C[rows], pick_cost[rows]), sel.as_dict(rows.sum())
