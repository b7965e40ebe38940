"""README.md and the other generated doc blocks, written from their sources (never typed by hand).

    make docs                                  # = python scripts/readme.py: rewrite every generated file
    python scripts/readme.py --check           # exit 1 with a diff when a committed file is not the output
                                               # (tests/test_readme.py)
    python scripts/readme.py --from-home       # first copy $ROUTER_LITE_HOME/reports/router_value.json (after
                                               # `make run`) to docs/results/router_value_demo.json
    python scripts/readme.py --from-home --wide  # after `router-lite run --override F` with `pool: {name:
                                               # demo_wide}`: to docs/results/router_value_demo_wide.json, with
                                               # the pool report's quarantine and lower-bound costs

What is generated, and from what:
- README.md: docs/README.template.md with its `{{name}}` fields filled (`FIELDS`): `{{value}}` is the value
  section, from docs/results/router_value_demo.json (the committed copy of the default run's
  `reports/router_value.json`); `{{n_sources}}` the number of task sources (`pipeline.tasks.sources.SOURCES`).
- docs/training.md, between `<!-- train-config:begin` and `<!-- train-config:end -->`: the `TrainConfig` option
  table, from its docstring (`pipeline.core.config.option_table`).
- docs/wide_pool.md: the wider pool's value (`demo_wide`: demo + 5 replayed models), stated like the default's,
  from docs/results/router_value_demo_wide.json (a `demo_wide` run's `reports/router_value.json` plus its pool
  report's quarantined agents and lower-bound costs).
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.report.phrasing import WRAPPERS  # noqa: E402
from pipeline.report.value import (  # noqa: E402
    ROUTER_LABELS,
    ablation_markdown,
    arena_markdown,
    prompt_routers_markdown,
    served_key,
)

README = Path("README.md")
TEMPLATE = Path("docs") / "README.template.md"
TRAINING = Path("docs") / "training.md"
COPY = Path("docs") / "results" / "router_value_demo.json"
WIDE_COPY = Path("docs") / "results" / "router_value_demo_wide.json"
WIDE_PAGE = Path("docs") / "wide_pool.md"
GOAL = ("quality>=0.98", 0.98, 0.55)  # the goal: >= 98 % of the best single agent's quality at <= 55 % cost
FIELD = re.compile(r"\{\{(\w+)\}\}")
TRAIN_BEGIN, TRAIN_END = "<!-- train-config:begin", "<!-- train-config:end -->"
GENERATED_NOTE = ("<!-- README.md is generated: edit docs/README.template.md, then `make docs` "
                  "(scripts/readme.py); tests/test_readme.py fails when they differ. -->\n")


# --- the value section ----------------------------------------------------------------------------------------------
def render_value(rv: dict, copy: Path = COPY) -> str:
    """The value section from a `router_value.json`: pool verdict, the router kinds side by side, the best router
    at the goal's operating point, its routed benchmark, whether the goal is met."""
    bs = rv["best_single"]
    best = rv["routers"][rv["best_router"]]
    head = rv["routers"]["head"]
    a = rv["aiq"]
    bb = rv.get("backbone")
    embedded = (f", prompts embedded by `{bb['id'].split('/')[-1]}` on {bb['backend']} {bb['precision']} (a CPU "
                f"with bf16 units runs bfloat16 by default: some operating points then move by whole points, the ★'s "
                f"too can; docs/backbones.md, \"dtype\")") if bb else ""
    lines = [f"Profile `{rv['profile']}`{embedded}, costs estimated (chars/4 × list prices). Generated from "
             f"`reports/router_value.json` (committed copy: `{copy.as_posix()}`) by `scripts/readme.py`.", "",
             *bare_lines(rv),
             f"**Pool verdict: {rv['pool_verdict']}**", "", *served_lines(rv),
             ablation_markdown(rv)]
    if rv.get("prompt_routers"):
        lines += ["Prompt-only router kinds at max quality (the lineage ships the best by validation; "
                  "docs/training.md, \"Which prompt router ships\"):", "",
                  prompt_routers_markdown(rv["prompt_routers"], rv.get("shipped_prompt_router"))]
    if rv.get("router_arena"):
        lines += arena_lines(rv["router_arena"], rv.get("backbone"))
    name, frac, cap = GOAL
    t = best["targets"].get(name)
    if t:
        ci = t.get("quality_ratio_ci") or [float("nan")] * 2
        met = t["quality_ratio"] >= frac and t["cost_ratio"] <= cap
        lines += [f"Best router on validation: **{ROUTER_LABELS.get(rv['best_router'], rv['best_router'])}**: "
                  f"`{name}` gives **{t['quality_ratio']:.1%} of {bs['agent']}'s quality (paired 95 % CI "
                  f"{ci[0]:.1%}–{ci[1]:.1%}) at {t['cost_ratio']:.0%} of its cost**; test AIQ "
                  f"{best['aiq_test']:.4f} against prior {a['prior']:.4f} and individual hull {a['hull']:.4f} "
                  f"(prompt-only head {head['aiq_test']:.4f}).", ""]
        rb = best.get("routed_benchmark", {}).get(name)
        if rb:
            lines += [f"Routed benchmark at `{name}` (every stage's calls really made through the pool): accuracy "
                      f"{rb['accuracy']:.4f} at ${rb['cost_per_1k']:.3f} per 1k queries, {rb['cost_ratio']:.0%} of "
                      f"the best single agent's cost, {rb['calls_per_query']:.2f} calls per query.", ""]
        lines += [f"The goal of ≥ {frac:.0%} of the best single agent's quality at ≤ {cap:.0%} of its cost is "
                  + ("**met**." if met else "**not met** on this pool (docs/training.md, \"Cascades\", says why "
                                              "and how it was measured)."), ""]
    return "\n".join(lines).rstrip() + "\n"


