"""RouterArena's measures (Lu et al., ICLR 2026) on the held-out test rows: whether a router sent a query to the
cheapest agent that answers it correctly, how far its cost is from that optimum, how stable its decision is when
the prompt is perturbed, and how long the decision takes. Pure arithmetic on per-row decisions (the lineage's
`router_arena` asset gathers them, assets/arena.py); docs/training.md, "RouterArena's measures", states the
definitions and where RouterArena's differ.

Correct: an agent answers a row correctly when its (tie-aware) reward equals the row's best reward and that reward is
> 0 (binary rewards: reward 1; fractional rewards: the best on the row, not "any credit"). Answerable: some agent
answers correctly. Optimal: the correct agents of least cost (cost ties within 1e-12 USD all count as optimal).
"""
from __future__ import annotations

import hashlib
import random

import numpy as np

TOL = 1e-9  # rewards equal within this are tied
COST_TOL = 1e-12  # USD: costs equal within this are tied

# The perturbation set of `robustness`: name -> what it does to a prompt (seeded per prompt: `perturb`)
PERTURBATIONS = {
    "typos": "adjacent letters swapped inside words: one swap per 60 characters, at least one",
    "case_whitespace": "the case of the first letter of one word in eight flipped, one gap in eight doubled, a "
                       "trailing newline",
    "template": "the prompt wrapped in 'Question: {prompt}\\nPlease answer.'",
}
TEMPLATE = "Question: {prompt}\nPlease answer."
SEED = 20260


def correct_mask(R_eff: np.ndarray) -> np.ndarray:
    """(n, K) bool: agent j answers row i correctly (its reward is the row's best and > 0)."""
    R = np.asarray(R_eff, dtype=np.float64)
    best = R.max(axis=1, keepdims=True)
    return (R >= best - TOL) & (best > TOL)


def optimal_mask(R_eff: np.ndarray, C: np.ndarray) -> np.ndarray:
    """(n, K) bool: agent j is a cheapest correct agent of row i (no True on an unanswerable row)."""
    ok = correct_mask(R_eff)
    cost = np.where(ok, np.asarray(C, dtype=np.float64), np.inf)
    least = cost.min(axis=1, keepdims=True)
    return ok & (cost <= least + COST_TOL)


def _sums(answered_by: np.ndarray, cost: np.ndarray, R_eff: np.ndarray, ok: np.ndarray, opt_cost: np.ndarray,
          optimal: np.ndarray) -> np.ndarray:
    """[optimal selections, router correct, optimum's cost where correct, router's cost where correct, optimum's
    cost, router's cost] over the answerable rows, then the router's summed reward over every row."""
    rows = np.arange(len(answered_by))
    ans = ok.any(axis=1)
    hit = ok[rows, answered_by] & ans
    return np.array([(optimal[rows, answered_by] & ans).sum(), hit.sum(), opt_cost[hit].sum(), cost[hit].sum(),
                     opt_cost[ans].sum(), cost[ans].sum(), R_eff[rows, answered_by].sum()], dtype=np.float64)


def _measures(s: np.ndarray, n_answerable: int, n: int) -> dict:
    return {"optimal_selection": float(s[0] / n_answerable) if n_answerable else None,
            "optimal_cost_ratio": float(s[2] / s[3]) if s[3] > 0 else None,
            "optimal_cost_ratio_all": float(s[4] / s[5]) if s[5] > 0 else None,
            "n_answerable": int(n_answerable), "n_correct": float(s[1]),
            "quality": float(s[6] / n) if n else None}  # the decisions' mean reward: the value report's quality


def optimality(answered_by, cost, R_eff: np.ndarray, C: np.ndarray) -> dict:
    """A router's optimality on the rows: `answered_by` (n,) the agent whose reply it returns, `cost` (n,) what it
    paid per row (a cascade: every call it made).

    optimal_selection: share of answerable rows answered by a cheapest correct agent; optimal_cost_ratio (as
    RouterArena): the optimum's summed cost / the router's, both over the answerable rows the router answered
    correctly (a cheap wrong pick cannot lift it); optimal_cost_ratio_all: the same over every answerable row."""
    ok = correct_mask(R_eff)
    opt = optimal_mask(R_eff, C)
    opt_cost = np.where(opt, np.asarray(C, np.float64), np.inf).min(axis=1)
    R = np.asarray(R_eff, np.float64)
    s = _sums(np.asarray(answered_by, np.int64), np.asarray(cost, np.float64), R, ok, opt_cost, opt)
    return _measures(s, int(ok.any(axis=1).sum()), len(R))


def random_optimality(R_eff: np.ndarray, C: np.ndarray) -> dict:
    """The expected optimality of a uniform random pick of one agent per row (ratios of expected sums)."""
    ok = correct_mask(R_eff)
    opt = optimal_mask(R_eff, C)
    C = np.asarray(C, np.float64)
    opt_cost = np.where(opt, C, np.inf).min(axis=1)
    n, K = C.shape
    R = np.asarray(R_eff, np.float64)
    s = sum(_sums(np.full(n, j), C[:, j], R, ok, opt_cost, opt) for j in range(K)) / K
    return _measures(s, int(ok.any(axis=1).sum()), n)


