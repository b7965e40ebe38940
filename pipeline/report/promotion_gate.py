"""The promotion gate: may a candidate replace the router served now? Decided on held-out evidence only.

Evidence (`pipeline.report.promotion.evidence`, stored as registry/evidence/<name>.json) is one router's outcome at
the serving target on each held-out test row: reward and cost, with the best single agent's on the same rows, and
each row's source. Two kinds of evidence, each judged by a function of its own, both in the verdict:

- benchmark rows (every source but `traffic`: `benchmark_evidence`), the three ways below;
- traffic rows (the requests this deployment served, explored: `traffic_evidence`, pipeline/report/
  promotion_traffic.py): paired with the promoted router on the rows every agent replied to; a candidate worse or
  dearer there beyond noise is refused even when the benchmark rows pass it; too few rows do not block.

Benchmark rows are judged the first way that applies (`mode` in the verdict):

- `paired`: the promoted router's evidence is on the same rows, pool and target: paired 95 % bootstrap CIs of
  (candidate − promoted), quality not worse beyond noise and cost not dearer beyond noise.
- `shared`: the pool or the task pool changed (a wider pool's refresh, then the default lineage rerun) but the
  target is the same and at least MIN_SHARED held-out tasks were scored by both: the same paired rule on those tasks,
  each router's outcome with its own agents. This is what stops a rerun of the default lineage from replacing a
  cheaper router promoted on a wider pool: both answered these tasks, at these costs.
- `own`: nothing to pair with (first promotion, another target, too few shared tasks, no evidence kept): the
  candidate's held-out quality must not fall below the target's floor beyond noise; and, when the served router's
  held-out cost ratio is known at the same target, the candidate's share of the best single agent's cost must not
  exceed it by more than COST_RATIO_SLACK (the stated rule where no CI can be paired).

A verdict always names the router it would replace (`replaces`) and says when the candidate is dearer (`dearer`,
on either kind of rows); a dearer candidate is refused.
"""
from __future__ import annotations

import numpy as np

from pipeline.report.gate_rows import benchmark_part, figures, money, paired, pct
from pipeline.report.promotion_traffic import traffic_evidence
from pipeline.route.targets import parse_target

MIN_SHARED = 30  # fewer held-out tasks scored by both: a paired CI says nothing, the candidate stands on its own
COST_RATIO_SLACK = 0.05  # own evidence: at most 5 points more of the best single agent's cost than the served router
PAIRED_RULE = ("paired 95 % bootstrap CIs over the same held-out test rows: quality (candidate − promoted) upper "
               "bound ≥ 0 (not worse beyond noise) and cost (candidate − promoted) lower bound ≤ 0 (not dearer beyond "
               "noise)")
SHARED_RULE = ("paired 95 % bootstrap CIs over the held-out tasks both routers were scored on, each with its own "
               "agents: quality (candidate − promoted) upper bound ≥ 0 and cost (candidate − promoted) lower bound "
               "≤ 0")


def _pool_change(before: list, now: list) -> str:
    added, gone = [a for a in now if a not in before], [a for a in before if a not in now]
    return "; ".join(p for p in (f"+{', +'.join(added)}" if added else "", f"−{', −'.join(gone)}" if gone else "")
                     if p) or "reordered"


def pairing(candidate: dict, incumbent: dict | None) -> str | None:
    """Why the candidate cannot be paired row for row with the promoted router's evidence (None: it can)."""
    if incumbent is None:
        return "first promotion: nothing promoted yet"
    if incumbent.get("target") != candidate["target"]:
        return f"the serving target changed ({incumbent.get('target')} -> {candidate['target']})"
    if incumbent.get("agents") != candidate["agents"]:
        return f"the pool changed ({_pool_change(incumbent.get('agents') or [], candidate['agents'])})"
    if incumbent.get("task_ids") != candidate["task_ids"]:
        shared = len(set(incumbent.get("task_ids") or []) & set(candidate["task_ids"]))
        return (f"the task pool changed (held-out rows: {len(incumbent.get('task_ids') or [])} promoted, "
                f"{len(candidate['task_ids'])} now, {shared} shared)")
    return None


def shared_rows(candidate: dict, incumbent: dict) -> tuple[np.ndarray, np.ndarray]:
    """(rows of the candidate, the same tasks' rows of the incumbent) for the held-out tasks both were scored on."""
    pos = {str(t): i for i, t in enumerate(incumbent.get("task_ids") or [])}
    mine = [i for i, t in enumerate(candidate["task_ids"]) if str(t) in pos]
    return (np.asarray(mine, np.int64),
            np.asarray([pos[str(candidate["task_ids"][i])] for i in mine], np.int64))


