"""Train a routing head with sep-CMA-ES on a static reward matrix.

The objective on the training rows is the mean reward of the agent the head picks, **tie-aware**:

    R_eff[i, j] = max_j' R[i, j']   if agent j is one of row i's best_agents
                  R[i, j]           otherwise

so picking any of the tied best agents of a row earns that row's full (best) reward, and picking a non-best agent
earns its own mean reward.  With 0/1 rewards and ``best_agents`` = the argmax set this equals ``R``; it differs when
``best_agents`` is wider than the exact argmax (a tolerance, repetitions averaged, ...).  With ``cost_lambda = λ > 0``
the objective is ``mean R_eff[i, pick_i] − λ · mean cost[i, pick_i]``.

The search (sep-CMA-ES = ``cma`` with ``CMA_diagonal=True``) starts from ``x0``: zeros, or the closed-form ridge
fit of a per-agent linear reward predictor (a linear head *is* such a predictor: its argmax is the route), with the
ridge strength chosen on validation.  The whole population of each generation is scored with one matrix product.
Each generation the distribution mean is scored on validation; the best-on-validation mean (``x0`` included) is
returned (early stopping), so training never hands back a head worse on validation than its start.

The loop, in full, is `train_head`::

    es = cma.CMAEvolutionStrategy(x0, cfg.sigma0, {"CMA_diagonal": True, "CMA_stds": scales, "seed": cfg.seed})
    for g in range(1, cfg.generations + 1):
        thetas = np.asarray(es.ask())              # (P, n_params): the population
        fit = objective(thetas)                    # (P,) train fitness, one batched matrix product
        es.tell(list(thetas), list(-fit))          # pycma minimises
        val = val_reward(es.mean)                  # early stopping: keep the best-on-validation mean
        if val > best_val: best_val, best_theta = val, es.mean.copy()
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Annotated

import numpy as np
from pydantic import Field

from pipeline.collect.rewards import effective_rewards
from pipeline.core.config import Flag, Int, Number, check_fields, one_of
from pipeline.core.errors import RouterLiteError
from pipeline.route.head import ACTIVATIONS, Head, n_params

log = logging.getLogger(__name__)

INITS = ("ridge", "zeros")
FITNESSES = ("hard", "soft")
SELECTIONS = ("crossfit", "validation")


@dataclass(frozen=True)
class TrainConfig:
    """Options of `train_head` (pycma style: option = default, meaning).

    generations = 60
        Number of CMA-ES generations (ask/tell iterations).
    sigma0 = 0.5
        Initial step size. With ``sigma0_relative`` (and a non-zero ``x0``) it is measured in units of the
        starting head's score spread: per-coordinate scales (pycma ``CMA_stds``) are set so that a step of 1 moves
        each agent's scores by about the standard deviation of its x0 scores over the training rows. Otherwise,
        or when ``x0`` is all zeros, it is an absolute step on every parameter.
    sigma0_relative = True
        Use the score-spread scaling above. A linear head's picks do not change when all its parameters are
        scaled, and a ridge start's weights are ~1e-3, so an absolute step of 0.5 would wipe the start out.
    popsize = None
        Candidates per generation; None = pycma's default ``4 + floor(3 ln n_params)`` (26 for 1,925 params, 31 for
        10,245).
    seed = 42
        Seed of pycma's sampler (must be >= 1: pycma reads 0 as "seed from the clock") and of the random first
        layer of a hidden-layer head. Same data + same config -> identical head.
    init = "ridge"
        Starting point ``x0``: "ridge" = closed-form per-agent ridge regression of the (tie-aware, cost-adjusted)
        rewards on the features, alpha chosen on validation from ``ridge_alphas``; "zeros" = all zeros.
        For a hidden-layer head, "ridge" draws a random first layer and fits the output layer by ridge.
    ridge_alphas = (1e-1, ..., 1e5)
        Grid of 13 ridge strengths, log-spaced; the one whose argmax routing earns the most on validation wins (the
        largest alpha on ties). Without validation rows the geometric middle of the grid is used.
    hidden_dim = 0
        0 = linear head ((d+1)·K parameters); H > 0 = one hidden layer of H units.
    activation = "tanh"
        Hidden-layer activation: "tanh" or "relu".
    standardize = True
        Standardise each embedding feature with the training mean/std (stored with the head).
    l2 = 0.0
        Penalty ``l2 · mean(((θ − x0) / scale)²)`` subtracted from the fitness, with the per-coordinate scales of
        ``sigma0_relative`` (1 when x0 = 0): a trust region around the start (around zero when x0 = 0). A penalty
        toward zero would only shrink a linear head without changing a pick.
    fitness = "hard"
        "hard" = mean reward of the argmax pick (the quantity reported); "soft" = expected reward under
        ``softmax(scores / τ)`` with τ = ``temperature`` · std of the x0 scores (a smoother landscape).
    temperature = 0.1
        Softmax temperature of the soft fitness, relative to the spread of the starting scores.
    cost_lambda = 0.0
        λ of the cost-aware objective ``reward − λ·cost`` (needs per-row costs).
    early_stopping = True
        Return the best-on-validation distribution mean (x0 included) instead of the last one. Needs validation.
    prune_unearned = True
        After training, stop routing to any agent that earns less on the validation rows sent to it than the best
        single (training) agent would on the same rows (its output bias is set to -1e4; see `prune_unearned`).
    min_delta = 0.0
        A later mean replaces the kept one only if its validation reward is higher by more than this.
    keep_confidence = 0.9
        The guard against the winner's curse of early stopping: a later mean replaces the start (x0) only if its
        validation gain over the start is positive with this one-sided confidence (paired bootstrap over the
        validation rows, as the ship gate), besides being the best on validation so far. The best-on-validation
        mean of 60 generations is an optimistic pick over a few hundred rows; at 0 any gain counts (the old rule).
    patience = None
        Stop when the validation reward of the mean has not improved for this many generations (None = never).
    log_every = 10
        Log a progress line every this many generations (0 = silent).
    ship_confidence = 0.9
        The ship gate (`pipeline.route.fit.ship_gate`): the trained head replaces "always the best single agent" only
        if its validation gain over that agent is positive with this one-sided confidence (paired bootstrap over
        the validation rows; a confidence above 0 ships less noise), or positive at all with 0.
        A head that is not shipped is replaced by a constant head, whose cost–quality frontier is a single point.
    ship_gate = True
        Apply the ship gate. False ships the trained router even when it does not beat the best single agent on
        validation (an experiment; the gate's measurement is still reported).
    router = "auto"
        The prompt router kind the lineage ships: "auto" = the kind with the best validation reward among the head
        and every kind of the router table whose class takes ``agents=`` and has ``fit(X_train, R_train, X_val,
        R_val, best_train, best_val)`` ("knn", "cluster", ...; `pipeline.route.select`); or one such kind by name
        ("head": this sep-CMA-ES head). Every kind is fitted and reported either way; the head is trained in every
        case: its value and cost scorers set the operating points.
    select = "crossfit"
        How "auto" chooses among the kinds: "crossfit" = by the out-of-fold reward over the train + validation rows
        (5 seeded folds; every kind fitted on the other folds as the lineage fits it, ~5 more head trainings);
        "validation" = by the reward on the one validation split. The test rows choose nothing either way.
    operating_points = "crossfit"
        How the named targets (``quality>=F``, ``parity``, ``budget=B``) choose their operating point on the head's λ
        path and on the cascade's plans: "crossfit" = on the pooled out-of-fold predictions over the train +
        validation rows (`folds` seeded folds; each fold's value and cost scorers, or cascade plans and prompt
        scorer, fitted on the other folds; the λ (head) or the λ of reward − λ·cost (cascade) chosen there is applied
        to the router fitted on train); "validation" = on the one validation split. Recorded as ``selection`` in the
        path, the train JSON and router_value.json. The test rows choose nothing either way.
    folds = 5
        Number of cross-fitting folds (``select`` and ``operating_points``); at least 2.
    fold_seed = 0
        Seed of the fold cut (`pipeline.route.select.dev_folds`): same data + same seed -> same folds and choices.
    """

    generations: Annotated[Int, Field(ge=0)] = 60
    sigma0: Annotated[Number, Field(gt=0)] = 0.5
    sigma0_relative: Flag = True
    popsize: Annotated[Int, Field(ge=2)] | None = None
    seed: Annotated[Int, Field(ge=1)] = 42  # pycma reads 0 as "seed from the clock"
    init: Annotated[str, one_of(INITS)] = "ridge"
    ridge_alphas: Annotated[tuple[Annotated[Number, Field(gt=0)], ...], Field(min_length=1)] = \
        field(default_factory=lambda: tuple(float(a) for a in np.logspace(-1, 5, 13)))
    hidden_dim: Annotated[Int, Field(ge=0)] = 0
    activation: Annotated[str, one_of(ACTIVATIONS)] = "tanh"
    standardize: Flag = True
    l2: Annotated[Number, Field(ge=0)] = 0.0
    fitness: Annotated[str, one_of(FITNESSES)] = "hard"
    temperature: Annotated[Number, Field(gt=0)] = 0.1
    cost_lambda: Annotated[Number, Field(ge=0)] = 0.0
    early_stopping: Flag = True
    prune_unearned: Flag = True
    min_delta: Number = 0.0
    keep_confidence: Annotated[Number, Field(ge=0, lt=1)] = 0.9
    patience: Int | None = None
    log_every: Int = 10
    ship_confidence: Annotated[Number, Field(ge=0, lt=1)] = 0.9
    ship_gate: Flag = True
    router: str = "auto"
    select: Annotated[str, one_of(SELECTIONS)] = "crossfit"
    operating_points: Annotated[str, one_of(SELECTIONS)] = "crossfit"
    folds: Annotated[Int, Field(ge=2)] = 5
    fold_seed: Int = 0

    def validate(self) -> None:
        """The checks a profile's `train:` gets on reading, for a config built in code (the command line's)."""
        check_fields(self, "TrainConfig")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def selection(self) -> Selection:
        """How the operating points are chosen (`operating_points`, `folds`, `fold_seed`)."""
        return Selection(self.operating_points, int(self.folds), int(self.fold_seed))


@dataclass(frozen=True)
class PromptRows:
    """Prompt embeddings X (n, d) with their reward rows R (n, K), best-agent mask B and costs C (None: not given):
    the rows a prompt router is fitted on, that travel together. `take(mask)`: those rows; `take_any(mask)`: the
    same, or None when the mask holds no row (no validation split)."""

    X: np.ndarray
    R: np.ndarray
    B: np.ndarray | None = None
    C: np.ndarray | None = None

    def take(self, m: np.ndarray) -> PromptRows:
        return PromptRows(self.X[m], self.R[m], None if self.B is None else self.B[m],
                          None if self.C is None else self.C[m])

    def take_any(self, m: np.ndarray) -> PromptRows | None:
        return self.take(m) if m.any() else None


@dataclass(frozen=True)
class Selection:
    """How a cross-fitted choice is made: `method` "crossfit" (on `folds` seeded folds of train + validation,
    pipeline.route.select.dev_folds) or "validation" (on the one validation split). `TrainConfig.selection` carries
    the operating points' one; `as_dict(rows)` is the JSON the lineage records."""

    method: str = "validation"
    folds: int = 5
    seed: int = 0

    @property
    def crossfit(self) -> bool:
        return self.method == "crossfit"

    def as_dict(self, rows: int | None = None) -> dict:
        out = {"method": self.method, "folds": int(self.folds), "seed": int(self.seed)} if self.crossfit \
            else {"method": self.method}
        return out if rows is None else {**out, "rows": int(rows)}


