"""What a router is worth, as reported: `report_headline` (one router kind at the serving target; the benchmark
report's bold headline is the router served, `served_headline`, once the promotion has named it: the one ★),
`value_line` (one target of the prompt-only head), `targets_markdown` (its held-out per-target table),
`router_value` (reports/router_value.json) and `ablation_markdown` (the router kinds side by side). The numbers
come from pipeline/route/value.py (the value and cost scorers, `held_out_value`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from pipeline.collect.rewards import cost_per_1k_label
from pipeline.route.targets import REPORT_TARGETS


def value_line(value: dict, target: str = "parity", models: dict | None = None, inside: str = "") -> str:
    """'parity: 0.82 (CI 0.80-0.84) at 48 % of gpt-4o's cost (best single 0.85)' for one target of a held-out value
    report (`models`: agent name -> model name, to name the best single agent by its model; `inside`: more said in
    the closing parenthesis)."""
    t = value["targets"].get(target)
    if t is None:
        return f"{target}: not evaluated"
    bs = value["best_single"]["agent"]
    bs = (models or {}).get(bs, bs)
    ratio = "n/a" if t["cost_ratio"] is None else f"{100 * t['cost_ratio']:.0f} %"
    return (f"{target}: {t['quality']:.3f} (CI {t['ci_low']:.3f}-{t['ci_high']:.3f}) at {ratio} of {bs}'s cost "
            f"(best single {value['best_single']['quality']:.3f}{inside})")


def targets_markdown(value: dict) -> str:
    """The held-out per-target table (Markdown) of a value report, then the RouteLLM metrics."""
    import pandas as pd

    label = cost_per_1k_label(value.get("costs_estimated"))
    rows = []
    order = {name: i for i, name in enumerate(REPORT_TARGETS)}  # the report's order (stored JSON sorts its keys)
    for name, t in sorted(value["targets"].items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])):
        rows.append({"target": name, "λ": t["lambda"], "quality": t["quality"],
                     "95% CI": f"{t['ci_low']:.3f}-{t['ci_high']:.3f}",
                     "vs best single": f"{t['gain']:+.3f} [{t['gain_low']:+.3f}, {t['gain_high']:+.3f}]",
                     label: t["cost_per_1k"],
                     "cost ratio": t["cost_ratio"],
                     "shares": ", ".join(f"{a} {s:.0%}" for a, s in t["shares"].items() if s >= 0.005)})
    bs, orc = value["best_single"], value["oracle"]
    rows.append({"target": f"best single ({bs['agent']})", "quality": bs["quality"], label: bs["cost_per_1k"],
                 "cost ratio": 1.0})
    rows.append({"target": "oracle", "quality": orc["quality"], label: orc["cost_per_1k"],
                 "cost ratio": orc["cost_per_1k"] / bs["cost_per_1k"] if bs["cost_per_1k"] else None})
    fmt = lambda x: "n/a" if x is None else f"{x:.3f}"
    df = pd.DataFrame(rows)
    return (df.astype(object).where(df.notna(), None).to_markdown(index=False, floatfmt=".4f", missingval="")
            + f"\n\nRouteLLM metrics, {bs['agent']} (strong) vs {value['weak']} (weak): APGR {fmt(value['apgr'])}, "
              f"CPT(50%) {fmt(value['cpt50'])}, CPT(80%) {fmt(value['cpt80'])} (n_test={value['n_test']})\n")


ROUTER_VALUE_KEYS = ("profile", "pool_verdict", "best_single", "max_quality", "targets", "apgr", "cpt50", "cpt80",
                     "aiq", "label_router", "knn", "oracle", "n_test", "routers", "best_router", "backbone",
                     "prompt_routers", "shipped_prompt_router", "imputed_cells", "router_arena", "served",
                     "held_out_decisions", "phrasings")
TARGET_KEYS = ("quality", "ci_low", "ci_high", "cost_per_1k", "cost_ratio", "lambda", "shares")


CASCADE_TARGET_KEYS = (*TARGET_KEYS, "quality_ratio", "quality_ratio_ci", "gain", "gain_low", "gain_high",
                       "calls_per_query", "plan")


@dataclass(frozen=True)
class HeadFigures:
    """What the prompt router's fit measured: its held-out value report (`value`: pipeline.route.value's), its AIQ
    on the rows its λ path was read on, how those rows were chosen (`selection`), every prompt-only kind's figures
    (`kinds`: `fit.extra["kinds"]`) and the kind shipped (`shipped`: `fit.extra["shipped"]`)."""

    value: dict
    validation_aiq: float | None = None
    selection: dict | None = None
    kinds: dict | None = None
    shipped: dict | None = None


@dataclass(frozen=True)
class CascadeFigures:
    """What the cascade's fit measured (`summary`: `CascadeFit.to_dict()`), its variants' test AIQ on the report's
    frontier (`aiq_test`: {variant: AIQ}, else the fit's own) and the routed benchmark's summaries
    (`benchmark`: {target: summary}, real calls through the pool)."""

    summary: dict
    aiq_test: dict | None = None
    benchmark: dict | None = None


def router_value(profile: str, pool_verdict: str | None, head: HeadFigures, aiq: dict,
                 cascade: CascadeFigures | None = None, backbone: dict | None = None, imputed_cells: int = 0,
                 arena: dict | None = None) -> dict:
    """reports/router_value.json: exactly `ROUTER_VALUE_KEYS` (costs are estimated USD per 1k queries).

    `backbone` ({id, backend, precision}) says what embedded the prompts: the figures move in the third or fourth
    decimal between a bfloat16 and a float32 run of the same backbone (docs/backbones.md).

    `routers` holds one entry per router kind (the prompt-only head; the cascade's variants: answers only, and
    with the prompt router), each with its held-out targets and test AIQ; `best_router` is the kind with the best
    validation AIQ (the held-out rows choose nothing). `targets` / `max_quality` stay the head's (prompt-only).

    `prompt_routers` holds every prompt-only kind's max-quality figures (`head.kinds`) and `shipped_prompt_router`
    the one the lineage shipped (`head.shipped`; kind "best_single" when the ship gate refused the chosen kind).

    `imputed_cells`: reward-matrix cells estimated, not collected (new agents asked on a sample,
    `collection.new_agent_sample`; 0 for a fully collected matrix). Each router's `selection` says how its operating
    points (and `aiq_validation`) were chosen: {"method": "validation", "rows"} on the validation split, or {"method":
    "crossfit", "folds", "seed", "rows"} on pooled out-of-fold outcomes over train + validation. `router_arena`:
    RouterArena's measures (`arena`, the `router_arena` asset: pipeline/report/arena.py), None when not measured."""
    value, prompt_routers, shipped = head.value, head.kinds, head.shipped
    cascade_aiq, cascade_benchmark, cascade = (cascade.aiq_test, cascade.benchmark, cascade.summary) if cascade \
        else (None, None, None)
    mq = value["targets"]["max-quality"]
    lr = value.get("label_router")
    bc = value["best_single"]["cost_per_1k"]
    routers = {"head": {"aiq_validation": head.validation_aiq, "aiq_test": aiq.get("head"),
                        "selection": head.selection or {"method": "validation"},
                        "targets": {name: {**{k: t[k] for k in TARGET_KEYS},
                                           "quality_ratio": t["quality"] / value["best_single"]["quality"]
                                           if value["best_single"]["quality"] else None,
                                           "gain": t["gain"], "gain_low": t["gain_low"], "gain_high": t["gain_high"]}
                                    for name, t in value["targets"].items()}}}
    for variant, v in ((cascade or {}).get("variants") or {}).items():
        routers[f"cascade:{variant}"] = {
            "aiq_validation": v["aiq_validation"], "aiq_test": (cascade_aiq or {}).get(variant, v["aiq_test"]),
            "selection": cascade.get("selection") or {"method": "validation"},
            "targets": {name: {k: t.get(k) for k in CASCADE_TARGET_KEYS} for name, t in v["targets"].items()}}
    if cascade_benchmark and cascade:  # {target: summary} of the routed benchmark (real calls through the pool)
        routers[f"cascade:{cascade['chosen']}"]["routed_benchmark"] = {
            name: {**{k: b[k] for k in ("n", "accuracy", "cost_per_1k", "calls_per_query")},
                   "cost_ratio": b["cost_per_1k"] / bc if bc else None}
            for name, b in cascade_benchmark.items()}
    scored = {k: r["aiq_validation"] for k, r in routers.items() if r["aiq_validation"] is not None}
    best = max(scored, key=scored.get) if scored else "head"
    return {
        "routers": routers, "best_router": best,
        "profile": profile, "pool_verdict": pool_verdict,
        "best_single": dict(value["best_single"]),
        "max_quality": {"quality": mq["quality"], "ci_low": mq["ci_low"], "ci_high": mq["ci_high"],
                        "gain": mq["gain"], "cost_per_1k": mq["cost_per_1k"]},
        "targets": {name: {k: t[k] for k in TARGET_KEYS} for name, t in value["targets"].items()},
        "apgr": value["apgr"], "cpt50": value["cpt50"], "cpt80": value["cpt80"],
        "aiq": {k: aiq.get(k) for k in ("head", "prior", "hull", "knn")},
        "label_router": None if lr is None else lr["quality"], "knn": value.get("knn"),
        "oracle": value["oracle"]["quality"], "n_test": value["n_test"], "backbone": backbone,
        "prompt_routers": dict(prompt_routers or {}), "shipped_prompt_router": shipped,
        "imputed_cells": int(imputed_cells), "router_arena": arena,
        "served": None, "held_out_decisions": None, "phrasings": None,  # by the promotion / with_held_out_served
    }


def _ci_text(d: dict | None) -> str:
    return "" if not d else f"{d['gain']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"


def prompt_routers_markdown(kinds: dict, shipped: dict | None) -> str:
    """Every prompt-only router kind at max quality: validation reward, cross-fitted reward over train + validation
    (the choice, when selected so) and test reward with its paired 95 % CI of the gain over the best single agent
    and, where measured, of its difference to the chosen kind (the report only: is a gap more than row noise?);
    "(chosen)" marks the kind chosen (never on test rows); ★ is kept for the router served (`ablation_markdown`)."""
    import pandas as pd

    chosen = (shipped or {}).get("chosen")
    rows = [{"prompt router": k + (" (chosen)" if k == chosen else ""), "k": r.get("k", ""),
             "validation": r["validation"],
             **({"cross-fitted (train + validation)": r["crossfit"]} if "crossfit" in r else {}), "test": r["test"],
             "test − best single [95 % CI]": f"{r['test_gain']:+.4f} [{r['test_gain_low']:+.4f}, "
                                             f"{r['test_gain_high']:+.4f}]",
             **({"test − chosen [95 % CI]": _ci_text(r.get("minus_shipped"))}
                if any("minus_shipped" in v for v in kinds.values()) else {})}
            for k, r in kinds.items()]
    note = ""
    if shipped:
        note = (f"\n\nShipped: **{shipped['kind']}** (validation {shipped['validation']:.4f}, test "
                f"{shipped['test']:.4f}, OOD guard included)"
                + (f"; the ship gate refused {chosen}, whose validation gain was within the noise"
                   if shipped["kind"] != chosen else "") + ".")
    return pd.DataFrame(rows).to_markdown(index=False, floatfmt=".4f") + note + "\n"


ROUTER_LABELS = {"head": "prompt-only (head)", "cascade:cascade": "cascade (answers only)",
                 "cascade:combined": "combined (cascade + prompt router)"}


def ablation_markdown(rv: dict, targets=REPORT_TARGETS) -> str:
    """The router kinds side by side (reports/router_value.json `routers`): AIQ on validation and test, and per
    target the held-out quality as a fraction of the best single agent's (95 % paired CI where measured) and the
    cost as a fraction of its cost. ★ marks the router served (`served`, written by the promotion), the only ★."""
    import pandas as pd

    bs = rv["best_single"]
    rows = []
    star = served_key(rv)
    for kind, r in rv["routers"].items():
        row = {"router": ROUTER_LABELS.get(kind, kind) + (" ★" if kind == star else ""),
               "AIQ val": r["aiq_validation"], "AIQ test": r["aiq_test"]}
        for name in targets:
            t = r["targets"].get(name)
            if t is None:
                continue
            ci = t.get("quality_ratio_ci")
            q = f"{t['quality_ratio']:.1%}" + (f" [{ci[0]:.1%}, {ci[1]:.1%}]" if ci else "")
            row[name] = f"{q} at {t['cost_ratio']:.0%}" if t.get("cost_ratio") is not None else q
        rows.append(row)
    a = rv["aiq"]
    return (f"Held-out test n={rv['n_test']}; fractions of {bs['agent']}'s quality (paired 95 % CI) at a fraction "
            f"of its cost; {star_note(rv)}. Baselines' test AIQ: prior {a['prior']:.4f}, individual hull "
            f"{a['hull']:.4f}, kNN {a['knn']:.4f}.\n\n"
            + pd.DataFrame(rows).to_markdown(index=False, floatfmt=".4f") + "\n")


def arena_markdown(arena: dict, targets=("max-quality", "parity")) -> str:
    """RouterArena's measures side by side (reports/router_value.json `router_arena`): each router kind at `targets`,
    each prompt-only kind and baseline at max quality; decision time per query (batch size 1)."""
    import pandas as pd

    def pct(x):
        return "n/a" if x is None else f"{x:.1%}"

    def row(name: str, m: dict, ms: dict | None) -> dict:
        return {"router": name, "optimal selection": pct(m["optimal_selection"]),
                "optimal-cost ratio": pct(m["optimal_cost_ratio"]), "robustness": pct(m["robustness"]),
                "decision p50 / p95 ms": "" if not ms else f"{ms['p50']:.1f} / {ms['p95']:.1f}",
                "of which pick": "" if not ms or "pick" not in ms else f"{ms['pick']['p50']:.2f} / "
                                                                       f"{ms['pick']['p95']:.2f}"}

    rows = []
    for kind, r in arena["routers"].items():
        for t in targets:
            if t in r:
                rows.append(row(f"{ROUTER_LABELS.get(kind, kind)} at {t}", r[t], r.get("decision_ms")
                                if t == "max-quality" else None))
    for kind, r in arena["prompt_routers"].items():
        rows.append(row(f"prompt kind {kind} at max-quality", r["max-quality"], r.get("decision_ms")))
    for name, b in arena["baselines"].items():
        rows.append(row(f"{name}" + (f" ({b['agent']})" if "agent" in b else ""), b, None))
    p = arena["perturbations"]
    return (pd.DataFrame(rows).to_markdown(index=False)
            + f"\n\nHeld-out test n={arena['n_test']}; robustness: decision unchanged under every perturbation of "
              f"the set ({', '.join(p['set'])}; seed {p['seed']}); baselines ignore the prompt (stable by "
              "construction); decision time per query at max quality, batch size 1: the prompt embedded alone, then "
              "the pick (a cascade: its plan run on the recorded answers, the agents' latency excluded).\n")


def fit_optimality(fit, X_te, U_te, C_te, agent_cost) -> dict:
    """RouterArena's optimal selection and optimal-cost ratios of a `pipeline.route.fit.RouterFit` on its held-out
    rows (embeddings X_te, tie-aware rewards U_te, costs C_te; `agent_cost` the agents' mean training costs): the
    shipped router per report target and each prompt-only kind at max quality, as `router-lite train` prints them
    (robustness and decision time need the lineage's backbone runs: the `router_arena` asset)."""
    from pipeline.report.arena import optimality
    from pipeline.route.decisions import PromptParts, head_decisions, kind_decisions

    rows = np.arange(len(U_te))
    parts = PromptParts(fit.head, fit.guard, fit.scorer, fit.cost_scorer, fit.operating_points, fit.best_single,
                        agent_cost)

    def measures(picks):
        m = optimality(picks, C_te[rows, picks], U_te, C_te)
        return {k: m[k] for k in ("optimal_selection", "optimal_cost_ratio", "optimal_cost_ratio_all")}

    return {"targets": {t: measures(p) for t, p in head_decisions(parts, X_te).items()},
            "prompt_routers": {k: measures(p) for k, p in kind_decisions(fit.kinds, fit.guard, fit.best_single,
                                                                          X_te).items()}}


def validation_at(reg, target=None) -> dict:
    """What a registered router (`pipeline.route.registry.RegisteredRouter`, head or cascade) stands for at a
    target, on validation (where its operating points were chosen): {"target", "quality", "quality_ratio",
    "cost_per_1k", "cost_ratio"}, ratios against the best single agent on validation."""
    if reg.needs_grader:  # a staged router (the cascade) resolves targets on its own path
        point, path = reg.router.resolve(target), reg.router.path
    else:
        point, path = reg.resolve_target(target), reg.operating_points or {}
    bs = path.get("best_single_validation") or {}
    out = {"target": point["target"], "quality": point.get("quality"), "cost_per_1k": point.get("cost_per_1k")}
    out["quality_ratio"] = out["quality"] / bs["quality"] if out["quality"] is not None and bs.get("quality") else None
    out["cost_ratio"] = (out["cost_per_1k"] / bs["cost_per_1k"]
                         if out["cost_per_1k"] is not None and bs.get("cost_per_1k") else None)
    return out


def star_line(star: dict, name: str) -> str:
    """'cascade (answers only) ★, cascade cascade-…, target quality>=0.98: held-out test 99.6 % of the best single
    agent's quality at 74.0 % of its cost (validation 99.0 % at 67.0 %)' (latest.json's `star`)."""
    v, h = star["validation"], star.get("held_out") or {}
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    return (f"{star['label']} ★, {star['kind']} {name}, target {star['target']}: held-out test "
            f"{pct(h.get('quality_ratio'))} of the best single agent's quality at {pct(h.get('cost_ratio'))} of its "
            f"cost (validation {pct(v['quality_ratio'])} at {pct(v['cost_ratio'])})")


def served_key(rv: dict) -> str | None:
    """The router kind of this report that is served (`served.router`: set by the promotion when the router it
    serves is one of this run's), else None."""
    key = (rv.get("served") or {}).get("router")
    return key if key in rv.get("routers", {}) else None


def star_note(rv: dict) -> str:
    """What the ★ of a report marks: the router served, and where the best validation AIQ stands beside it."""
    best = ROUTER_LABELS.get(rv["best_router"], rv["best_router"])
    served = rv.get("served")
    if not served:
        return (f"no ★ yet: the `promotion` asset names the router served; best validation AIQ: {best}")
    if served_key(rv) is None:
        return (f"no ★ in this table: the router served, {served.get('label')} {served.get('name')}, is not one of "
                f"this run's; best validation AIQ: {best}")
    return f"★ = the router served ({served.get('name')}, promoted by {served.get('promoted_by')}); best validation " \
           f"AIQ: {best}"


def with_served(rv: dict, entry: dict | None, run_routers: dict[str, str]) -> dict:
    """`rv` with `served`: the router registry/latest.json serves (`entry`, None: none), and which of this run's
    router kinds it is (`run_routers`: kind key -> registered name; `router` None when it is none of them)."""
    if not entry:
        return {**rv, "served": None}
    star = entry.get("star") or {}
    key = next((k for k, name in run_routers.items() if name == entry["name"]), None)
    return {**rv, "served": {"router": key, "name": entry["name"], "label": star.get("label") or entry.get("kind"),
                             "kind": entry.get("kind"), "target": entry.get("target") or star.get("target"),
                             "promoted_by": entry.get("promoted_by"), "promoted_at": entry.get("promoted_at"),
                             "held_out": star.get("held_out")}}


def served_headline(rv: dict, target: str, models: dict | None = None) -> str:
    """The report's bold headline once the promotion has named the router served: this run's router kind at
    `target` (`report_headline`, with its ★), or the served router of an earlier run by its held-out figures."""
    key = served_key(rv)
    if key is not None:
        return report_headline(rv, target, models, key)
    s = rv.get("served")
    if not s:
        return "no router served yet: the `promotion` asset names it"
    h = s.get("held_out") or {}
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    return (f"★ {s.get('label')} {s['name']} (an earlier run's router: this run's candidate was not promoted), "
            f"{s.get('target')}: held-out test {pct(h.get('quality_ratio'))} of the best single agent's quality at "
            f"{pct(h.get('cost_ratio'))} of its cost")


SERVED_PENDING = "★ the router served: named by the `promotion` asset after this report (registry/latest.json)"
_SERVED_LINE = re.compile(r"^\*\*(★ |no router served).*\*\*$", re.M)


def mark_served(report: str, headline: str) -> str:
    """The benchmark report's text with its bold ★ line (`SERVED_PENDING`, or the one a promotion wrote before)
    replaced by `headline` (`served_headline`); a report without one gets it on top."""
    line = f"**{headline}**"
    if _SERVED_LINE.search(report):
        return _SERVED_LINE.sub(lambda _: line, report, count=1)
    return f"{line}\n\n{report}"


def mark_served_reports(reports, served: dict | None, run_routers: dict[str, str], target: str,
                        models: dict | None = None) -> dict | None:
    """After a promotion: `served` into reports/router_value.json (`with_served`) and the router served into the
    benchmark report's bold ★ line (`mark_served`): the one ★ is the served router, whatever the verdict (the report
    was written before the gate decided). Returns the new router_value (None when there is no report)."""
    import json
    from pathlib import Path

    from pipeline.core.io import atomic_write_json, atomic_write_text

    rv_file, md_file = Path(reports) / "router_value.json", Path(reports) / "benchmark_report.md"
    if not rv_file.is_file():
        return None
    rv = with_served(json.loads(rv_file.read_text()), served, run_routers)
    atomic_write_json(rv, rv_file)
    if md_file.is_file():
        atomic_write_text(mark_served(md_file.read_text(), served_headline(rv, target, models)), md_file)
    return rv


def report_headline(rv: dict, target: str, models: dict | None = None, key: str | None = None) -> str:
    """One router kind of reports/router_value.json (`key`; by default `best_router`, the best validation AIQ) at
    `target` (the profile's serving target) on held-out test, as `value_line` says a target: 'cascade (answers
    only), quality>=0.98: 0.851 (CI 0.821-0.880) at 74 % of gpt-4o's cost (best single 0.855; 99.6 % of its
    quality); routed benchmark (real calls) 0.851 at 73 %; validation AIQ 0.8345', led by '★ ' when the kind is the
    router served (`served_key`) and by 'best validation AIQ: ' otherwise. `models`: agent name -> model name."""
    key = key or rv["best_router"]
    r = rv["routers"][key]
    aiq = "" if r.get("aiq_validation") is None else f"; validation AIQ {r['aiq_validation']:.4f}"
    lead = "★ " if key == served_key(rv) else ("best validation AIQ: " if key == rv["best_router"] else "")
    head = f"{lead}{ROUTER_LABELS.get(key, key)}, "
    t = r["targets"].get(target)
    if t is None:
        return f"{head}{target}: not evaluated on held-out test{aiq}"
    share = "" if t.get("quality_ratio") is None else f"; {100 * t['quality_ratio']:.1f} % of its quality"
    rb = (r.get("routed_benchmark") or {}).get(target)
    routed = "" if not rb or rb.get("cost_ratio") is None else \
        f"; routed benchmark (real calls) {rb['accuracy']:.3f} at {100 * rb['cost_ratio']:.0f} %"
    return (head + value_line({"targets": r["targets"], "best_single": rv["best_single"]}, target, models, share)
            + routed + aiq)


HELD_OUT_NOTE = ("held-out figures are what `router-lite serve` decides on each test row (table `served_decisions`): "
               "the user text embedded, the OOD guard, the prompt shortcuts and a cascade's answer-format guess "
               "included; each agent's reward and cost as recorded for that question")


def with_held_out_served(rv: dict, served: dict, phrasings: dict | None = None) -> dict:
    """reports/router_value.json with every router's held-out targets replaced by what it serves (`served`:
    {router: {target: pipeline.route.served.served_figures}}), the fit's plan and λ kept; the prompt router's
    top-level `targets` / `max_quality` too; and how the served routers fare on each phrasing of the held-out
    questions (`phrasings`: the `phrasings` asset)."""
    out = {**rv, "routers": {k: dict(v) for k, v in rv["routers"].items()}, "held_out_decisions": HELD_OUT_NOTE,
           "phrasings": phrasings}
    for router, by_target in served.items():
        if router not in out["routers"]:
            continue
        fitted = out["routers"][router].get("targets", {})
        out["routers"][router]["targets"] = {
            t: {**{k: fitted.get(t, {}).get(k) for k in ("lambda", "plan") if k in fitted.get(t, {})}, **fig}
            for t, fig in by_target.items()}
    head = served.get("head")
    if head:
        out["targets"] = {t: {k: f.get(k, rv["targets"].get(t, {}).get(k)) for k in (*TARGET_KEYS, "guard_rate")}
                          for t, f in head.items()}
        mq = head.get("max-quality")
        if mq:
            out["max_quality"] = {k: mq[k] for k in ("quality", "ci_low", "ci_high", "gain", "cost_per_1k")}
    return out