def bare_lines(rv: dict) -> list[str]:
    """The value first as users send it: the ★ at the serving target on the held-out questions typed bare (as
    served: the OOD guard and the fallbacks included), then the phrasing table (docs/training.md, "What a router
    learns from")."""
    ph = rv.get("phrasings") or {}
    key = served_key(rv)
    star = (ph.get("routers") or {}).get(key or rv["best_router"])
    if not star:
        return []
    bare, tmpl = star["phrasings"]["bare"], star["phrasings"]["templated"]
    q, c = bare["quality_ratio_ci"], bare["cost_ratio_ci"]
    label = ("the ★ " if key else "the best validation AIQ router, ") + ROUTER_LABELS.get(key or rv["best_router"],
                                                                                         rv["best_router"])
    other = {k: f for k, f in star["phrasings"].items() if k not in ("bare", "templated")}
    span = lambda key, fmt: (f"{min(f[key] for f in other.values()):{fmt}}–"  # noqa: E731
                             f"{max(f[key] for f in other.values()):{fmt}}")
    oe = star.get("open_ended") or {}
    return [f"**The question as a user types it** (held-out test, bare, decided as `router-lite serve` decides: "
            f"OOD guard and fallbacks included; each agent's reward and cost as recorded for that question): "
            f"{label} at `{ph['target']}` gives **{bare['quality_ratio']:.1%} of {rv['best_single']['agent']}'s "
            f"quality (paired 95 % CI {q[0]:.1%}–{q[1]:.1%}) at {bare['cost_ratio']:.0%} of its cost (CI "
            f"{c[0]:.0%}–{c[1]:.0%})**; the OOD guard fires on {bare['guard_rate']:.1%} of them. Templated (the "
            f"benchmark's prompt pasted): {tmpl['quality_ratio']:.1%} at {tmpl['cost_ratio']:.0%}, guard "
            f"{tmpl['guard_rate']:.1%}; under RouterArena's perturbations and {len(WRAPPERS)} conversational wrappers: "
            f"{span('quality_ratio', '.1%')} at {span('cost_ratio', '.0%')}, guard {span('guard_rate', '.1%')}, the "
            f"same decision as bare on {span('robustness', '.1%')} of them"
            + (f"; open-ended instructions (no gold answer, n={oe['n']}): guard {oe['guard_rate']:.1%}" if oe else "")
            + " (the phrasing table: the benchmark report, docs/training.md \"What a router learns from\").", ""]