def _compared(candidate: dict, incumbent: dict, mine, theirs, mode: str, why: str | None) -> dict:
    """The paired verdict of `candidate` against `incumbent` on rows `mine` / `theirs` (the same tasks)."""
    r, c = np.asarray(candidate["reward"], np.float64)[mine], np.asarray(candidate["cost"], np.float64)[mine]
    ri, ci = np.asarray(incumbent["reward"], np.float64)[theirs], np.asarray(incumbent["cost"], np.float64)[theirs]
    q, cost = paired(r, ri), paired(1000 * c, 1000 * ci)
    worse, dearer = q["high"] < 0, cost["low"] > 0
    fc, fi = figures(candidate, mine), figures(incumbent, theirs)
    said = (f"cost {money(fi['cost_per_1k'])} -> {money(fc['cost_per_1k'])} per 1k queries "
            f"({cost['gain']:+.3f} [{cost['low']:+.3f}, {cost['high']:+.3f}]), quality {fi['quality']:.4f} -> "
            f"{fc['quality']:.4f} ({q['gain']:+.4f} [{q['low']:+.4f}, {q['high']:+.4f}]) on {len(mine)} "
            + ("held-out rows" if mode == "paired" else "held-out tasks both were scored on"))
    refused = [w for w, bad in (("worse in quality beyond noise", worse), ("dearer beyond noise", dearer)) if bad]
    head = "same held-out rows: paired with the promoted router" if mode == "paired" else \
        f"{why}: paired with the promoted router on the held-out tasks both were scored on"
    return {"passed": not refused, "mode": mode, "rule": PAIRED_RULE if mode == "paired" else SHARED_RULE,
            "reason": f"{head}; {said}" + (f"; refused: {', '.join(refused)}" if refused else ""),
            "dearer": bool(dearer), "incumbent": {"name": incumbent.get("name"), **fi},
            "candidate_on_compared": fc, "quality_minus_promoted": q, "cost_per_1k_minus_promoted": cost}


def _own(candidate: dict, rows, reason: str, served: dict | None) -> dict:
    """The candidate on its own evidence: the target's floor, and the stated cost rule against the served router."""
    t = parse_target(candidate["target"])
    r = np.asarray(candidate["reward"], np.float64)
    best = (np.asarray(candidate["best_reward"], np.float64) if isinstance(candidate.get("best_reward"), list)
            else None if rows is None else rows.U[:, rows.best].astype(np.float64))
    best_name = candidate.get("best_single") or (None if rows is None else rows.agents[rows.best])
    mine = figures(candidate)
    failed, extra = [], {}
    if t.kind in ("quality", "parity", "max-quality"):
        f = t.value if t.kind == "quality" else 1.0
        rule = (f"own evidence: held-out quality − {f:g} × best single ({best_name}): paired 95 % CI upper bound ≥ 0 "
                "(the target not missed beyond noise)")
        if best is None:
            return {"passed": None, "mode": "own", "rule": rule, "dearer": False,
                    "reason": f"{reason}; not judged: the evidence holds no best single agent's outcome"}
        extra["quality_minus_floor"] = floor = paired(r, f * best)
        if floor["high"] < 0:
            failed.append("the candidate misses the target on its own evidence")
    elif t.kind == "budget":
        rule = f"own evidence: held-out cost ≤ {t.value:g} USD per 1k queries"
        if mine["cost_per_1k"] > t.value + 1e-12:
            failed.append("the candidate misses the target on its own evidence")
    else:
        rule = "own evidence: a λ target has no quality floor"
    dearer = False
    theirs = (served or {}).get("held_out") or {}
    if served and served.get("target") == candidate["target"] and theirs.get("cost_ratio") is not None \
            and mine["cost_ratio"] is not None:
        rule += (f"; and its share of the best single agent's held-out cost at most {100 * COST_RATIO_SLACK:g} "
                 "points above the served router's")
        dearer = mine["cost_ratio"] > theirs["cost_ratio"] + COST_RATIO_SLACK
        reason += (f"; cost {pct(theirs['cost_ratio'])} -> {pct(mine['cost_ratio'])} of the best single "
                   "agent's")
        if dearer:
            failed.append("dearer than the served router (its share of the best single agent's cost)")
    elif served:
        reason += "; cost not compared (the served router's held-out cost at this target is not known)"
    return {"passed": not failed, "mode": "own", "rule": rule, "dearer": bool(dearer),
            "reason": reason + (f"; refused: {', '.join(failed)}" if failed else ""), **extra}


def gate(candidate: dict, incumbent: dict | None, rows=None, unpaired: str | None = None,
         served: dict | None = None) -> dict:
    """The verdict on `candidate` (its evidence) against the promoted router's evidence `incumbent` (None: nothing
    promoted, or no evidence kept: `unpaired` says which), on both kinds of rows. `served`: the pointer's entry now
    (name, target, star: its held-out figures), named in the verdict as the router replaced. `rows`
    (pipeline.report.promotion.HeldOut): the run's held-out rows, for evidence that does not hold the best single
    agent's outcome. The benchmark verdict's fields ("mode" paired | shared | own, "rule", figures, CIs) with the
    combined "passed" (None: not judged), "dearer" and "reason" (both kinds), "benchmark_passed",
    "benchmark_reason" and "traffic" (`traffic_evidence`'s verdict)."""
    bench = benchmark_evidence(benchmark_part(candidate), benchmark_part(incumbent), rows, unpaired, served)
    traffic = traffic_evidence(candidate, incumbent)
    passed = False if traffic["passed"] is False else bench["passed"]
    return {**bench, "passed": passed, "dearer": bool(bench["dearer"] or traffic["dearer"]),
            "reason": f"benchmark rows: {bench['reason']}; traffic rows: {traffic['reason']}",
            "benchmark_passed": bench["passed"], "benchmark_reason": bench["reason"], "traffic": traffic}


