"""Promotion: which of a run's routers `serve` follows (registry/latest.json), and the gate it passes first.

Candidates are every router the run registered (the prompt router, each cascade variant). One is chosen at the
serving target on the rows its operating points were read on (cross-fitted train + validation, or validation:
`validation_at`), never on test rows (`choose`, its rule said in the verdict): AIQ ranks a whole frontier, the served
router stands at one point of it.

The gate (pipeline/report/promotion_gate.py says its three modes) then compares the candidate's held-out test
outcome at the serving target with the served router's: per row reward and cost (`held_out_outcome`), paired over
the same test rows, or over the held-out tasks both were scored on when the pool changed (not worse in quality
beyond noise, not dearer beyond noise); else on the candidate's own evidence. The value report keeps aggregates
only, so every gated candidate's per-row outcome is stored (`evidence`, registry/evidence/<name>.json) for the next
run to pair with and for `router-lite promote NAME` to show the same verdict. The verdict names the router it would
replace; a candidate dearer than the served one is refused (the operator's `promote NAME --force` overrides).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from pipeline.core.errors import RouterLiteError
from pipeline.report.gate_rows import TRAFFIC, with_traffic
from pipeline.report.promotion_gate import evidence_rows, gate, pairing, verdict_lines  # noqa: F401 - this module's API
from pipeline.report.value import ROUTER_LABELS, validation_at
from pipeline.route.targets import parse_target

CHOICE_RULE = {
    "quality": "cheapest cross-fitted cost among the candidates whose cross-fitted quality meets the target (none: "
               "the best quality)",
    "parity": "cheapest cross-fitted cost at the parity point",
    "budget": "best cross-fitted quality among the candidates within the budget (none: the cheapest)",
    "max-quality": "best cross-fitted quality (ties: the cheaper)",
    "lambda": "best cross-fitted quality (ties: the cheaper)",
}
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
    formats: object = None  # a cascade's answer-format guess (pipeline.route.formats.FormatGuess), as serve has it
    sources: np.ndarray | None = None  # each row's task source ("traffic": a request this deployment served)
    replied: np.ndarray | None = None  # each row: every agent of the pool replied (False: a cell was estimated)


def rows_at(rows: HeldOut, idx: np.ndarray) -> HeldOut:
    """`rows` on its rows `idx` (positions)."""
    def cut(v):
        return None if v is None else np.asarray(v)[idx]

    return replace(rows, task_ids=[rows.task_ids[i] for i in idx], X=rows.X[idx], U=rows.U[idx], C=rows.C[idx],
                   answers=[rows.answers[i] for i in idx], graders=np.asarray(rows.graders)[idx],
                   sources=cut(rows.sources), replied=cut(rows.replied))


def traffic_positions(rows: HeldOut) -> np.ndarray:
    """Positions of the held-out rows that are served requests (source `traffic`)."""
    return np.array([], np.int64) if rows.sources is None else np.flatnonzero(np.asarray(rows.sources) == TRAFFIC)


def held_out_outcome(reg, target: str, rows: HeldOut, agreement=None) -> tuple[np.ndarray, np.ndarray]:
    """(reward, cost) per held-out row of the registered router `reg` at `target`, as the value report scores it:
    what serve decides (pipeline.route.served: the OOD guard, the shortcuts, a cascade's answer-format guess) where
    the rows carry the format guess; else a prompt router's picks after its OOD guard and a cascade's plan at the
    target run on the recorded answers under their own formats (`agreement`: a pipeline.collect.answers.Agreement
    over `rows`, shared between candidates)."""
    names = [a["name"] for a in reg.agents]
    if names != list(rows.agents):
        raise RouterLiteError(f"router {reg.name} routes to {names}, not the run's agents {rows.agents}")
    if reg.needs_grader and rows.formats is not None:
        from pipeline.collect.answers import agreement_maker
        from pipeline.route.served import served_outcomes

        o = served_outcomes(reg, rows.X, target, rows.U, rows.C, rows.answers, rows.formats, agreement_maker())
        return np.asarray(o.outcome.reward, np.float64), np.asarray(o.outcome.cost, np.float64)
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
    """What the gate judges a candidate on, stored for `router-lite promote` and the next run to pair with: the
    per-row outcome at the target, on which rows, beside the best single agent's on the same rows, with each row's
    source and whether every agent replied on it (where the rows say). `held_out`: the figures on the rows of every
    source but traffic (all rows when there are no others), what the served router's ★ line states."""
    b = rows.best
    ev = {"name": name, "router": router, "target": target, "agents": list(rows.agents),
          "task_ids": [str(t) for t in rows.task_ids],
          "reward": [float(r) for r in reward], "cost": [float(c) for c in cost],
          "best_single": rows.agents[b], "best_reward": [float(r) for r in rows.U[:, b]],
          "best_cost": [float(c) for c in rows.C[:, b]]}
    bench = np.ones(len(reward), bool)
    if rows.sources is not None:
        ev["source"] = [str(s) for s in rows.sources]
        ev["replied"] = [bool(x) for x in (np.ones(len(reward), bool) if rows.replied is None else rows.replied)]
        bench[traffic_positions(rows)] = False
    bench = bench if bench.any() else np.ones(len(reward), bool)
    return {**ev, "held_out": held_out_figures(np.asarray(reward)[bench], np.asarray(cost)[bench],
                                               rows_at(rows, np.flatnonzero(bench)))}


def held_out_figures(reward: np.ndarray, cost: np.ndarray, rows: HeldOut) -> dict:
    """Held-out quality and cost per 1k queries, and their ratios to the best single agent on the same rows."""
    bq, bc = float(rows.U[:, rows.best].mean()), float(1000 * rows.C[:, rows.best].mean())
    q, c = float(np.mean(reward)), float(1000 * np.mean(cost))
    return {"quality": q, "quality_ratio": q / bq if bq > 0 else None, "cost_per_1k": c,
            "cost_ratio": c / bc if bc > 0 else None}


def served_on_traffic(root, current: dict, incumbent: dict | None, rows: HeldOut) -> dict | None:
    """The served router's evidence `incumbent` with its traffic rows replaced by its outcome, as it is served, on
    this run's held-out traffic rows, and stored back (so `router-lite promote NAME` pairs the same rows): traffic
    arrives after a router is promoted, so its stored evidence holds none of the newest days. Unchanged when there
    is no evidence, no traffic row, or the served router asks other agents than this run's (it cannot be scored on
    their replies: its stored traffic rows are paired by task id)."""
    from pipeline.route import pointer, registry

    t = traffic_positions(rows)
    if incumbent is None or not len(t):
        return incumbent
    reg = registry.load(current["path"])
    if [a["name"] for a in reg.agents] != list(rows.agents):
        return incumbent
    sub = rows_at(rows, t)
    reward, cost = held_out_outcome(reg, incumbent["target"], sub)
    fresh = with_traffic(incumbent, evidence(incumbent["name"], incumbent.get("router"), incumbent["target"], sub,
                                             reward, cost))
    pointer.save_evidence(root, fresh, current["evidence"])
    return fresh


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


# what the history keeps of a verdict (and of its traffic evidence: the rows themselves are in the evidence file)
VERDICT_FIELDS = ("passed", "mode", "rule", "reason", "replaces", "dearer", "benchmark_passed", "benchmark_reason")
TRAFFIC_FIELDS = ("passed", "n", "left_out", "unscored", "reason", "quality_minus_promoted",
                  "cost_per_1k_minus_promoted")


def verdict_summary(verdict: dict) -> dict:
    out = {k: verdict.get(k) for k in VERDICT_FIELDS}
    if "traffic" in verdict:
        out["traffic"] = {k: verdict["traffic"].get(k) for k in TRAFFIC_FIELDS if k in verdict["traffic"]}
    return out


def decide(root, entry: dict, ev: dict, rows: HeldOut) -> tuple[str, dict]:
    """Gate `entry` (the pointer fields of the candidate: name, path, kind, target, head, star) with its evidence
    `ev` against the router registry/latest.json serves, and act: "promoted" (pointer re-pointed, history
    appended), "refused" (pointer untouched, the refusal appended) or "kept" (the candidate is the served router).
    The evidence is stored either way: `router-lite promote NAME` shows the same verdict later. Returns (action,
    verdict)."""
    from pathlib import Path

    from pipeline.route import pointer

    root = Path(root)
    current = pointer.latest_entry(root)  # a malformed pointer: one error naming it
    incumbent = pointer.load_evidence(root, (current or {}).get("evidence"))
    unpaired = (f"the promoted router {current['name']} has no held-out evidence stored (promoted by hand or before "
                "promotions were gated)") if current and incumbent is None else None
    if current and current["name"] != entry["name"]:
        incumbent = served_on_traffic(root, current, incumbent, rows)
    verdict = gate(ev, incumbent, rows, unpaired, served=current)
    if current and current["name"] == entry["name"]:
        return "kept", verdict
    kept = pointer.save_evidence(root, ev)
    if verdict["passed"]:
        pointer.promote(root, {**entry, "evidence": kept}, by="gate", reason=verdict["reason"],
                        verdict=verdict_summary(verdict))
        return "promoted", verdict
    pointer.append_history(root, {"action": "refused", "by": "gate", "name": entry["name"],
                                  "path": pointer.relative(root, entry["path"]), "kind": entry.get("kind"),
                                  "target": entry.get("target"), "evidence": kept, "reason": verdict["reason"],
                                  "verdict": verdict_summary(verdict),
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


def judge_named(root, name: str, target: str) -> tuple[dict, dict | None, dict]:
    """(the pointer fields for NAME, the pointer now, the gate's verdict on NAME against it) for `router-lite
    promote NAME`: the same gate the lineage's promotion applies, on NAME's stored evidence (every gated candidate's
    is kept); a router never gated at `target` has none, and the verdict says the gate cannot judge it."""
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
    ev = pointer.load_evidence(root, entry["evidence"])
    if ev is None:
        return entry, current, {
            "target": entry["target"], "replaces": (current or {}).get("name"), "candidate": {"name": name},
            "passed": None, "mode": "none", "rule": None, "dearer": False,
            "reason": f"no held-out evidence stored for {name} at {entry['target']} (never a gated candidate of a "
                      "run at this target): the gate cannot judge it"}
    incumbent = pointer.load_evidence(root, (current or {}).get("evidence"))
    unpaired = (f"the promoted router {current['name']} has no held-out evidence stored"
                if current and incumbent is None else None)
    return entry, current, gate(ev, incumbent, None, unpaired, served=current)


def promote_named(root, name: str, target: str, force: bool = False) -> tuple[dict, dict]:
    """`router-lite promote NAME`: serve the registered router NAME when the gate passes it or cannot judge it, or
    when `force` (the history says by whom, the verdict and that it was forced). A refusal without `force` is one
    error naming NAME, the reason and `--force`; the pointer is untouched. Returns (the history line, the verdict)."""
    from pathlib import Path

    from pipeline.route import pointer

    root = Path(root)
    entry, _, verdict = judge_named(root, name, target)
    refused = verdict["passed"] is False
    if refused and not force:
        raise RouterLiteError(f"the gate refuses {name}: {verdict['reason']}; nothing re-pointed "
                              f"(`router-lite promote {name} --force` promotes it anyway)")
    why = {True: "promoted by hand (router-lite promote); the gate passes it",
           None: "promoted by hand (router-lite promote); the gate could not judge it",
           False: "promoted by hand past the gate's refusal (router-lite promote --force)"}[verdict["passed"]]
    line = pointer.promote(root, entry, by="promote", reason=why, verdict=verdict_summary(verdict))
    return line, verdict


def rollback(root, target: str) -> dict:
    """`router-lite rollback`: serve the router promoted before the one served (the history's stack of
    promotions; each rollback pops one)."""
    from pathlib import Path

    from pipeline.route import pointer

    root = Path(root)
    current = pointer.latest_entry(root)  # a malformed pointer: one error naming it
    repaired = pointer.repair_history(root)  # junk lines set aside first (said in the line returned)
    stack = pointer.served_stack(pointer.history(root))
    if current is None or len(stack) < 2:
        raise RouterLiteError(f"nothing to roll back: {root / pointer.HISTORY} records no promotion before the "
                              f"served router{'' if current is None else ' ' + current['name']}")
    prev = stack[-2]
    entry = _entry_of(root, prev["name"], prev.get("target") or target, (current or {}).get("head"))
    line = pointer.promote(root, entry, by="rollback", reason=f"rolled back from {current['name']}")
    return {**line, "repaired": repaired} if repaired else line
