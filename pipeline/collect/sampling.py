"""New agents measured on a sample: which tasks a new agent is called on, how its reward on the other
tasks is estimated, and whether it enters the pool's cost-quality frontier.

When agents join a pool (the wider pool of the re-collection schedule, or a run on it with the existing call log)
and the profile sets `collection.new_agent_sample.fraction` > 0, the collection calls each NEW agent (an agent of
the run's pool that the profile's own pool lacks) only on `choose_sample`'s tasks:

- stratified: `fraction` of each source's tasks (`sample_size`: at least 2), the collection's partitions being per
  source, each partition samples its own source;
- informative (strategy `disagreement`): half of a source's quota among the tasks where the existing agents disagree
  (some right, some wrong), the other half uniformly among the rest of the source, so the estimate still sees the
  easy and the impossible tasks; strategy `random`: uniform within the source;
- seeded and deterministic: the draw depends only on (seed, agent name, source, task ids, the existing agents'
  rewards), through a stable hash (never Python's salted `hash`).

`estimate_agent` predicts the new agent's reward on the unsampled tasks from the existing agents' rewards, the
source and (when given) the prompt embedding, with one of two models (`MODELS`):

- `logistic`: scikit-learn's L2 logistic regression of the new agent's reward on those features;
- `irt`: a two-parameter IRT / logistic factorisation fitted (numpy) on the whole observed matrix: each task has a
  difficulty and a `rank`-dimensional trait, each agent an ability and a loading; P(right) = sigmoid(ability_a +
  loading_a . trait_t - difficulty_t).

Each model's probabilities are then calibrated per design stratum (source x disagreement: within one the draw is
uniform) by the sample's mean residual there (`calibrate`: a difference estimator, unbiased by design even where the
model misfits: without it the disagreement-heavy sample pulled every estimate about 0.02 low on demo_wide).
The quality estimate is (the sample's rewards + the predicted probabilities) / tasks, overall and per source; its
interval is a bootstrap that refits the model on resamples of the sample (stratified by source) and draws each
unsampled task's outcome from its predicted probability (so the interval covers the agent's realised quality, not
only the model's mean). The cost per task is a ratio estimate: the existing agents' mean cost on every task x (new
agent's cost / existing agents' cost on the sample, per source). `frontier_decision` says whether the agent is on
the pool's cost-quality frontier (no agent at least as good and at most as costly, one of them strictly) and in what
share of the bootstrap draws; the rest of its calls are collected when that share exceeds 1 - confidence (it may
join), or for every agent when `complete: all`.

Plain Python (numpy, scikit-learn); the collection asset (assets/collection.py) wires it.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Annotated

import numpy as np
from pydantic import Field

from pipeline.collect.sample_size import sample_size
from pipeline.core.config import Int, Number, check_fields, one_of
from pipeline.core.errors import RouterLiteError
from pipeline.core.pareto import on_frontier

STRATEGIES = ("disagreement", "random")
MODELS = ("logistic", "irt")
COMPLETE = ("joiners", "all", "none")
EMBEDDING_DIMS = 16  # prompt embeddings enter the estimate as their first principal components


@dataclass(frozen=True)
class NewAgentSample:
    """The `collection.new_agent_sample:` section: new agents measured on a sample of tasks (off by default).

    fraction = 0.0
        Share of each source's tasks a new agent (one of the run's pool that the profile's pool lacks) is called on
        before the decision; 0 = off (every agent is called on every task). Above 0 and at most 1.
    strategy = "disagreement"
        disagreement (half of each source's quota where the existing agents disagree, half at random) | random.
    seed = 0
        Seed of the draw (with the agent's name and the source: the same sample on every rerun).
    model = "logistic"
        Estimator of the unsampled rewards: logistic (scikit-learn) | irt (two-parameter IRT factorisation).
    complete = "joiners"
        Whose remaining calls a later collection makes: joiners (agents that may enter the frontier) | all | none.
    confidence = 0.9
        A new agent's remaining calls are collected when it is on the frontier in more than 1 - confidence of the
        bootstrap draws; 0.5 to 1 (exclusive).
    boot = 200
        Bootstrap draws of the estimate's interval (0 = none).
    """

    fraction: Annotated[Number, Field(ge=0, le=1)] = 0.0
    strategy: Annotated[str, one_of(STRATEGIES)] = "disagreement"
    seed: Int = 0
    model: Annotated[str, one_of(MODELS)] = "logistic"
    complete: Annotated[str, one_of(COMPLETE)] = "joiners"
    confidence: Annotated[Number, Field(ge=0.5, lt=1)] = 0.9
    boot: Annotated[Int, Field(ge=0)] = 200

    def __post_init__(self) -> None:
        check_fields(self, "collection.new_agent_sample")

    @property
    def on(self) -> bool:
        return float(self.fraction) > 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def stable_seed(*parts) -> int:
    """A 63-bit seed from `parts` (stable across processes, unlike `hash`)."""
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "big") >> 1


def new_agents(pool_agents: list[str], base_agents: list[str]) -> list[str]:
    """The agents of the run's pool that the profile's own pool lacks, in pool order."""
    base = set(base_agents)
    return [a for a in pool_agents if a not in base]


def disagreement(base_rewards: np.ndarray) -> np.ndarray:
    """(n,) bool: the existing agents disagree on the task (mean reward strictly between 0 and 1)."""
    m = np.asarray(base_rewards, dtype=float)
    m = m.mean(axis=1) if m.ndim == 2 and m.shape[1] else np.full(len(m), 0.5)
    return (m > 0) & (m < 1)


def choose_sample(task_ids, sources, base_rewards, fraction: float, strategy: str = "disagreement", seed: int = 0,
                  agent: str = "") -> np.ndarray:
    """Sorted indices of the tasks `agent` is called on: per source round(fraction x its tasks) (at least
    2, at most all: `sample_size`), drawn as the module docstring says. `base_rewards` (n, K) are the existing agents'
    rewards on the same tasks (K may be 0: then `disagreement` draws uniformly)."""
    task_ids = np.asarray([str(t) for t in task_ids])
    sources = np.asarray([str(s) for s in sources])
    if len(task_ids) != len(sources) or len(task_ids) != len(base_rewards):
        raise RouterLiteError(f"choose_sample: {len(task_ids)} tasks, {len(sources)} sources and "
                              f"{len(base_rewards)} reward rows differ")
    if strategy not in STRATEGIES:
        raise RouterLiteError(f"sampling strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if not 0 < fraction <= 1:
        raise RouterLiteError(f"sampling fraction must be above 0 and at most 1, got {fraction}")
    dis = disagreement(np.asarray(base_rewards, dtype=float).reshape(len(task_ids), -1))
    chosen: list[int] = []
    for src in sorted(set(sources)):
        idx = np.flatnonzero(sources == src)
        idx = idx[np.argsort(task_ids[idx], kind="stable")]  # the draw does not depend on the rows' order
        k = sample_size(len(idx), fraction)
        rng = np.random.default_rng(stable_seed(seed, agent, src, len(idx)))
        first = np.array([], dtype=int)
        if strategy == "disagreement":
            pool = idx[dis[idx]]
            first = rng.choice(pool, size=min(len(pool), k // 2), replace=False) if len(pool) else first
        rest = idx[~np.isin(idx, first)]  # in task-id order (setdiff1d would sort by row)
        second = rng.choice(rest, size=min(len(rest), k - len(first)), replace=False)
        chosen += [int(i) for i in first] + [int(i) for i in second]
    return np.array(sorted(chosen), dtype=int)


# --- estimators --------------------------------------------------------------------------------------------------
def embedding_features(embeddings: np.ndarray | None, dims: int = EMBEDDING_DIMS) -> np.ndarray | None:
    """The first `dims` principal components of the prompt embeddings (unsupervised, over every task)."""
    if embeddings is None:
        return None
    E = np.asarray(embeddings, dtype=float)
    E = E - E.mean(axis=0, keepdims=True)
    _, s, vt = np.linalg.svd(E, full_matrices=False)
    Z = E @ vt[:dims].T
    return Z / np.maximum(Z.std(axis=0, keepdims=True), 1e-9)


def features(base_rewards: np.ndarray, sources, emb: np.ndarray | None = None) -> np.ndarray:
    """Per task: the existing agents' rewards, their mean, the source (one-hot) and the embedding's components."""
    B = np.asarray(base_rewards, dtype=float)
    srcs = np.asarray([str(s) for s in sources])
    onehot = (srcs[:, None] == np.array(sorted(set(srcs)))[None, :]).astype(float)
    parts = [B, B.mean(axis=1, keepdims=True) if B.shape[1] else np.zeros((len(B), 1)), onehot]
    if emb is not None:
        parts.append(np.asarray(emb, dtype=float))
    return np.hstack(parts)


def _weighted(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fractional rewards (a mean over repetitions) as two weighted rows: y=1 with weight r, y=0 with 1-r."""
    return np.vstack([X, X]), np.r_[np.ones(len(y)), np.zeros(len(y))], np.r_[y, 1.0 - y]


def predict_logistic(X: np.ndarray, y: np.ndarray, observed: np.ndarray, C: float = 1.0) -> np.ndarray:
    """P(right) on every row from an L2 logistic regression fitted on the `observed` rows (a bool mask, or counts:
    a row drawn twice by a bootstrap weighs twice)."""
    from sklearn.linear_model import LogisticRegression

    counts = np.asarray(observed).astype(float)
    o = counts > 0
    ys = y[o]
    if ys.min() == ys.max():
        return np.full(len(y), float(ys.mean()))
    Xw, yw, w = _weighted(X[o], ys)
    w = w * np.r_[counts[o], counts[o]]
    keep = w > 0
    model = LogisticRegression(C=C, max_iter=2000).fit(Xw[keep], yw[keep], sample_weight=w[keep])
    return model.predict_proba(X)[:, 1]


def predict_irt(R: np.ndarray, mask: np.ndarray, target: int, rank: int = 2, iters: int = 300, l2: float = 0.05,
                lr: float = 0.5, seed: int = 0) -> np.ndarray:
    """P(right) of agent column `target` on every task from a two-parameter IRT factorisation of the whole matrix
    `R` (n, K) fitted on its `mask`ed (observed) cells: sigmoid(ability_a + loading_a . trait_t - difficulty_t),
    full-batch gradient descent on the mean log loss + l2."""
    R = np.asarray(R, dtype=float)
    M = np.asarray(mask, dtype=bool)
    n, K = R.shape
    rng = np.random.default_rng(seed)
    T = 0.1 * rng.standard_normal((n, rank))
    L = 0.1 * rng.standard_normal((K, rank))
    a = np.zeros(K)
    d = np.zeros(n)
    W = M.astype(float)
    Y = np.where(M, R, 0.0)
    rows = np.maximum(W.sum(axis=1), 1.0)
    cols = np.maximum(W.sum(axis=0), 1.0)
    for _ in range(iters):
        Z = a[None, :] + T @ L.T - d[:, None]
        G = W * (1.0 / (1.0 + np.exp(-Z)) - Y)  # d loss / d Z on the observed cells
        a -= lr * (G.sum(axis=0) / cols + l2 * a)
        d -= lr * (-G.sum(axis=1) / rows + l2 * d)
        gT = (G @ L) / rows[:, None] + l2 * T
        gL = (G.T @ T) / cols[:, None] + l2 * L
        T -= lr * gT
        L -= lr * gL
    return 1.0 / (1.0 + np.exp(-(a[target] + T @ L[target] - d)))


def predict(model: str, X: np.ndarray, base: np.ndarray, y: np.ndarray, observed: np.ndarray,
            seed: int = 0) -> np.ndarray:
    """P(right) of the new agent on every task (observed rows included) by `model` (one of MODELS)."""
    if model == "logistic":
        return predict_logistic(X, y, observed)
    if model == "irt":
        R = np.column_stack([base, y])
        mask = np.column_stack([np.ones_like(base, dtype=bool), observed])
        return predict_irt(R, mask, R.shape[1] - 1, seed=seed)
    raise RouterLiteError(f"estimator {model!r} is not one of {', '.join(MODELS)}")


def calibrate(p: np.ndarray, y: np.ndarray, counts: np.ndarray, strata: np.ndarray) -> np.ndarray:
    """`p` shifted, per design stratum (source x whether the existing agents disagree: within one the sample is
    uniform), by the sample's mean residual y - p there (weighted by `counts`), clipped to [0, 1]: a model-assisted
    (difference) estimator, design-unbiased whatever the model's misfit."""
    out = np.array(p, dtype=float)
    w = np.asarray(counts, dtype=float)
    for h in set(strata.tolist()):
        i = strata == h
        if w[i].sum() > 0:
            out[i] = np.clip(p[i] + np.sum(w[i] * (y[i] - p[i])) / w[i].sum(), 0.0, 1.0)
    return out


@dataclass
class AgentEstimate:
    """One new agent's estimate: overall and per source, with the bootstrap intervals."""

    quality: float
    ci_low: float
    ci_high: float
    per_source: dict  # source -> {estimate, ci_low, ci_high, sampled, tasks}
    cost: float  # estimated mean cost per task
    p_task: np.ndarray  # (n,) observed reward where sampled, else P(right)
    c_task: np.ndarray  # (n,) observed cost where sampled, else the ratio estimate
    draws: np.ndarray  # (boot,) quality draws
    cost_draws: np.ndarray  # (boot,) cost draws


def ratio_costs(base_costs: np.ndarray, y_cost: np.ndarray, sample: np.ndarray, sources) -> np.ndarray:
    """Per task: the observed cost on the sample, elsewhere the existing agents' mean cost x the per-source ratio
    of the new agent's cost to theirs on the sample."""
    srcs = np.asarray([str(s) for s in sources])
    bm = np.asarray(base_costs, dtype=float)
    bm = bm.mean(axis=1) if bm.ndim == 2 and bm.shape[1] else np.ones(len(srcs))
    out = np.array(y_cost, dtype=float)
    obs = np.zeros(len(srcs), bool)
    obs[sample] = True
    for s in set(srcs):
        i = srcs == s
        denom = bm[i & obs].sum()
        ratio = y_cost[i & obs].sum() / denom if denom > 0 else 1.0
        fill = bm[i] * ratio if denom > 0 else np.full(i.sum(), y_cost[i & obs].mean() if (i & obs).any() else 0.0)
        out[i] = np.where(obs[i], y_cost[i], fill)
    return out


@dataclass(frozen=True)
class Existing:
    """The existing agents' matrix a new agent is estimated against: rewards and costs (n, K_base), each task's
    source and, optionally, its prompt embedding (the logistic model's features)."""

    rewards: np.ndarray
    costs: np.ndarray
    sources: object
    emb: np.ndarray | None = None


def estimate_agent(existing: Existing, y: np.ndarray, y_cost: np.ndarray, sample: np.ndarray,
                   model: str = "logistic", boot: int = 200, seed: int = 0) -> AgentEstimate:
    """The new agent's quality (mean reward over every task) and cost from its rewards `y` / costs `y_cost` on the
    `sample` rows only (other rows of y are never read), with 95 % bootstrap intervals (module docstring)."""
    base_rewards, base_costs, sources, emb = existing.rewards, existing.costs, existing.sources, existing.emb
    n = len(y)
    srcs = np.asarray([str(s) for s in sources])
    sample = np.asarray(sample, dtype=int)
    if len(sample) == 0:
        raise RouterLiteError("a new agent's estimate needs at least one sampled task")
    y = np.where(np.isin(np.arange(n), sample), np.nan_to_num(np.asarray(y, dtype=float)), 0.0)
    y_cost = np.where(np.isin(np.arange(n), sample), np.nan_to_num(np.asarray(y_cost, dtype=float)), 0.0)
    base = np.asarray(base_rewards, dtype=float)
    X = features(base, srcs, emb)
    obs = np.zeros(n, bool)
    obs[sample] = True
    strata = np.char.add(srcs, np.where(disagreement(base), "|disagree", "|agree"))
    p0 = predict(model, X, base, y, obs, seed=seed)  # irt: one fit (a refit per bootstrap draw is slow)
    p = calibrate(p0, y, obs, strata)
    p_task = np.where(obs, y, p)
    c_task = ratio_costs(base_costs, y_cost, sample, srcs)
    rng = np.random.default_rng(stable_seed("boot", seed))
    by_src = {s: sample[srcs[sample] == s] for s in sorted(set(srcs))}
    draws, cost_draws, src_draws = [], [], {s: [] for s in by_src}
    for _ in range(int(boot)):
        s_idx = np.concatenate([rng.choice(v, size=len(v), replace=True) for v in by_src.values() if len(v)])
        counts = np.bincount(s_idx, minlength=n)
        o = counts > 0
        pb = calibrate(predict_logistic(X, y, counts) if model == "logistic" else p0, y, counts, strata)
        realised = np.where(obs, y, rng.random(n) < pb).astype(float)  # unsampled outcomes drawn from pb
        draws.append(realised.mean())
        cb = ratio_costs(base_costs, y_cost, np.flatnonzero(o), srcs)
        cost_draws.append(float(cb.mean()))
        for s in by_src:
            src_draws[s].append(realised[srcs == s].mean())
    draws, cost_draws = np.array(draws), np.array(cost_draws)

    def ci(v: np.ndarray, point: float) -> tuple[float, float]:
        return (float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))) if len(v) else (point, point)

    per_source = {}
    for s in by_src:
        i = srcs == s
        est = float(p_task[i].mean())
        lo, hi = ci(np.array(src_draws[s]), est)
        per_source[s] = {"estimate": est, "ci_low": lo, "ci_high": hi, "sampled": int(obs[i].sum()),
                         "tasks": int(i.sum())}
    q = float(p_task.mean())
    lo, hi = ci(draws, q)
    return AgentEstimate(q, lo, hi, per_source, float(c_task.mean()), p_task, c_task, draws, cost_draws)