def served_lines(rv: dict) -> list[str]:
    """The one ★: the router served after the run (`served`, written by the promotion), by its held-out figures at
    its target; nothing for a copy written before the promotion named it."""
    s = rv.get("served")
    if not s:
        return []
    h = s.get("held_out") or {}
    pct = lambda x: "n/a" if x is None else f"{x:.1%}"  # noqa: E731
    return [f"★ Served (`router-lite serve`): **{s.get('label')}** `{s['name']}`, promoted by {s.get('promoted_by')} "
            f"at `{s.get('target')}`: {pct(h.get('quality_ratio'))} of the best single agent's quality at "
            f"{pct(h.get('cost_ratio'))} of its cost on held-out test.", ""]


def arena_lines(arena: dict, backbone: dict | None) -> list[str]:
    """RouterArena's measures (reports/router_value.json `router_arena`), with what embedded the perturbed prompts
    when that differs from the rest of the report (the committed copy keeps its own precision)."""
    bb = arena.get("backbone") or {}
    other = f" (measured on {bb['backend']} {bb['precision']})" if bb and backbone and \
        bb.get("precision") != backbone.get("precision") else ""
    return [f"RouterArena's measures{other}: the share of answerable test queries sent to the cheapest agent that "
            "answers them correctly, the optimum's cost over the router's on the queries it answered correctly, "
            "the share of decisions unchanged under every prompt perturbation, the decision time per query "
            "(docs/training.md, \"RouterArena's measures\"):", "", arena_markdown(arena)]


def render_wide(rv: dict) -> str:
    """docs/wide_pool.md: the wider pool's run, its quarantine and lower-bound costs, then its value section."""
    lines = [f"# The wider pool: `{rv.get('pool', 'demo_wide')}`", "",
             "<!-- generated by scripts/readme.py from " + WIDE_COPY.as_posix() + ": edit neither by hand -->", "",
             "The demo's own wider pool (`pool.wide_name`: demo + 5 more replayed ZeroEval models, the re-collection "
             "schedule's pool), run end to end with an override file holding `pool: {name: demo_wide}`:", "",
             "```bash", "printf 'pool: {name: demo_wide}\\n' > demo_wide.yaml",
             "router-lite run --override demo_wide.yaml", "```", "",
             "An agent that breaks a collection quality rule on a source is quarantined: left out of the reward "
             "matrix, the routers and the reports, with its reason (docs/operations.md, \"Quarantine\").", ""]
    q = rv.get("quarantined") or {}
    lines += (["Quarantined on this run:", ""] + [f"- `{a}`: {why}" for a, why in q.items()] + [""]) if q else \
        ["No agent was quarantined on this run.", ""]
    for a, why in (rv.get("cost_lower_bound") or {}).items():
        lines += [f"The estimated cost of `{a}` is a {why}; its figures below are lower bounds.", ""]
    lines += ["## Value", "", render_value(rv, WIDE_COPY).rstrip("\n")]
    return "\n".join(lines).rstrip("\n") + "\n"


def n_sources() -> str:
    from pipeline.tasks.sources import SOURCES

    return str(len(SOURCES))


FIELDS = {"value": lambda root: render_value(json.loads((root / COPY).read_text())).rstrip("\n"),
          "n_sources": lambda root: n_sources()}


