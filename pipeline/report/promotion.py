"""Promotion: which of a run's routers `serve` follows (registry/latest.json), and the gate it passes first.

Candidates are every router the run registered (the prompt router, each cascade variant). One is chosen at the
serving target on the rows its operating points were read on (cross-fitted train + validation, or validation:
`validation_at`), never on test rows (`choose`, its rule said in the verdict): AIQ ranks a whole frontier, the served
router stands at one point of it.

The gate (`gate`) then compares the candidate's held-out test outcome at the serving target with the promoted
router's: per row reward and cost (`held_out_outcome`), paired over the same test rows when both were scored on them
(95 % paired bootstrap CIs, pipeline.route.evaluate.paired_gain_ci: not worse in quality beyond noise, not dearer
beyond noise). The value report keeps aggregates only, so each promotion stores its own per-row outcome
(`evidence`, registry/evidence/<name>.json) for the next run to pair with. When the pairing is impossible (nothing
promoted yet, another serving target, another pool of agents, other test rows) the candidate stands on its own
evidence, the reason said: its held-out quality must not fall below the target's floor (F × the best single agent's
for quality>=F, the best single agent's for parity and max-quality) beyond noise, and a budget target's cost must
hold.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.core.errors import RouterLiteError
from pipeline.report.value import ROUTER_LABELS, validation_at
from pipeline.route.evaluate import paired_gain_ci
from pipeline.route.targets import parse_target

CHOICE_RULE = {
    "quality": "cheapest cross-fitted cost among the candidates whose cross-fitted quality meets the target (none: "
               "the best quality)",
    "parity": "cheapest cross-fitted cost at the parity point",
    "budget": "best cross-fitted quality among the candidates within the budget (none: the cheapest)",
    "max-quality": "best cross-fitted quality (ties: the cheaper)",
    "lambda": "best cross-fitted quality (ties: the cheaper)",
}
PAIRED_RULE = ("paired 95 % bootstrap CIs over the same held-out test rows: quality (candidate − promoted) upper "
               "bound ≥ 0 (not worse beyond noise) and cost (candidate − promoted) lower bound ≤ 0 (not dearer beyond "
               "noise)")


@dataclass
class HeldOut:
    """The run's held-out test rows as every candidate is scored on them: ids, embeddings, effective rewards and
    costs (n, K), the agents' recorded answers (n lists of K) and answer formats, the agents, the best single."""

    task_ids: list[str]
    X: np.ndarray
    U: np.ndarray
    C: np.ndarray
    answers: list
    graders: np.ndarray
    agents: list[str]
    best: int


def held_out_outcome(reg, target: str, rows: HeldOut, agreement=None) -> tuple[np.ndarray, np.ndarray]:
    """(reward, cost) per held-out row of the registered router `reg` at `target`, as the value report scores it:
    a prompt router's picks after its OOD guard; a cascade's plan at the target run on the recorded answers
    (`agreement`: a pipeline.collect.answers.Agreement over `rows`, shared between candidates)."""
    names = [a["name"] for a in reg.agents]
    if names != list(rows.agents):
        raise RouterLiteError(f"router {reg.name} routes to {names}, not the run's agents {rows.agents}")
    if reg.needs_grader:
        from pipeline.collect.answers import Agreement
        from pipeline.route.cascade import run_plan

        E = agreement if agreement is not None else Agreement(rows.answers, rows.graders.tolist())
        P = reg.scorer.scores(rows.X) if reg.scorer is not None else None  # read by the prompt shortcuts only
        o = run_plan(reg.router.plan(target), rows.U, rows.C, E, reg.router.order, P, rows.graders)
        return np.asarray(o.reward, np.float64), np.asarray(o.cost, np.float64)
    picks, _ = reg.route(rows.X, target)
    idx = np.arange(len(picks))
    return rows.U[idx, picks].astype(np.float64), rows.C[idx, picks].astype(np.float64)


def evidence(name: str, router: str, target: str, rows: HeldOut, reward: np.ndarray, cost: np.ndarray) -> dict:
    """What a promotion stores for the next run to pair with: the per-row outcome at the target, on which rows."""
    return {"name": name, "router": router, "target": target, "agents": list(rows.agents),
            "held_out": held_out_figures(reward, cost, rows), "task_ids": [str(t) for t in rows.task_ids],
            "reward": [float(r) for r in reward], "cost": [float(c) for c in cost]}


def held_out_figures(reward: np.ndarray, cost: np.ndarray, rows: HeldOut) -> dict:
    """Held-out quality and cost per 1k queries, and their ratios to the best single agent on the same rows."""
    bq, bc = float(rows.U[:, rows.best].mean()), float(1000 * rows.C[:, rows.best].mean())
    q, c = float(np.mean(reward)), float(1000 * np.mean(cost))
    return {"quality": q, "quality_ratio": q / bq if bq > 0 else None, "cost_per_1k": c,
            "cost_ratio": c / bc if bc > 0 else None}