# --- the frontier decision ---------------------------------------------------------------------------------------
def frontier_decision(base_quality, base_cost, est: AgentEstimate, confidence: float = 0.9) -> dict:
    """Whether the new agent joins the frontier of the existing agents (`base_quality`, `base_cost` per agent) with
    its point estimate, the share of bootstrap draws in which it does, and whether its remaining calls should be
    collected (that share above 1 - confidence)."""
    q = np.r_[np.asarray(base_quality, float), est.quality]
    c = np.r_[np.asarray(base_cost, float), est.cost]
    joins = on_frontier(q, c, len(q) - 1)
    if len(est.draws):
        hits = [on_frontier(np.r_[q[:-1], dq], np.r_[c[:-1], dc], len(q) - 1)
                for dq, dc in zip(est.draws, est.cost_draws)]
        share = float(np.mean(hits))
    else:
        share = float(joins)
    return {"joins": bool(joins), "join_share": share, "may_join": bool(share > 1 - confidence or joins),
            "confident": bool(share >= confidence or share <= 1 - confidence)}


def complete_rest(decision: dict, setting: NewAgentSample) -> bool:
    """Whether a new agent's remaining calls are collected (setting `complete` and the decision)."""
    return setting.complete == "all" or (setting.complete == "joiners" and bool(decision.get("may_join")))