# ---------------------------------------------------------------------------------------------------------------
# rewards and the batched objective
# ---------------------------------------------------------------------------------------------------------------
def _with_bias(Z: np.ndarray) -> np.ndarray:
    return np.hstack([Z, np.ones((Z.shape[0], 1), dtype=np.float32)])


def population_scores(Z1: np.ndarray, thetas: np.ndarray, K: int, hidden_dim: int = 0,
                      activation: str = "tanh") -> np.ndarray:
    """Scores of every candidate on every row: (P, N, K) from Z1 (N, d+1) (bias column last) and thetas (P, n).

    Linear: the stack (P, d+1, K) is one matrix product ``einsum('nd,pdk->pnk')``, done as a single GEMM
    ``Z1 @ W`` with W laid out (d+1, P·K).  Hidden layer: one GEMM for layer 1, one batched matmul for layer 2.
    """
    if hidden_dim == 0:
        return _linear_scores_npk(Z1, thetas, K).transpose(1, 0, 2)
    P = thetas.shape[0]
    d1 = Z1.shape[1]
    T = thetas.astype(np.float32, copy=False)
    H = hidden_dim
    n1 = d1 * H
    W1 = T[:, :n1].reshape(P, d1, H).transpose(1, 0, 2).reshape(d1, P * H)
    A = (Z1 @ W1).reshape(-1, P, H).transpose(1, 0, 2)          # (P, N, H)
    A = np.tanh(A) if activation == "tanh" else np.maximum(A, 0.0)
    W2 = T[:, n1:].reshape(P, H + 1, K)
    return A @ W2[:, :H, :] + W2[:, H:, :]                       # (P, N, K)