def choose(figures: dict[str, dict], target: str) -> tuple[str, str]:
    """(the candidate to promote, the rule that picked it) from each candidate's cross-fitted figures at `target`
    ({key: validation_at(...)}: quality, cost_per_1k, quality_ratio); test rows are not read."""
    if not figures:
        raise RouterLiteError("no router to promote: the run registered none")
    t = parse_target(target)
    q = {k: f["quality"] if f.get("quality") is not None else -np.inf for k, f in figures.items()}
    c = {k: f["cost_per_1k"] if f.get("cost_per_1k") is not None else np.inf for k, f in figures.items()}
    best_quality = max(figures, key=lambda k: (q[k], -c[k]))
    if t.kind == "quality":
        meets = [k for k, f in figures.items() if (f.get("quality_ratio") or 0) >= t.value - 1e-9]
        chosen = min(meets, key=lambda k: (c[k], -q[k])) if meets else best_quality
    elif t.kind == "parity":
        chosen = min(figures, key=lambda k: (c[k], -q[k]))
    elif t.kind == "budget":
        within = [k for k in figures if c[k] <= t.value + 1e-12]
        chosen = max(within, key=lambda k: (q[k], -c[k])) if within else min(figures, key=lambda k: (c[k], -q[k]))
    else:
        chosen = best_quality
    return chosen, CHOICE_RULE[t.kind]


def _paired(a: np.ndarray, b: np.ndarray) -> dict:
    """mean(a − b) with its paired 95 % bootstrap CI (the project's paired_gain_ci on the two columns)."""
    ci = paired_gain_ci(np.zeros(len(a), np.int64), np.column_stack([a, b]), 1)
    return {k: ci[k] for k in ("gain", "low", "high", "n")}


def pairing(candidate: dict, incumbent: dict | None) -> str | None:
    """Why the candidate cannot be paired with the promoted router's evidence (None: it can)."""
    if incumbent is None:
        return "first promotion: nothing promoted yet"
    if incumbent.get("target") != candidate["target"]:
        return f"the serving target changed ({incumbent.get('target')} -> {candidate['target']})"
    if incumbent.get("agents") != candidate["agents"]:
        return f"the pool changed ({', '.join(incumbent.get('agents') or [])} -> {', '.join(candidate['agents'])})"
    if incumbent.get("task_ids") != candidate["task_ids"]:
        shared = len(set(incumbent.get("task_ids") or []) & set(candidate["task_ids"]))
        return (f"the task pool changed (held-out rows: {len(incumbent.get('task_ids') or [])} promoted, "
                f"{len(candidate['task_ids'])} now, {shared} shared)")
    return None


def gate(candidate: dict, incumbent: dict | None, rows: HeldOut, unpaired: str | None = None) -> dict:
    """The verdict on `candidate` (its `evidence`) against the promoted router's evidence `incumbent` (None:
    nothing promoted, or no evidence kept: `unpaired` says which): {"passed", "mode" (paired | own), "rule",
    "reason", the figures and CIs}."""
    r, c = np.asarray(candidate["reward"]), np.asarray(candidate["cost"])
    reason = unpaired or pairing(candidate, incumbent)
    out = {"target": candidate["target"], "candidate": {"name": candidate["name"],
                                                        **held_out_figures(r, c, rows)}}
    if reason is None:
        ri, ci = np.asarray(incumbent["reward"]), np.asarray(incumbent["cost"])
        q, cost = _paired(r, ri), _paired(1000 * c, 1000 * ci)
        passed = q["high"] >= 0 and cost["low"] <= 0
        why = [] if passed else [w for w, bad in (("worse in quality beyond noise", q["high"] < 0),
                                                  ("dearer beyond noise", cost["low"] > 0)) if bad]
        return {**out, "passed": bool(passed), "mode": "paired", "rule": PAIRED_RULE,
                "reason": "same held-out rows: paired with the promoted router" + (f"; refused: {', '.join(why)}"
                                                                                     if why else ""),
                "incumbent": {"name": incumbent["name"], **held_out_figures(ri, ci, rows)},
                "quality_minus_promoted": q, "cost_per_1k_minus_promoted": cost}
    t = parse_target(candidate["target"])
    b = rows.U[:, rows.best].astype(np.float64)
    if t.kind in ("quality", "parity", "max-quality"):
        f = t.value if t.kind == "quality" else 1.0
        floor = _paired(r, f * b)
        passed = floor["high"] >= 0
        rule = (f"own evidence: held-out quality − {f:g} × best single ({rows.agents[rows.best]}): paired 95 % CI "
                "upper bound ≥ 0 (the target not missed beyond noise)")
        extra = {"quality_minus_floor": floor}
    elif t.kind == "budget":
        passed = out["candidate"]["cost_per_1k"] <= t.value + 1e-12
        rule, extra = f"own evidence: held-out cost ≤ {t.value:g} USD per 1k queries", {}
    else:
        passed, rule, extra = True, "own evidence: a λ target has no quality floor", {}
    return {**out, "passed": bool(passed), "mode": "own", "rule": rule,
            "reason": reason + ("" if passed else "; refused: the candidate misses the target on its own evidence"),
            "incumbent": None if incumbent is None else {"name": incumbent.get("name")}, **extra}