# --- inside the collection -----------------------------------------------------------------------------------------
def base_rewards_of(calls, tasks, agents: list[str]) -> np.ndarray:
    """(n, K) the agents' rewards on `tasks` (rows in its order) from graded call rows: 1 right, 0 wrong or empty,
    an error (no reward) the agent's mean on the others."""
    import pandas as pd

    if not len(calls) or not agents:
        return np.zeros((len(tasks), len(agents)))
    c = calls[calls["agent"].isin(agents) & calls["status"].isin(("ok", "empty"))]
    r = pd.Series(np.where(c["status"].eq("ok"), c["correct"].eq(True).astype(float), 0.0), index=c.index)
    wide = (c.assign(r=r).pivot_table(index="task_id", columns="agent", values="r", aggfunc="mean")
            .reindex(index=tasks["task_id"].astype(str), columns=agents))
    B = wide.to_numpy(dtype=float)
    col_mean = np.where(np.isnan(B).all(axis=0), 0.5, np.nanmean(np.where(np.isnan(B), 0, B), axis=0))
    return np.where(np.isnan(B), col_mean[None, :], B)


@dataclass(frozen=True)
class NewAgents:
    """Which agents of a pool are new and how they are asked: the existing agents' names (`base_names`, the rest
    are new), the sample setting, and the new agents asked on every task anyway (`rest`, reports/new_agents.json:
    the decision said they may join, or `complete: all`)."""

    base_names: object
    sample: NewAgentSample
    rest: object = ()