def oracle_picks(R_eff: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Per row the cheapest of its best agents (in float64: a float32 reward minus 1e-9 × a cost of ~1e-3 USD
    cannot tell two agents apart, so a tie would go to the first agent)."""
    R = np.asarray(R_eff, np.float64)
    best = R >= R.max(axis=1, keepdims=True) - TOL
    return np.argmin(np.where(best, np.asarray(C, np.float64), np.inf), axis=1)


def _rng(prompt: str, kind: str, seed: int) -> random.Random:
    """A generator seeded by (seed, kind, prompt): a prompt's perturbation is the same whatever rows surround it."""
    digest = hashlib.sha256(f"{seed}\0{kind}\0{prompt}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def perturb(prompt: str, kind: str, seed: int = SEED) -> str:
    """`prompt` under one perturbation of `PERTURBATIONS` (deterministic for a seed)."""
    if kind == "template":
        return TEMPLATE.format(prompt=prompt)
    rng = _rng(prompt, kind, seed)
    if kind == "typos":
        chars = list(prompt)
        spots = [i for i in range(len(chars) - 1) if chars[i].isalpha() and chars[i + 1].isalpha()
                 and chars[i] != chars[i + 1]]
        for i in rng.sample(spots, min(len(spots), max(1, len(prompt) // 60))):
            chars[i], chars[i + 1] = chars[i + 1], chars[i]
        return "".join(chars)
    if kind == "case_whitespace":
        words = prompt.split(" ")
        out = []
        for w in words:
            if w and rng.random() < 1 / 8:
                w = w[0].swapcase() + w[1:]
            out.append(w + (" " if rng.random() < 1 / 8 else ""))
        return " ".join(out) + "\n"
    raise ValueError(f"unknown perturbation {kind!r}; known: {', '.join(PERTURBATIONS)}")


def robustness(base, perturbed: dict) -> dict:
    """How stable decisions are under the perturbations: `base` (n,) or (n, m) the decisions on the prompts as they
    are (a row of m values: e.g. a cascade's stage and answering agent), `perturbed` {perturbation: the same on the
    perturbed prompts}.

    robustness: share of rows whose decision is the same under every perturbation; robustness_pairs: 1 − the flip
    ratio over every (row, perturbation) pair (RouterArena's form); by_perturbation: the share per perturbation."""
    b = np.asarray(base).reshape(len(base), -1)
    same = {k: (np.asarray(v).reshape(len(b), -1) == b).all(axis=1) for k, v in perturbed.items()}
    if not same or not len(b):
        return {"robustness": None, "robustness_pairs": None, "by_perturbation": {}}
    stack = np.stack(list(same.values()))
    return {"robustness": float(stack.all(axis=0).mean()), "robustness_pairs": float(stack.mean()),
            "by_perturbation": {k: float(v.mean()) for k, v in same.items()}}


def latency(ms) -> dict:
    """p50 / p95 of per-query decision times in milliseconds."""
    ms = np.asarray(ms, dtype=np.float64)
    if not ms.size:
        return {"p50": None, "p95": None, "n": 0}
    return {"p50": float(np.percentile(ms, 50)), "p95": float(np.percentile(ms, 95)), "n": int(ms.size)}


def arena_report(base: dict, perturbed: dict, latency: dict, U: np.ndarray, C: np.ndarray, best: int,
                 agents: list[str]) -> dict:
    """The `router_arena` entry of reports/router_value.json from the decisions on the test prompts (`base`) and
    on each perturbation of them, and the per-query timings."""
    rows = np.arange(len(U))
    out = {"routers": {}, "prompt_routers": {}}
    for group in ("routers", "prompt_routers"):
        for name, by_target in base[group].items():
            entry = {}
            for target, d in by_target.items():
                o = base["outcomes"].get(name, {}).get(target)
                by, cost = (o.answered_by, o.cost) if o is not None else (d, C[rows, d])
                entry[target] = {**optimality(by, cost, U, C),
                                 **robustness(d, {k: p[group][name][target] for k, p in perturbed.items()})}
            entry["decision_ms"] = latency.get(name if group == "routers" else f"prompt:{name}")
            out[group][name] = entry
    same = {"robustness": 1.0, "robustness_pairs": 1.0, "by_perturbation": {k: 1.0 for k in perturbed}}
    oracle = oracle_picks(U, C)
    out["baselines"] = {
        "best_single": {"agent": agents[best], **optimality(np.full(len(U), best), C[:, best], U, C), **same,
                        "ignores_prompt": True},
        "random": {**random_optimality(U, C), **same, "ignores_prompt": True,
                   "note": "expected over a uniform pick per query"},
        "oracle": {**optimality(oracle, C[rows, oracle], U, C), **same, "ignores_prompt": True,
                   "note": "reads the test rewards: the best reward, the cheapest agent among ties (in float64)"}}
    out["perturbations"] = {"set": dict(PERTURBATIONS), "seed": SEED, "template": TEMPLATE}
    out["definitions"] = ("correct = the row's best tie-aware reward, > 0; optimal = the cheapest correct agent; "
                          "optimal_cost_ratio over the answerable rows the router answered correctly (RouterArena), "
                          "optimal_cost_ratio_all over every answerable row; docs/training.md, RouterArena's "
                          "measures")
    out["n_test"] = int(len(U))
    return out