def decide(root, entry: dict, ev: dict, rows: HeldOut) -> tuple[str, dict]:
    """Gate `entry` (the pointer fields of the candidate: name, path, kind, target, head, star) with its evidence
    `ev` against the router registry/latest.json serves, and act: "promoted" (pointer re-pointed, evidence stored,
    history appended), "refused" (pointer untouched, the refusal appended) or "kept" (the candidate is the served
    router). Returns (action, verdict)."""
    from pathlib import Path

    from pipeline.route import pointer

    root = Path(root)
    current = pointer.latest_entry(root)  # a malformed pointer: one error naming it
    incumbent = pointer.load_evidence(root, (current or {}).get("evidence"))
    unpaired = (f"the promoted router {current['name']} has no held-out evidence stored (promoted by hand or before "
                "promotions were gated)") if current and incumbent is None else None
    verdict = gate(ev, incumbent, rows, unpaired)
    summary = {k: verdict.get(k) for k in ("passed", "mode", "rule", "reason")}
    if current and current["name"] == entry["name"]:
        return "kept", verdict
    if verdict["passed"]:
        pointer.promote(root, {**entry, "evidence": pointer.save_evidence(root, ev)}, by="gate",
                        reason=verdict["reason"], verdict=summary)
        return "promoted", verdict
    pointer.append_history(root, {"action": "refused", "by": "gate", "name": entry["name"],
                                  "path": pointer.relative(root, entry["path"]), "kind": entry.get("kind"),
                                  "target": entry.get("target"), "reason": verdict["reason"], "verdict": summary,
                                  "previous": None if current is None else {
                                      "name": current["name"], "path": pointer.relative(root, current["path"])}})
    return "refused", verdict


def candidate_figures(regs: dict, target: str) -> dict[str, dict]:
    """{key: what the registered router stands for at `target` on the rows its operating points were read on}."""
    return {k: validation_at(reg, target) for k, reg in regs.items()}


def star(key: str, reg, target: str, validation: dict, held_out: dict, aiq: float | None) -> dict:
    """latest.json's `star`: what the promoted router stands for at the serving target."""
    return {"router": key, "label": ROUTER_LABELS.get(key, key), "kind": reg.kind, "aiq_validation": aiq,
            "target": validation["target"], "validation": validation,
            "held_out": {k: held_out.get(k) for k in ("quality", "quality_ratio", "cost_per_1k", "cost_ratio")}}


# ------------------------------------------------------------------------------------ the operator's override
def _entry_of(root, name: str, target: str, head: dict | None) -> dict:
    """The pointer fields for serving the registered router `root/name` at `target` (its stored evidence, when it
    was promoted by the gate before, gives the held-out figures)."""
    from pathlib import Path

    from pipeline.route import pointer, registry

    root = Path(root)
    known = sorted(p.name for p in root.iterdir() if (p / registry.MANIFEST).is_file()) if root.is_dir() else []
    if not isinstance(name, str) or Path(name).name != name or name in (".", "..") or name not in known:
        raise RouterLiteError(f"no registered router {name!r} under {root}; registered: {', '.join(known) or 'none'}")
    path = pointer.inside(root, name, f"registry entry {name!r}")
    reg = registry.load(path)
    rel = f"{pointer.EVIDENCE}/{name}.json"
    ev = pointer.load_evidence(root, rel)
    ev = ev if ev and ev.get("target") == parse_target(target).name else None
    val = validation_at(reg, target)
    key = (ev or {}).get("router") or reg.kind
    return {"name": name, "path": str(path), "kind": reg.kind, "target": val["target"],
            "head": head or {"name": name, "path": str(path)}, "evidence": rel if ev else None,
            "star": star(key, reg, target, val, (ev or {}).get("held_out") or {}, None)}


def promote_named(root, name: str, target: str) -> dict:
    """`router-lite promote NAME`: serve the registered router NAME, past the gate (the history says by whom)."""
    from pathlib import Path

    from pipeline.route import pointer

    root = Path(root)
    try:
        current = pointer.latest_entry(root)
    except RouterLiteError:  # a malformed pointer: promoting by hand is the repair (the history names it)
        current = None
    if current and current["name"] == name:
        raise RouterLiteError(f"{name} is already the promoted router ({root / pointer.LATEST})")
    entry = _entry_of(root, name, target, (current or {}).get("head"))
    return pointer.promote(root, entry, by="promote", reason="promoted by hand (router-lite promote)")


def rollback(root, target: str) -> dict:
    """`router-lite rollback`: serve the router promoted before the one served (the history's stack of
    promotions; each rollback pops one)."""
    from pathlib import Path

    from pipeline.route import pointer

    root = Path(root)
    current = pointer.latest_entry(root)  # a malformed pointer: one error naming it
    stack = pointer.served_stack(pointer.history(root))
    if current is None or len(stack) < 2:
        raise RouterLiteError(f"nothing to roll back: {root / pointer.HISTORY} records no promotion before the "
                              f"served router{'' if current is None else ' ' + current['name']}")
    prev = stack[-2]
    entry = _entry_of(root, prev["name"], prev.get("target") or target, (current or {}).get("head"))
    return pointer.promote(root, entry, by="rollback", reason=f"rolled back from {current['name']}")