def collect_with_sample(tasks, agents, plan: NewAgents, repetition: int, call_log, client_for, settings,
                        budget=None):
    """The collection of one partition (one source x repetition) with new agents on a sample (`plan`): the existing
    agents on every task first, then each new agent on `choose_sample`'s tasks (chosen from the existing agents'
    rewards just collected) and the tasks the log already holds for it, or on every task when it is in `plan.rest`.
    Returns (graded calls, {new agent: tasks it was asked}). With the setting off, no new agent or no existing one,
    it is the plain collection (every agent on every task)."""
    import pandas as pd

    from pipeline.collect.call_log import call_key
    from pipeline.collect.calls import run_collect

    base_names, sample, rest = plan.base_names, plan.sample, plan.rest

    base_set = set(base_names)
    base = [a for a in agents if a.name in base_set]
    new = [a for a in agents if a.name not in base_set]
    if not sample.on or not new or not base:
        return run_collect(tasks, agents, repetition, call_log, client_for, settings, budget=budget), {}
    frames = [run_collect(tasks, base, repetition, call_log, client_for, settings, budget=budget)]
    B = base_rewards_of(frames[0], tasks, [a.name for a in base])
    asked = {}
    done, sh = call_log.keys(), settings.hash()
    for a in new:
        if budget is not None and budget.stopped:
            break
        if a.name in set(rest):
            sub = tasks
        else:  # the sample, and any task already logged for the agent (an earlier full collection, a completed rest)
            idx = choose_sample(tasks["task_id"], tasks["source"], B, sample.fraction, sample.strategy, sample.seed,
                                a.name)
            logged = [i for i, t in enumerate(tasks["task_id"]) if call_key(a.name, str(t), repetition, sh) in done]
            sub = tasks.iloc[np.union1d(idx, np.array(logged, dtype=int))]
        asked[a.name] = len(sub)
        frames.append(run_collect(sub, [a], repetition, call_log, client_for, settings, budget=budget))
    return pd.concat(frames, ignore_index=True), asked