def _linear_scores_npk(Z1: np.ndarray, thetas: np.ndarray, K: int) -> np.ndarray:
    """Linear population scores in (N, P, K) layout (contiguous for the argmax over agents): one GEMM."""
    P, d1 = thetas.shape[0], Z1.shape[1]
    W = thetas.astype(np.float32, copy=False).reshape(P, d1, K).transpose(1, 0, 2).reshape(d1, P * K)
    return (Z1 @ W).reshape(-1, P, K)


class _Objective:
    """Mean (tie-aware, cost-adjusted) reward of the picks of a whole population; rows are chunked for memory."""

    def __init__(self, Z1, R_eff, cost, hidden_dim, activation, cost_lambda, soft_tau=None,
                 max_elems: int = 1 << 24):
        self.Z1, self.R, self.cost, self.K = Z1, R_eff, cost, R_eff.shape[1]
        self.hidden_dim, self.activation, self.lam, self.tau = hidden_dim, activation, cost_lambda, soft_tau
        self.max_elems = max_elems

    def __call__(self, thetas: np.ndarray, soft: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Return (fitness (P,), hard reward (P,)): fitness is soft or hard as asked, minus λ·cost."""
        thetas = np.atleast_2d(thetas)
        P, N = thetas.shape[0], self.Z1.shape[0]
        width = P * max(self.K, self.hidden_dim)
        step = max(1, self.max_elems // max(width, 1))
        reward = np.zeros(P)
        fit = np.zeros(P)
        for s in range(0, N, step):
            Z1 = self.Z1[s:s + step]
            if self.hidden_dim == 0:
                S = _linear_scores_npk(Z1, thetas, self.K)             # (n, P, K)
            else:
                S = population_scores(Z1, thetas, self.K, self.hidden_dim, self.activation).transpose(1, 0, 2)
            pick = S.argmax(axis=2)                                   # (n, P)
            rows = np.arange(pick.shape[0])[:, None]
            Rc = self.R[s:s + step]
            hard = Rc[rows, pick].sum(axis=0, dtype=np.float64)       # (P,)
            if self.cost is not None:
                hard_c = hard - self.lam * self.cost[s:s + step][rows, pick].sum(axis=0, dtype=np.float64)
            else:
                hard_c = hard
            reward += hard
            if soft:
                U = Rc if self.cost is None else Rc - self.lam * self.cost[s:s + step]
                Sn = S / self.tau
                Sn -= Sn.max(axis=2, keepdims=True)
                E = np.exp(Sn)
                fit += ((E * U[:, None, :]).sum(axis=2) / E.sum(axis=2)).sum(axis=0, dtype=np.float64)
            else:
                fit += hard_c
        return fit / N, reward / N


# ---------------------------------------------------------------------------------------------------------------
# closed-form start
# ---------------------------------------------------------------------------------------------------------------
def ridge_path(F: np.ndarray, T: np.ndarray, alphas) -> list[tuple[float, np.ndarray]]:
    """Per-agent ridge fits of targets T (N, K) on features F (N, m), intercept unpenalised.

    Returns [(alpha, theta (m+1, K))] with the bias as the last row (one eigendecomposition for all alphas).
    """
    F = F.astype(np.float64)
    mu_f, mu_t = F.mean(axis=0), T.mean(axis=0)
    Fc, Tc = F - mu_f, T.astype(np.float64) - mu_t
    evals, V = np.linalg.eigh(Fc.T @ Fc)
    VtB = V.T @ (Fc.T @ Tc)
    out = []
    for a in alphas:
        W = V @ (VtB / (np.maximum(evals, 0.0) + a)[:, None])
        b = mu_t - mu_f @ W
        out.append((float(a), np.vstack([W, b[None, :]])))
    return out


def _search_scales(x0: np.ndarray, feats: np.ndarray, d: int, K: int, H: int) -> np.ndarray:
    """Per-coordinate step scales (pycma ``CMA_stds``) in units of the starting head's score spread.

    For output agent j let s_j = std over training rows of x0's score of j. Its bias gets scale s_j and each of its
    m input weights s_j / sqrt(sum of the m feature variances), so that a unit step moves agent j's scores by about
    s_j: ``sigma0`` is then "how far to move the scores, as a fraction of how much the start's scores vary".
    A hidden head's first layer keeps the RMS of its random initialisation as scale.
    """
    F = np.asarray(feats, dtype=np.float64)
    m = F.shape[1]
    out_params = x0[-(m + 1) * K:].reshape(m + 1, K)
    s = (F @ out_params[:m] + out_params[m]).std(axis=0)
    if float(s.max()) < 1e-12:                       # constant start (e.g. zero output layer): absolute steps
        return np.ones(x0.size)
    s = np.where(s > 1e-12, s, max(float(s.max()), 1e-6))
    w = s / math.sqrt(max(float(F.var(axis=0).sum()), 1e-12))
    out = np.vstack([np.tile(w, (m, 1)), s[None, :]]).ravel()
    if H == 0:
        return out
    layer1 = x0[: (d + 1) * H]
    return np.concatenate([np.full(layer1.size, max(float(np.sqrt(np.mean(layer1 ** 2))), 1e-6)), out])


def _pick_reward(scores: np.ndarray, R_eff: np.ndarray, cost: np.ndarray | None, lam: float) -> float:
    pick = scores.argmax(axis=1)
    r = R_eff[np.arange(len(pick)), pick]
    if cost is not None and lam:
        r = r - lam * cost[np.arange(len(pick)), pick]
    return float(r.mean())


def _check_inputs(X, R, best, cost, name):
    X = np.asarray(X, dtype=np.float32)
    R = np.asarray(R, dtype=np.float32)
    if X.ndim != 2 or R.ndim != 2 or X.shape[0] != R.shape[0]:
        raise RouterLiteError(f"{name}: embeddings {X.shape} and rewards {R.shape} must be (n, d) and (n, K)")
    if X.shape[0] == 0:
        raise RouterLiteError(f"{name}: no rows")
    if not (np.all(np.isfinite(X)) and np.all(np.isfinite(R))):
        raise RouterLiteError(f"{name}: embeddings or rewards contain NaN/inf")
    if cost is not None:
        cost = np.asarray(cost, dtype=np.float32)
        if cost.shape != R.shape or not np.all(np.isfinite(cost)):
            raise RouterLiteError(f"{name}: cost matrix {cost.shape} must be finite and shaped like rewards {R.shape}")
    return X, effective_rewards(R, best), cost


# ---------------------------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------------------------
def train_head(train: PromptRows, val: PromptRows | None = None, cfg: TrainConfig | None = None,
               agents: list[str] | None = None) -> tuple[Head, list[dict]]:
    """Fit a `Head` by sep-CMA-ES on the `train` rows (early-stopped on the `val` rows; their costs C are read only
    for the cost-aware objective); return it and the training curve (one dict per generation, generation 0 = x0).

    Curve keys: generation, evaluations, sigma, gen_best_reward (best hard train reward in this population),
    best_reward_so_far (best hard train reward of any candidate so far), best_fitness_so_far, mean_train_reward
    (hard train reward of the distribution mean), val_reward / best_val_reward (of the mean; None without
    validation), seconds.  The first entry also carries ``ridge_alpha`` when init="ridge".
    """
    cfg = cfg or TrainConfig()
    cfg.validate()
    X_train, Rt, cost_train, X_val, Rv, cost_val = _train_inputs(train, val, cfg, agents)
    has_val, lam = X_val is not None, cfg.cost_lambda
    d, K, H = X_train.shape[1], Rt.shape[1], cfg.hidden_dim
    rng = np.random.default_rng(cfg.seed)

    # features
    mean, std = _standardizer(X_train, cfg.standardize)
    Zt = X_train if mean is None else (X_train - mean) / std
    Zv = (X_val if mean is None else (X_val - mean) / std) if has_val else None
    Zt1 = _with_bias(Zt)
    Zv1 = _with_bias(Zv) if has_val else None
    U_train = Rt if cost_train is None or not lam else Rt - lam * cost_train

    x0, feats_t, first = _start_point(cfg, rng, Zt, Zv, U_train, Rv, cost_val)
    n = n_params(d, K, H)
    scales = _search_scales(x0, feats_t, d, K, H) if cfg.sigma0_relative and np.any(x0 != 0) else np.ones(n)
    soft = cfg.fitness == "soft"
    tau = None
    if soft:
        s0 = population_scores(Zt1, x0[None], K, H, cfg.activation)[0]
        tau = cfg.temperature * max(float(s0.std()), 1e-6)
    obj_t = _Objective(Zt1, Rt, cost_train, H, cfg.activation, lam, tau)

    def objective(thetas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        fit, reward = obj_t(thetas, soft=soft)
        if cfg.l2:
            fit = fit - cfg.l2 * np.mean(((thetas - x0) / scales) ** 2, axis=1)
        return fit, reward

    def val_rows(theta: np.ndarray) -> np.ndarray | None:   # per-row validation reward (− λ·cost) of the picks
        if not has_val:
            return None
        pick = population_scores(Zv1, theta[None], K, H, cfg.activation)[0].argmax(axis=1)
        r = Rv[np.arange(len(pick)), pick].astype(np.float64)
        return r - lam * cost_val[np.arange(len(pick)), pick] if cost_val is not None and lam else r

    best_theta, curve = _evolve(cfg, x0, scales, objective, val_rows, has_val, first)
    head = Head.from_vector(best_theta, d, K, H, activation=cfg.activation, mean=mean, std=std, agents=agents)
    if cfg.prune_unearned and has_val:
        _prune_after_training(head, curve, U_train, X_val, Rv, cost_val, lam, agents)
    return head, curve


def _train_inputs(train: PromptRows, val: PromptRows | None, cfg: TrainConfig, agents):
    """Checked (X_train, tie-aware R_train, cost_train, X_val, R_val, cost_val): validation parts None without
    validation rows, costs None unless the cost-aware objective needs them; every mismatch -> one error."""
    cost_train = train.C if cfg.cost_lambda else None  # costs only matter for the cost-aware objective
    cost_val = val.C if cfg.cost_lambda and val is not None else None
    X_train, Rt, cost_train = _check_inputs(train.X, train.R, train.B, cost_train, "training rows")
    has_val = val is not None and val.X is not None and val.R is not None
    Rv = X_val = None
    if has_val:
        X_val, Rv, cost_val = _check_inputs(val.X, val.R, val.B, cost_val, "validation rows")
        if X_val.shape[1] != X_train.shape[1] or Rv.shape[1] != Rt.shape[1]:
            raise RouterLiteError(f"validation shapes {X_val.shape}/{Rv.shape} do not match training "
                                  f"{X_train.shape}/{Rt.shape}")
    else:
        X_val = cost_val = None
    if cfg.cost_lambda and (cost_train is None or (has_val and cost_val is None)):
        raise RouterLiteError("TrainConfig.cost_lambda > 0 needs cost_train (and cost_val with validation)")
    if agents is not None and len(agents) != Rt.shape[1]:
        raise RouterLiteError(f"{len(agents)} agent names for {Rt.shape[1]} reward columns")
    return X_train, Rt, cost_train, X_val, Rv, cost_val


def _standardizer(X_train: np.ndarray, standardize: bool):
    """(mean, std) of the training features (std floored to 1 where a feature is constant), or (None, None)."""
    if not standardize:
        return None, None
    mean = X_train.mean(axis=0)
    std = X_train.std(axis=0)
    return mean, np.where(std > 1e-6, std, 1.0).astype(np.float32)


def _start_point(cfg: TrainConfig, rng, Zt, Zv, U_train, Rv, cost_val):
    """(x0, first-layer features of the training rows, extra keys for curve entry 0): a random first layer
    (unit-variance pre-activations for standardised inputs) and the output layer by ridge when init="ridge"."""
    has_val = Zv is not None
    d, K, H, lam = Zt.shape[1], U_train.shape[1], cfg.hidden_dim, cfg.cost_lambda
    n = n_params(d, K, H)
    first: dict = {}
    if H == 0:
        feats_t, feats_v = Zt, Zv
        layer1 = np.zeros(0)
    else:
        W1 = rng.standard_normal((d, H)) / math.sqrt(max(float(Zt.var(axis=0).sum()), 1e-12))
        layer1 = np.vstack([W1, np.zeros((1, H))]).astype(np.float64)
        def act(Z1):
            A = Z1 @ layer1.astype(np.float32)
            return np.tanh(A) if cfg.activation == "tanh" else np.maximum(A, 0.0)
        feats_t = act(_with_bias(Zt))
        feats_v = act(_with_bias(Zv)) if has_val else None
    if cfg.init == "ridge":
        path = ridge_path(feats_t, U_train, cfg.ridge_alphas)
        if has_val:
            F1v = _with_bias(feats_v.astype(np.float32))
            vals = [_pick_reward(F1v @ th.astype(np.float32), Rv, cost_val, lam) for _, th in path]
            best_i = max(range(len(path)), key=lambda i: (vals[i], path[i][0]))
        else:
            best_i = len(path) // 2
        alpha, out = path[best_i]
        x0 = np.concatenate([layer1.ravel(), out.ravel()])
        first["ridge_alpha"] = alpha
    else:
        x0 = np.zeros(n) if H == 0 else np.concatenate([layer1.ravel(), np.zeros((H + 1) * K)])
    assert x0.size == n
    return x0, feats_t, first


def _evolve(cfg: TrainConfig, x0: np.ndarray, scales: np.ndarray, objective, val_rows, has_val: bool,
            first: dict) -> tuple[np.ndarray, list[dict]]:
    """Run sep-CMA-ES from x0: (the chosen parameter vector, the training curve)."""
    import cma

    t0 = time.perf_counter()
    fit0, rew0 = objective(x0[None])
    start_rows = val_rows(x0)
    best_theta = x0.copy()
    best_val = None if start_rows is None else float(start_rows.mean())
    curve = [dict(generation=0, evaluations=0, sigma=cfg.sigma0, gen_best_reward=float(rew0[0]),
                  best_reward_so_far=float(rew0[0]), best_fitness_so_far=float(fit0[0]),
                  mean_train_reward=float(rew0[0]), val_reward=best_val, best_val_reward=best_val,
                  seconds=time.perf_counter() - t0, **first)]
    best_reward, best_fit, since = float(rew0[0]), float(fit0[0]), 0
    opts = {"CMA_diagonal": True, "seed": int(cfg.seed), "verbose": -9, "maxiter": max(cfg.generations, 1),
            "CMA_stds": scales}
    if cfg.popsize:
        opts["popsize"] = int(cfg.popsize)
    es = cma.CMAEvolutionStrategy(x0, cfg.sigma0, opts)
    for g in range(1, cfg.generations + 1):
        thetas = np.asarray(es.ask())                      # (P, n): the population of this generation
        fit, reward = objective(thetas)                    # one batched matrix product for all P candidates
        es.tell(list(thetas), list(-fit))                  # pycma minimises
        mean_theta = np.asarray(es.mean, dtype=np.float64)
        rows = val_rows(mean_theta)
        val = None if rows is None else float(rows.mean())
        best_reward = max(best_reward, float(reward.max()))
        best_fit = max(best_fit, float(fit.max()))
        guard = {}
        if has_val and val > best_val + cfg.min_delta:
            guard = _gain_over_start(rows, start_rows, cfg.keep_confidence)
        if guard.get("kept", False):
            best_val, best_theta, since = val, mean_theta.copy(), 0
        else:
            since += 1
        curve.append(dict(generation=g, evaluations=int(es.countevals), sigma=float(es.sigma),
                          gen_best_reward=float(reward.max()), best_reward_so_far=best_reward,
                          best_fitness_so_far=best_fit, mean_train_reward=float(objective(mean_theta[None])[1][0]),
                          val_reward=val, best_val_reward=best_val, seconds=time.perf_counter() - t0, **guard))
        if cfg.log_every and (g % cfg.log_every == 0 or g == cfg.generations):
            _log_progress(cfg, g, curve[-1], es.sigma)
        if has_val and cfg.patience is not None and since >= cfg.patience:
            log.info("early stop at generation %d: no validation gain for %d generations", g, cfg.patience)
            break
    if not (cfg.early_stopping and has_val):
        best_theta = np.asarray(es.mean, dtype=np.float64)
    return best_theta, curve


def _gain_over_start(rows: np.ndarray, start_rows: np.ndarray, confidence: float) -> dict:
    """Is a candidate's validation gain over the start beyond row noise? {"kept", "val_gain_low"}: the one-sided
    `confidence` lower bound of the paired bootstrap mean of (candidate − start) per validation row must be > 0 (with
    confidence 0: the point gain > 0). Fixed bootstrap seed: same data -> same decision."""
    from pipeline.core.bootstrap import bootstrap_means

    diff = np.asarray(rows, np.float64) - np.asarray(start_rows, np.float64)
    if confidence <= 0:
        return {"kept": bool(diff.mean() > 0), "val_gain_low": float(diff.mean())}
    low = float(np.quantile(bootstrap_means(diff, 1000, 0), 1.0 - confidence))
    return {"kept": low > 0, "val_gain_low": low}


def _log_progress(cfg: TrainConfig, g: int, entry: dict, sigma: float) -> None:
    per_gen = entry["seconds"] / g
    val, best_val = entry["val_reward"], entry["best_val_reward"]
    log.info("gen %d/%d best_reward_so_far=%.4f mean_train=%.4f val=%s best_val=%s sigma=%.3g "
             "(%.1f gen/s, ETA %.0f s)", g, cfg.generations, entry["best_reward_so_far"], entry["mean_train_reward"],
             "-" if val is None else f"{val:.4f}", "-" if best_val is None else f"{best_val:.4f}",
             sigma, 1 / per_gen if per_gen > 0 else float("inf"), (cfg.generations - g) * per_gen)


def _prune_after_training(head: Head, curve: list[dict], U_train, X_val, Rv, cost_val, lam: float,
                          agents: list[str] | None) -> None:
    """Prune the agents that did not earn their share on validation (in place), noting it in the last curve entry."""
    bs = int(np.argmax(U_train.mean(axis=0)))
    Uv = Rv if cost_val is None or not lam else Rv - lam * cost_val
    pruned = prune_unearned(head, X_val, Uv, bs)
    curve[-1]["pruned_agents"] = [agents[j] if agents else j for j in pruned]
    if pruned:
        log.info("pruned agents %s: on validation they earn less than the best single agent on their rows",
                 curve[-1]["pruned_agents"])
        curve[-1]["val_reward_after_pruning"] = _pick_reward(head.scores(X_val), Rv, cost_val, lam)


PRUNED_BIAS = -1.0e4


def prune_unearned(head: Head, X_val: np.ndarray, U_val: np.ndarray, best_single: int) -> list[int]:
    """Stop routing to agents that have not earned their share (in place; returns the pruned agent indices).

    An agent j (not the best single agent) is pruned when, on the validation rows the head sends to it, it earns
    less than the best single agent would on the same rows. Pruning sets its output bias to -1e4, so it is never
    picked; the check repeats until no agent is pruned (a pruned agent's rows move to the agent scored next).
    If the pruned head would earn less on validation than before, nothing is pruned.
    """
    pruned: list[int] = []
    bias = head.b1 if head.W2 is None else head.b2
    original = bias.copy()
    before = float(U_val[np.arange(len(U_val)), head.pick(X_val)].mean())
    while True:
        picks = head.pick(X_val)
        worst, worst_gain = None, 0.0
        for j in range(head.K):
            rows = picks == j
            if j == best_single or j in pruned or not rows.any():
                continue
            gain = float((U_val[rows, j] - U_val[rows, best_single]).mean())
            if gain < worst_gain:
                worst, worst_gain = j, gain
        if worst is None:
            if float(U_val[np.arange(len(U_val)), picks].mean()) < before:   # never trade validation reward
                bias[:] = original
                return []
            return pruned
        bias[worst] = PRUNED_BIAS
        pruned.append(worst)


def best_single_agent(R_train: np.ndarray, best_mask_train: np.ndarray | None = None) -> int:
    """Index of the agent with the highest mean (tie-aware) training reward (lowest index on ties)."""
    return int(np.argmax(effective_rewards(R_train, best_mask_train).mean(axis=0)))


# ---------------------------------------------------------------------------------------------------------------
# the head's own cost–quality frontier
# ---------------------------------------------------------------------------------------------------------------
def lambda_sweep(train: PromptRows, val: PromptRows | None, cfg: TrainConfig | None = None,
                 agents: list[str] | None = None, n: int = 9) -> list[tuple[float, Head]]:
    """One sep-CMA-ES head per λ, each maximising the realised train reward − λ·cost of its picks (the
    non-differentiable objective CMA-ES is for), early-stopped on validation. λ runs from 0 through a log grid
    scaled by the dearest agent's mean train cost (cost then outweighs any reward gap at the top).

    Measured on the demo (docs/training.md): the λ sweep of the max-quality head's *scores* lies below the
    individual hull (test AIQ 0.780 vs 0.816: a head trained for quality ranks agents, it does not price them),
    calibrated scores (the value scorer) 0.810; these λ-trained heads 0.822."""
    cfg = cfg or TrainConfig()
    scale = 1.0 / max(float(np.asarray(train.C, dtype=np.float64).mean(axis=0).max()), 1e-12)
    lams = [0.0, *(np.geomspace(0.02, 2.0, n - 1) * scale).tolist()]
    heads = []
    for lam in lams:
        h, _ = train_head(train, val, replace(cfg, cost_lambda=lam, log_every=0), agents)
        heads.append((float(lam), h))
    return heads


def sweep_points(heads: list[tuple[float, Head]], X: np.ndarray, R: np.ndarray, C: np.ndarray) -> np.ndarray:
    """(L, 2) (mean cost, mean reward) of each λ head's picks on these rows."""
    rows = np.arange(len(X))
    return np.array([(C[rows, p].mean(), R[rows, p].mean()) for p in (h.pick(X) for _, h in heads)])
