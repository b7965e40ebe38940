"""What `router-lite run` prints at the end: counts, tables, and where the reports are."""
import json
import os
from pathlib import Path

from cli import lineage


def _table(counts: dict) -> str:
    return "  ".join(f"{k}={v}" for k, v in counts.items())


def star_headline(root: Path) -> str | None:
    """The ★ router (registry/latest.json: the router promoted, by the `promotion` asset's gate or by hand) in two
    lines: its kind and name, and what it gives at the serving target on the held-out test split and on
    validation."""
    from pipeline.route.registry import latest_entry

    entry = latest_entry(root / "registry")
    star = (entry or {}).get("star")
    if not star:
        return None
    held, val = star.get("held_out") or {}, star["validation"]
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    aiq = "" if star.get("aiq_validation") is None else f"; validation AIQ {star['aiq_validation']:.4f}"
    return (f"★ Router (promoted by {entry.get('promoted_by') or 'the run'}{aiq}): {star['label']} — {star['kind']} "
            f"{entry['name']}\n"
            f"  at {star['target']}: {pct(held.get('quality_ratio'))} of the best single agent's quality at "
            f"{pct(held.get('cost_ratio'))} of its cost on held-out test (validation: {pct(val['quality_ratio'])} at "
            f"{pct(val['cost_ratio'])})")


def promotion_lines(out: dict | None) -> list[str]:
    """This run's promotion (the `promotion` asset's output): what the gate did with the candidate, the router it
    replaced or would have replaced, and why (the benchmark rows and the traffic rows, a line each)."""
    if not out:
        return []
    v = out.get("verdict") or {}
    replaces = v.get("replaces") or "nothing (none promoted yet)"
    head = {"promoted": f"Promotion: {out['candidate']} promoted, replacing {replaces}",
            "refused": f"Promotion: {out['candidate']} refused by the gate; {out.get('served')} stays served",
            "kept": f"Promotion: {out['candidate']} is already the served router"}.get(
        out.get("action"), f"Promotion: {out.get('action')} {out.get('candidate')}")
    if t := v.get("traffic"):  # each kind of evidence on a line
        lines = [head, f"  gate, benchmark rows ({v.get('mode')}): {v.get('benchmark_reason')}",
                 f"  gate, traffic rows: {t.get('reason')}"]
    else:
        lines = [head, f"  gate ({v.get('mode')}): {v.get('reason')}"]
    if out.get("action") == "refused":
        lines.append(f"  `router-lite promote {out['candidate']} --force` serves it anyway; "
                     "`router-lite promotions` lists the history")
    return lines


def cli_command(exe_dir: Path | None = None, cwd: Path | None = None, which=None) -> tuple[str, str | None]:
    """(how to type `router-lite` in a fresh shell, the line that makes the plain name work or None): the plain name
    when the shell's PATH finds this install's script, else its path (relative to the working directory when it lies
    below it: `.venv/bin/router-lite` after `make run`), with the venv's activate line."""
    import shutil
    import sys

    exe_dir = Path(exe_dir or Path(sys.executable).parent)
    script, cwd = exe_dir / "router-lite", Path(cwd or Path.cwd())
    found = (which or shutil.which)("router-lite")
    if found and Path(found).resolve() == script.resolve():
        return "router-lite", None
    if not script.exists():  # not installed as a script (python -m cli.main): the module
        return f"{sys.executable} -m cli.main", None
    shown = Path(os.path.relpath(script, cwd)) if script.absolute().is_relative_to(cwd.absolute()) else script
    activate = shown.parent / "activate"
    return str(shown), (f"source {activate}" if (exe_dir / "activate").exists() else None)