def complete_matrix(rows, sources, sampled: list[str], sample: NewAgentSample, emb: np.ndarray | None = None,
                    pool: str = ""):
    """The reward rows (pipeline.collect.rewards, with NaN where a sampled new agent was not asked) completed:
    each sampled agent's missing cells get `estimate_agent`'s probability and cost; column `imputed` (a bool per
    agent, in agent order) marks them; best_agents / is_tie are recomputed. Returns (rows, decision report:
    {pool, setting, agents: {name: estimate, per source, interval, frontier decision, collect_rest}})."""
    from pipeline.collect.rewards import TIE_TOL

    rows = rows.copy().reset_index(drop=True)
    agents = list(rows["agent_order"].iloc[0]) if len(rows) else []
    R = np.array([np.asarray(r, dtype=float) for r in rows["mean_reward"]]).reshape(len(rows), len(agents))
    C = np.array([np.asarray(c, dtype=float) for c in rows["mean_cost"]]).reshape(len(rows), len(agents))
    mask = np.isnan(R)
    base_idx = [j for j, a in enumerate(agents) if a not in set(sampled)]
    report = {"pool": pool, "setting": sample.to_dict(), "agents": {}}
    srcs = np.asarray([str(s) for s in sources])
    for j, a in enumerate(agents):
        if a not in set(sampled) or not base_idx:
            continue
        obs = np.flatnonzero(~mask[:, j])
        if not mask[:, j].any() or not len(obs):
            continue  # collected in full (or never: left to the completeness check)
        est = estimate_agent(Existing(R[:, base_idx], C[:, base_idx], srcs, emb), R[:, j], C[:, j], obs,
                             model=sample.model, boot=sample.boot, seed=sample.seed)
        dec = frontier_decision(R[:, base_idx].mean(axis=0), C[:, base_idx].mean(axis=0), est, sample.confidence)
        R[:, j] = np.where(mask[:, j], est.p_task, R[:, j])
        C[:, j] = np.where(mask[:, j], est.c_task, C[:, j])
        report["agents"][a] = {"sampled": int(len(obs)), "tasks": len(R), "imputed": int(mask[:, j].sum()),
                               "quality_estimate": est.quality, "ci_low": est.ci_low, "ci_high": est.ci_high,
                               "cost_estimate": est.cost, "per_source": est.per_source, **dec,
                               "collect_rest": complete_rest(dec, sample)}
    if mask.any() and not report["agents"]:
        raise RouterLiteError(f"{int(mask.any(axis=1).sum())} reward rows lack cells that no sampled new agent "
                              "explains")
    rows["mean_reward"] = [r.round(6).tolist() for r in R]
    rows["mean_cost"] = [c.tolist() for c in C]
    best = [[a for a, r in zip(agents, Ri) if r >= Ri.max() - TIE_TOL] for Ri in R]
    rows["best_agents"] = best
    rows["is_tie"] = [len(b) > 1 for b in best]
    rows["imputed"] = [m.tolist() for m in mask]
    report["imputed_cells"] = int(mask.sum())
    return rows, report


def imputed_cells(rewards) -> int:
    """Cells of a reward matrix marked imputed (0 for a matrix without the `imputed` column)."""
    if "imputed" not in getattr(rewards, "columns", ()):
        return 0
    return int(sum(int(np.sum(np.asarray(m, dtype=bool))) for m in rewards["imputed"]))
