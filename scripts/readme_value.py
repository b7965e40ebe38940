"""The README's value section, generated from `reports/router_value.json` (never typed by hand).

    python scripts/readme_value.py --from-home      # copy $ROUTER_LITE_HOME/reports/router_value.json to
                                                    # docs/results/router_value_demo.json, then rewrite the README
    python scripts/readme_value.py                  # rewrite the README from the committed copy
    python scripts/readme_value.py --check          # exit 1 when the README differs (tests/test_readme.py)

The section lies between the markers `<!-- value:begin -->` and `<!-- value:end -->`.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.report.value import ROUTER_LABELS, ablation_markdown  # noqa: E402

COPY = ROOT / "docs" / "results" / "router_value_demo.json"
BEGIN, END = "<!-- value:begin -->", "<!-- value:end -->"
GOAL = ("quality>=0.98", 0.98, 0.55)  # the goal: >= 98 % of the best single agent's quality at <= 55 % cost


def render(rv: dict) -> str:
    bs = rv["best_single"]
    best = rv["routers"][rv["best_router"]]
    head = rv["routers"]["head"]
    a = rv["aiq"]
    lines = [f"Profile `{rv['profile']}`, held-out test n={rv['n_test']}, costs estimated (chars/4 × list prices). "
             f"Generated from `reports/router_value.json` by `scripts/readme_value.py`.", "",
             f"**Pool verdict: {rv['pool_verdict']}**", "",
             ablation_markdown(rv)]
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
                      f"{rb['accuracy']:.4f} at {rb['cost_ratio']:.0%} of the best single agent's cost, "
                      f"{rb['calls_per_query']:.2f} calls per query.", ""]
        lines += [f"The goal of ≥ {frac:.0%} of the best single agent's quality at ≤ {cap:.0%} of its cost is "
                  + ("**met**." if met else "**not met** on this pool (docs/training.md, \"Cascades\", says why "
                                              "and how it was measured)."), ""]
    return "\n".join(lines).rstrip() + "\n"


def rewrite(readme: str, section: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"README.md lacks the markers {BEGIN} / {END}")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{section}{END}{tail}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-home", action="store_true", help="copy the latest router_value.json first")
    ap.add_argument("--check", action="store_true", help="exit 1 when README.md is not the generator's output")
    args = ap.parse_args(argv)
    if args.from_home:
        home = Path(os.environ.get("ROUTER_LITE_HOME", ROOT / ".router-lite"))
        shutil.copyfile(home / "reports" / "router_value.json", COPY)
    readme = ROOT / "README.md"
    new = rewrite(readme.read_text(), render(json.loads(COPY.read_text())))
    if args.check:
        if new != readme.read_text():
            print("README.md's value section differs from scripts/readme_value.py's output", file=sys.stderr)
            return 1
        return 0
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