def benchmark_evidence(candidate: dict, incumbent: dict | None, rows=None, unpaired: str | None = None,
                       served: dict | None = None) -> dict:
    """The verdict on the benchmark rows of `candidate` against those of `incumbent` (`gate`'s arguments): paired,
    shared or own, the first that applies. {"passed", "mode", "rule", "reason", "dearer", "replaces", figures}."""
    served_name = (served or {}).get("name") or (incumbent or {}).get("name")
    out = {"target": candidate["target"], "replaces": served_name,
           "candidate": {"name": candidate["name"], **figures(candidate)}}
    if not len(candidate["reward"]):
        return {**out, "passed": None, "mode": "none", "rule": None, "dearer": False,
                "reason": "no held-out rows of a source other than traffic: not judged"}
    reason = unpaired or pairing(candidate, incumbent)
    if reason is None:
        every = np.arange(len(candidate["reward"]))
        return {**out, **_compared(candidate, incumbent, every, every, "paired", None)}
    if incumbent is not None and unpaired is None and incumbent.get("target") == candidate["target"]:
        mine, theirs = shared_rows(candidate, incumbent)
        if len(mine) >= MIN_SHARED:
            return {**out, **_compared(candidate, incumbent, mine, theirs, "shared", reason)}
        reason += f"; {len(mine)} held-out tasks scored by both (< {MIN_SHARED}: not paired)"
    star = (served or {}).get("star") or {}
    known = {"name": served_name, "target": (served or {}).get("target") or star.get("target"),
             "held_out": (incumbent or {}).get("held_out") if incumbent and incumbent.get("target") ==
             candidate["target"] else star.get("held_out")} if served_name else None
    return {**out, **_own(candidate, rows, reason, known),
            "incumbent": None if not served_name else {"name": served_name}}


def verdict_lines(verdict: dict, action: str | None = None) -> list[str]:
    """The verdict for a person: what it would replace, how each kind of rows judged it, why."""
    cand = verdict["candidate"]
    passed = {True: "passes", False: "refuses", None: "cannot judge"}[verdict.get("passed")]
    head = (f"gate: {passed} {cand['name']} at {verdict['target']} (replacing "
            f"{verdict.get('replaces') or 'nothing: none promoted yet'})" + (f": {action}" if action else ""))
    if "traffic" in verdict:  # both kinds of evidence, a line each
        lines = [head, f"  benchmark rows ({verdict['mode']}): {verdict['benchmark_reason']}",
                 f"  traffic rows: {verdict['traffic']['reason']}"]
    else:  # a verdict without evidence (`router-lite promote` of a router never gated)
        lines = [head, f"  {verdict['mode']}: {verdict['reason']}"]
    if verdict.get("dearer"):
        lines.append(f"  {cand['name']} is dearer than the served router: not promoted by default "
                     f"(`router-lite promote {cand['name']} --force` overrides)")
    return lines


def evidence_rows(verdict: dict) -> list[dict]:
    """The verdict as a table for the UI: one row per kind of evidence (benchmark, traffic) with its rows compared,
    the promoted router's and the candidate's quality and cost per 1k on them, the paired differences with their
    95 % CIs, and what that kind says (passes | refuses | not judged)."""
    compared = verdict.get("candidate_on_compared") or verdict.get("candidate") or {}
    out = [_evidence_row(f"benchmark ({verdict.get('mode')})", compared.get("n"), verdict.get("incumbent"), compared,
                         verdict, verdict.get("benchmark_passed", verdict.get("passed")))]
    if (t := verdict.get("traffic")) is not None:
        out.append(_evidence_row("traffic", t["n"], t.get("incumbent"), t.get("candidate"), t, t["passed"]))
    return out


def _evidence_row(kind: str, n, promoted: dict | None, candidate: dict | None, cis: dict, passed) -> dict:
    def ci(d, f):
        return None if not d else f"{d['gain']:{f}} [{d['low']:{f}}, {d['high']:{f}}]"

    promoted, candidate = promoted or {}, candidate or {}
    return {"evidence": kind, "rows": n, "promoted quality": promoted.get("quality"),
            "candidate quality": candidate.get("quality"),
            "quality Δ [95 % CI]": ci(cis.get("quality_minus_promoted"), "+.4f"),
            "promoted $/1k": promoted.get("cost_per_1k"), "candidate $/1k": candidate.get("cost_per_1k"),
            "cost Δ per 1k [95 % CI]": ci(cis.get("cost_per_1k_minus_promoted"), "+.3f"),
            "says": {True: "passes", False: "refuses", None: "not judged"}[passed]}