def render_readme(root: Path = ROOT) -> str:
    """The template without its leading comment, every `{{name}}` filled, and the generated-file note."""
    text = (root / TEMPLATE).read_text()
    if text.startswith("<!--"):
        text = text.split("-->", 1)[1].lstrip("\n")
    unknown = sorted(set(FIELD.findall(text)) - set(FIELDS))
    if unknown:
        raise SystemExit(f"{TEMPLATE}: unknown field(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}")
    values = {name: make(root) for name, make in FIELDS.items() if "{{" + name + "}}" in text}
    return FIELD.sub(lambda m: values[m.group(1)], text).rstrip("\n") + "\n\n" + GENERATED_NOTE


# --- generated blocks inside hand-written pages -------------------------------------------------------------------
def train_config_table() -> str:
    from pipeline.core.config import option_table
    from pipeline.route.train import TrainConfig

    def cell(s: str) -> str:
        return s.replace("``", "`").replace("|", "\\|")

    rows = ["| option | default | meaning |", "|---|---|---|"]
    rows += [f"| `{name}` | {cell(default)} | {cell(meaning)} |"
             for name, default, meaning in option_table(TrainConfig)]
    return "\n".join(rows) + "\n"


def replace_block(text: str, begin: str, end: str, body: str, where: str) -> str:
    """`text` with the lines between the line starting with `begin` and the line `end` replaced by `body`."""
    try:
        head, rest = text.split(begin, 1)
        marker, rest = rest.split("\n", 1)
        _, tail = rest.split(end, 1)
    except ValueError:
        raise SystemExit(f"{where} lacks the markers {begin} ... {end}") from None
    return f"{head}{begin}{marker}\n{body}{end}{tail}"


def outputs(root: Path = ROOT) -> dict[Path, str]:
    """Every generated file (path relative to the repository) with the text it must have."""
    training = replace_block((root / TRAINING).read_text(), TRAIN_BEGIN, TRAIN_END, train_config_table(),
                             str(TRAINING))
    out = {README: render_readme(root), TRAINING: training}
    if (root / WIDE_COPY).exists():
        out[WIDE_PAGE] = render_wide(json.loads((root / WIDE_COPY).read_text()))
    return out


def differences(expected: dict[Path, str], root: Path = ROOT) -> str:
    """A unified diff (committed -> generated) of every file under `root` that differs; "" when none does."""
    out = []
    for rel, text in expected.items():
        path = root / rel
        old = path.read_text() if path.exists() else ""
        if old != text:
            out += difflib.unified_diff(old.splitlines(keepends=True), text.splitlines(keepends=True),
                                        f"{rel} (committed)", f"{rel} (make docs)")
    return "".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-home", action="store_true",
                    help="copy $ROUTER_LITE_HOME/reports/router_value.json to the committed copy first")
    ap.add_argument("--wide", action="store_true",
                    help="with --from-home: the home holds a demo_wide run; copy it to the wider pool's copy "
                         "(docs/wide_pool.md)")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 with a diff when a generated file differs from the output")
    args = ap.parse_args(argv)
    if args.from_home:
        home = Path(os.environ.get("ROUTER_LITE_HOME", ROOT / ".router-lite"))
        if args.wide:
            rv = json.loads((home / "reports" / "router_value.json").read_text())
            rep = json.loads((home / "reports" / "pool_report.json").read_text())
            rv.update(pool=rv.get("pool") or "demo_wide", quarantined=rep.get("quarantined") or {},
                      cost_lower_bound=rep.get("cost_lower_bound") or {})
            (ROOT / WIDE_COPY).write_text(json.dumps(rv, indent=1) + "\n")
        else:
            shutil.copyfile(home / "reports" / "router_value.json", ROOT / COPY)
    expected = outputs()
    if args.check:
        diff = differences(expected)
        if diff:
            sys.stderr.write(diff + "\nnot the generator's output: run `make docs` (python scripts/readme.py)\n")
            return 1
        return 0
    for rel, text in expected.items():
        if not (ROOT / rel).exists() or (ROOT / rel).read_text() != text:
            (ROOT / rel).write_text(text)
            print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