def what_next(profile: str, command: tuple[str, str | None] | None = None) -> str:
    """The printout's last lines: serve the ★ router (the command as a fresh shell finds it: `cli_command`), look at
    the run in the UI, go on to your own pool/data."""
    flag = "" if profile == "demo" else f" --profile {profile}"
    exe, activate = command or cli_command()
    hint = f"    # or `{activate}` first, then `router-lite serve{flag}`" if activate else ""
    return ("\nWhat next:\n"
            f"  {exe} serve{flag}    # the ★ router above as an OpenAI-compatible endpoint (docs/serving.md)\n"
            + (f"  {hint.strip()}\n" if hint else "")
            + "  make ui    # the asset graph, its checks and these reports in the Dagster UI on http://127.0.0.1:3000\n"
            "  docs/tutorial.md    # your own agents (an override file), your own data (router-lite train), serving")


def print_summary(defs, assets: list[str]) -> None:
    """What the run left in the lineage of `defs` (its assets read through their IO managers); `assets`: the run's
    assets in stage order (whose reports are printed); the ★ router first."""
    root = defs.resources["storage"].root()
    headline = star_headline(root)
    if headline:
        print("\n" + headline)
    said = promotion_lines(lineage.load("promotion", defs=defs, default=None)) if "promotion" in assets else []
    if said:
        print("\n".join(said))
    _print_verdict(root)
    pool = lineage.load("task_pool", defs=defs, default=None)
    if pool is not None:
        from pipeline.tasks.task_pool import pool_counts

        print(f"\nTask pool: {len(pool)} tasks ({int(pool['ood'].sum())} out-of-distribution)")
        for col, counts in pool_counts(pool).items():
            print(f"  by {col:<10} {_table(counts)}")
        print(f"  tasks dataset: {root / 'datasets' / 'tasks'}")
    head = lineage.load("router_head", defs=defs, default=None)
    if head is not None:
        summary = head.summary
        m, gate = summary["metrics"], summary["extra"].get("gate", {})
        print(f"\nRouter head (held-out test n={m['n_test']}): head {m['head']:.4f} | best single "
              f"{m['best_single']:.4f} | kNN {m['knn']:.4f} | random {m['random']:.4f} | oracle {m['oracle']:.4f}"
              f" | shipped: {gate.get('shipped', 'head')}")
        ci = summary["extra"].get("head_gain_ci")
        if ci:
            print(f"  head − best single {ci['gain']:+.4f}, 95% paired bootstrap CI [{ci['low']:+.4f}, "
                  f"{ci['high']:+.4f}] (docs/training.md: how much of the headroom is routable)")
        value = summary.get("value")
        if value:  # the head's table only: the one headline is the ★ router's, printed first
            from pipeline.report.value import targets_markdown

            basis = {True: "costs estimated, ", False: "costs as reported by the provider, "}.get(
                value.get("costs_estimated"), "")
            print(f"\nThe prompt-only head's operating points on held-out test ({basis}USD per 1k queries):\n\n"
                  f"{targets_markdown(value)}")
    rv_file = root / "reports" / "router_value.json"
    if rv_file.exists():
        from pipeline.report.value import ablation_markdown

        rv = json.loads(rv_file.read_text())
        if rv.get("routers"):
            print("\nRouter kinds on held-out test (prompt-only / cascade / combined):\n\n" + ablation_markdown(rv))
    for key in assets:  # every report asset's Markdown, `reports/<asset>.md` (docs/architecture.md: add a report)
        f = root / "reports" / f"{key}.md"
        if f.exists():
            print(f"\n{f.read_text()}")
    if (root / "reports").exists():
        print(f"\nReports: {root / 'reports'}")



def _print_verdict(root: Path) -> None:
    """Which case the pool is in (pipeline/report/pool_report.py), and the agents a quality rule left out."""
    verdict_file = root / "reports" / "pool_report.json"
    if verdict_file.exists():  # first: which case the pool is in (pipeline/report/pool_report.py)
        from pipeline.report.pool_report import WARNING

        rep = json.loads(verdict_file.read_text())
        v = rep["verdict"]
        print(f"\nPool verdict: {v['text']}" + (f" — {WARNING}" if v["kind"] == "quality-dominated" else ""))
        for agent, why in (rep.get("quarantined") or {}).items():  # left out by a collection quality rule
            print(f"  quarantined: {agent} ({why})")
        for agent, why in (rep.get("cost_lower_bound") or {}).items():
            print(f"  cost of {agent}: {why}")
