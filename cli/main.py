"""The `router-lite` command line: what people do outside the Dagster UI.

Each subcommand imports only what it needs, so `router-lite route` does not pay for importing Dagster.
"""
import argparse
import json
import logging
import os
import sys

from cli.options import use_override
from pipeline.core.environ import environ
from pipeline.core.errors import RouterLiteError, debug_enabled, one_line

TARGET_HELP = ("operating point: max-quality (default), parity, quality>=F (fraction of the best single agent's "
               "quality), budget=USD per 1k queries, lambda=L")
DEFAULT_FOLLOW_INTERVAL_S = 2.0  # `serve` checks the registry pointer this often (pipeline/serve/follow.py)
DEFAULT_WORKERS = 2  # `serve` processes: on 2 cores, 2 gave ~1.4x the cold requests/s of 1 at the same p99
DEVICE_HELP = "where the backbone runs: auto (cuda when present, else cpu), cpu, cuda or cuda:N (default: auto)"
BACKBONE_HELP = ("embedding model: a hub id or local dir (sentence-transformers / transformers), `static` (Model2Vec "
                 "distilled from the bundled MiniLM, built once under $ROUTER_LITE_HOME/backbones) or a static model "
                 "dir (docs/backbones.md)")


def profile_with_backbone(profile, backbone: str | None):
    """`profile` with `backbone.model` replaced (`run --backbone`), or as it is when None."""
    if not backbone:
        return profile
    import dataclasses

    return dataclasses.replace(profile, backbone=dataclasses.replace(profile.backbone, model=backbone))


def cmd_run(args) -> int:
    if args.profile:
        os.environ["ROUTER_LITE_PROFILE"] = args.profile
    use_override(args)
    config = {}  # run config per asset, for the runs of the stages that hold it
    if args.target:
        from pipeline.route.targets import parse_target

        config["benchmark_report"] = {"target": parse_target(args.target).name}  # the routed benchmark's point
    if args.wait_for_collection or args.quarantine_bad_log_lines:
        config["graded_calls"] = {"wait_for_collection": "true" if args.wait_for_collection else "",
                                  "quarantine_bad_log_lines": bool(args.quarantine_bad_log_lines)}
    if args.max_usd is not None:  # the collection's budget for this run (pipeline/collect/budget.py)
        from pipeline.collect.budget import check_max_usd

        config.setdefault("graded_calls", {})["max_usd"] = check_max_usd(args.max_usd, "--max-usd")
    from pathlib import Path

    from assets.definitions import build_definitions
    from cli.run import PLANNED_STOP_EXIT, Interrupted, PlannedStop, calls_logged, run_lineage, stages_of
    from cli.summary import print_summary, star_headline, what_next
    from pipeline.profile import load_profile
    from resources.storage import home_of

    profile = load_profile(args.profile)  # read once: the definitions and the run take the typed profile
    profile = profile_with_backbone(profile, args.backbone)
    defs = build_definitions(profile=profile)
    try:
        times = run_lineage(defs, profile, args.upto, log=lambda m: print(m, file=sys.stderr, flush=True),
                            asset_config=config)
    except PlannedStop as stop:  # not an error: one line naming who may join and the next step; exit 3 (run again)
        print(f"router-lite: {stop}", file=sys.stderr, flush=True)
        return PLANNED_STOP_EXIT
    except (Interrupted, KeyboardInterrupt):  # Ctrl-C: one line, the shell's code for SIGINT (128 + 2)
        print(f"router-lite: interrupted; rerun resumes: {calls_logged(defs.resources['storage']):,} calls logged",
              file=sys.stderr, flush=True)
        return 130
    home = str(home_of(profile))  # this profile's lineage: the home's root, or profiles/<name> beside another's
    print_summary(defs, [k for _, keys, _ in stages_of(defs, args.upto) for k in keys])
    print_stage_times(times, home)
    if star_headline(Path(home).resolve()):  # a run that reached the ★ router: three lines of what next
        print(what_next(profile.name))
    return 0


def print_stage_times(times: dict, home: str) -> None:
    """Wall seconds per stage and per asset step (summed over partitions); also reports/stage_times.json."""
    from pathlib import Path

    from pipeline.core.io import atomic_write_json

    print(f"\nStage times (wall, s; total {times.get('total_s', 0):.1f}):")
    width = max([14, *map(len, times.get("stages", {}))])
    for stage, s in times.get("stages", {}).items():
        print(f"  {stage:<{width}} {s:>7.1f}")
    steps = sorted(times.get("steps", {}).items(), key=lambda kv: -kv[1])
    if steps:
        print("  slowest steps: " + ", ".join(f"{k} {v:.1f}" for k, v in steps[:6]))
    out = Path(home) / "reports" / "stage_times.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(times, out)


def cmd_train(args) -> int:
    """Train + register a head from a user's own reward matrix and tasks (contracts in docs/architecture.md); never
    silent for more than a few seconds (`heartbeat`)."""
    from pipeline.core.progress import heartbeat

    with heartbeat("router-lite train", logging.getLogger("pipeline.train")):
        return _train(args)


def _train(args) -> int:
    from pathlib import Path

    from pipeline.core.prompts import task_texts
    from pipeline.embed.backbone import Backbone, EmbeddingCache
    from pipeline.route import registry
    from pipeline.route.fit import fit_router
    from pipeline.route.train import TrainConfig
    from pipeline.route.validate import train_inputs
    from resources.backbone import resolve_device
    from resources.storage import default_home

    # every input problem is one error naming file, row and field, before anything is embedded or written
    rewards, _, joined = train_inputs(args.rewards, args.tasks, args.held_out_split)
    out = Path(args.out or Path(default_home()) / "registry")
    cfg = TrainConfig(**{name: getattr(args, name) for name in TRAIN_OPTIONS})
    cfg.validate()  # a bad setting fails before minutes of embedding
    bb = Backbone(args.backbone, pooling=args.pooling, device=resolve_device(args.device),
                  max_seq_length=args.max_seq_length)
    X = EmbeddingCache(Path(default_home()) / "embeddings").get_or_compute(task_texts(joined), bb)
    from pipeline.collect.rewards import costs_are_estimated, to_arrays
    from pipeline.report.pool_report import domain_column, labels_of, pool_report, report_markdown
    from pipeline.report.value import prompt_routers_markdown, targets_markdown, value_line
    from pipeline.route.targets import path_table

    col = domain_column(joined)
    labels = labels_of(joined, col)
    agents, R, _, C = to_arrays(rewards)
    split = joined["split"].fillna("").astype(str).to_numpy(dtype=object)
    rep = pool_report(R, C, agents, labels, split, X=X,
                      difficulty=labels_of(joined, "difficulty") if "difficulty" in joined else None, domain_name=col)
    rep["costs_estimated"] = costs_are_estimated(rewards)
    print("## Pool report\n\n" + report_markdown(rep), file=sys.stderr)
    fit = fit_router(X, rewards, joined["split"], cfg, held_out=args.held_out_split, labels=labels)
    import pandas as pd

    print(f"## Operating points (chosen by {fit.operating_points['selection']['method']})\n\n"
          + pd.DataFrame(path_table(fit.operating_points)).to_markdown(index=False, floatfmt=".4f")
          + f"\n\n## Held-out value (split {args.held_out_split!r})\n\n" + targets_markdown(fit.value)
          + "\n" + value_line(fit.value, "parity") + "\n\n## Prompt routers (chosen on validation)\n\n"
          + prompt_routers_markdown(fit.extra["kinds"], fit.extra["shipped"]), file=sys.stderr)
    path = registry.register_fitted(out, fit.head, fit.to_fitted(), backbone=bb.manifest_fields(X.shape[1]),
                                    training=cfg.to_dict(), data_hashes=_file_hashes(args), metrics=fit.metrics)
    print(f"registered {path.name} at {path}", file=sys.stderr)
    cascade = _train_cascade(args, rewards, joined, X, fit, bb, out) if "answers" in rewards and \
        "grader" in joined else None
    arena = _train_arena(fit, X, rewards, joined["split"], args.held_out_split)
    print(json.dumps({**fit.metrics, "pool_verdict": rep["verdict"]["text"],
                      "targets": {k: {f: v[f] for f in ("quality", "cost_per_1k", "cost_ratio", "lambda")}
                                  for k, v in fit.value["targets"].items()},
                      "shipped": fit.extra["shipped"], "operating_points": fit.operating_points.get("selection"),
                      "prompt_routers": {k: {f: v[f] for f in ("validation", "test")}
                                         for k, v in fit.extra["kinds"].items()},
                      "registered": str(path), **({"cascade": cascade} if cascade else {}),
                      "router_arena": arena}, default=float))
    return 0


def _train_arena(fit, X, rewards, split, held_out: str) -> dict:
    """RouterArena's optimality figures of the fitted prompt routers on the held-out rows (`fit_optimality`)."""
    from pipeline.report.value import fit_optimality
    from pipeline.route.fit import reward_arrays
    from pipeline.route.value import agent_costs

    a = reward_arrays(rewards, split, held_out)
    te = a.masks["held_out"]
    return fit_optimality(fit, X[te], a.R_eff[te], a.C[te], agent_costs(a.C[a.masks["train"]]))


def _file_hashes(args) -> dict:
    """The data versions of `train`'s input files (content hashes)."""
    from pathlib import Path

    from pipeline.route.registry import content_hash

    return {"rewards": content_hash(Path(args.rewards).read_bytes())[:16],
            "tasks": content_hash(Path(args.tasks).read_bytes())[:16]}


def _train_cascade(args, rewards, joined, X, fit, bb, out) -> dict:
    """Cascades from the rewards' `answers` and the tasks' `grader` (zero API calls), reported like the head's
    targets and registered as a `cascade` router next to the head."""
    import pandas as pd

    from pipeline.collect.answers import Agreement
    from pipeline.report.value import targets_markdown
    from pipeline.route import registry
    from pipeline.route.cascade_fit import fit_cascade_router, selection_of
    from pipeline.route.fit import reward_arrays

    arrays = reward_arrays(rewards, joined["split"], args.held_out_split)
    agents, R, C, masks = arrays.agents, arrays.R, arrays.C, arrays.masks
    agreement = Agreement([list(a) for a in rewards["answers"]], joined["grader"].tolist(),
                          budget=_grading_budget(args.grading_budget_ms))
    router, res = fit_cascade_router(arrays, agreement, X, fit.head, fit.scorer, fit.best_single,
                                     selection=selection_of({n: getattr(args, n) for n in TRAIN_OPTIONS}))
    bs = {"agent": agents[fit.best_single], "quality": float(R[masks["held_out"], fit.best_single].mean()),
          "cost_per_1k": float(1000 * C[masks["held_out"], fit.best_single].mean())}
    for variant, v in res.variants.items():
        table = {"targets": v.targets, "best_single": bs, "oracle": fit.value["oracle"], "weak": "n/a",
                 "apgr": None, "cpt50": None, "cpt80": None, "n_test": int(masks["held_out"].sum()),
                 "costs_estimated": fit.value.get("costs_estimated")}
        print(f"## Cascade ({variant}; validation AIQ {v.aiq_validation:.4f}, test AIQ {v.aiq_test:.4f})\n\n"
              + targets_markdown(table) + "\n"
              + pd.DataFrame([{"target": k, "plan": t["plan"]} for k, t in v.targets.items()]).to_markdown(
                  index=False), file=sys.stderr)
    path = registry.register_fitted(out, router, fit.to_fitted(), backbone=bb.manifest_fields(X.shape[1]),
                                    training={"variant": res.chosen, "selection": res.selection},
                                    data_hashes=_file_hashes(args),
                                    metrics={k: v.aiq_validation for k, v in res.variants.items()})
    print(f"registered {path.name} at {path}", file=sys.stderr)
    return {"chosen": res.chosen, "registered": str(path), "selection": res.selection,
            "aiq": {k: {"validation": v.aiq_validation, "test": v.aiq_test} for k, v in res.variants.items()},
            "targets": {k: {f: t[f] for f in ("quality", "cost_per_1k", "cost_ratio", "quality_ratio", "plan")}
                        for k, t in res.best.targets.items()}}


def _head_backbone(reg, device: str, dtype: str = "auto", threads: int | None = None):
    """The backbone a registered head was trained on, as its manifest names it."""
    from pathlib import Path

    from pipeline.embed.backbone import Backbone, Runtime
    from resources.backbone import resolve_device

    bb = reg.manifest["backbone"]
    model = bb["id"]
    if bb.get("kind") == "static" and bb.get("path") and Path(bb["path"]).is_dir():
        model = bb["path"]  # the files it was trained on (the alias would distil them again under another home)
    return Backbone(model, pooling=bb.get("pooling", "mean"), device=resolve_device(device), dtype=dtype,
                    max_seq_length=int(bb.get("max_seq_length", 256)), runtime=Runtime(threads=threads))


def cmd_route(args) -> int:
    from pipeline.core.prompts import routed_text
    from pipeline.core.text_guard import bad_text
    from pipeline.route import registry

    for i, p in enumerate(args.prompt, 1):  # before loading anything: the tokenizer would raise a traceback
        if bad_text(p):
            raise RouterLiteError(f"prompt {i} ({p[:40]!r}) is not valid text: {bad_text(p)}")
    reg = registry.load(args.head)
    point = reg.resolve_target(args.target)  # a bad target fails before the backbone loads
    if args.grader is not None and not reg.needs_grader:
        raise RouterLiteError(f"--grader applies to cascade routers; {reg.name} is a {reg.kind}")
    if reg.needs_grader:
        return _route_cascade(reg, args)
    picks, fired = reg.route_at(_head_backbone(reg, args.device).encode([routed_text([p]) for p in args.prompt]), point)
    print(f"target {point['target']} (lambda {point['lambda']:.4g})", file=sys.stderr)
    for p, f in zip(picks, fired):
        agent = reg.agents[int(p)]
        print(f"{agent['name']}\t{agent['model']}" + ("\t(ood guard: best single)" if f else ""))
    return 0


def _route_cascade(reg, args) -> int:
    """`route` for a cascade: the plan at the target, and per prompt what happens first."""
    from pipeline.core.prompts import routed_text

    cpoint = reg.router.resolve(args.target)
    plan = reg.router.plan(args.target)
    names = [a["name"] for a in reg.agents]
    print(f"cascade {reg.name}, target {cpoint['target']} (validation: quality {cpoint['quality']:.4f}, "
          f"{cpoint['cost_per_1k']:.3f} USD per 1k)", file=sys.stderr)
    if args.grader is None:
        for g, pol in plan.by_grader:
            print(f"plan[{g}]\t{pol.describe(names)}")
        print(f"plan[other formats]\t{plan.default.describe(names)}")
        point = reg.resolve_target(args.target)
        X = _head_backbone(reg, args.device).encode([routed_text([p]) for p in args.prompt])
        picks, fired = reg.route_at(X, point)
        for p, f in zip(picks, fired):
            agent = reg.agents[int(p)]
            print(f"prompt-only\t{agent['name']}\t{agent['model']}" + ("\t(ood guard: best single)" if f else ""))
        return 0
    view = reg.cascade_at(args.target, args.grader)
    print(f"plan[{args.grader}]\t{view.policy.describe(names)}")
    picks, fired = view.route(_head_backbone(reg, args.device).encode([routed_text([p]) for p in args.prompt]))
    for p, f in zip(picks, fired):
        if p < 0:
            first = view.policy.stages[0].agents
            print("stages\tfirst ask " + " + ".join(names[j] for j in first))
        else:
            why = "ood guard: best single" if f else "prompt shortcut"
            print(f"alone\t{names[int(p)]}\t{reg.agents[int(p)]['model']}\t({why})")
    return 0


def cmd_regrade(args) -> int:
    """Recompute extraction and correctness of every stored call from its stored completion: zero API calls."""
    from cli import lineage
    from pipeline.collect.regrade import regrade
    from resources.storage import default_home, root_owner

    defs = lineage.definitions(root_owner(default_home()))  # the lineage at the home's root, as `run` left it
    pool = lineage.load("task_pool", defs=defs)
    changed = total = 0
    budget = _grading_budget(args.grading_budget_ms)
    for pk in lineage.partitions(defs, "graded_calls"):  # every partition, read and written by its IO manager
        calls = lineage.load("graded_calls", partition=pk, defs=defs, default=None)
        if calls is None:
            continue
        calls, n = regrade(calls, pool, budget)
        lineage.store(defs, "graded_calls", calls, pk)
        changed, total = changed + n, total + int((calls["status"] != "error").sum())
    print(json.dumps({"regraded": total, "changed": changed}))
    print("re-materialise reward_matrix and downstream assets (Dagster job refresh_downstream) to use the new grades",
          file=sys.stderr)
    return 0


def cmd_replicate(args) -> int:
    from pathlib import Path

    from pipeline.embed.backbone import Backbone, EmbeddingCache
    from pipeline.report.replication import replicate, table_markdown
    from pipeline.report.suites import build_suite
    from resources.backbone import resolve_device
    from resources.storage import default_home

    if args.suite != "routerbench":
        raise RouterLiteError(f"`router-lite replicate` builds the bundled suite 'routerbench'; suite {args.suite!r} "
                              "needs the pipeline's reward matrix: materialise routerbench_replication in Dagster")
    suite = build_suite(args.suite)
    bb = Backbone(args.backbone, device=resolve_device(args.device), max_seq_length=args.max_seq_length)
    X = EmbeddingCache(Path(default_home()) / "embeddings").get_or_compute(suite.query_text, bb)
    table, _ = replicate(suite, X)
    print(table_markdown(args.suite, table))
    return 0


def cmd_publish(args) -> int:
    """Push the tasks and rewards datasets and a registered router to the Hub (`--dry-run`: list the commits); the
    router: `--head`, else the ★ router of the latest run (registry/latest.json; the head beside it is named)."""
    from pathlib import Path

    from pipeline.report.hub_release import build_release, check_repo_id, latest_head
    from pipeline.route.registry import latest_entry
    from resources.hub import HF_TOKEN_ENV, push_release, require_token
    from resources.storage import StorageResource, default_home

    check_repo_id(args.repo_id)
    token = os.environ.get(HF_TOKEN_ENV) or None
    if not args.dry_run:  # before any work: the one thing the user has to provide
        require_token(token)
    storage = StorageResource(home=default_home())
    router_dir = args.head or latest_head(storage.root() / "registry")
    entry = None if args.head else latest_entry(storage.root() / "registry")
    star = (entry or {}).get("star")
    releases = build_release(args.repo_id, storage.root() / "datasets", router_dir)
    if entry:
        print(f"router: {entry['name']}" + (f" (the ★ router: {star['label']}, promoted by "
                                            f"{entry.get('promoted_by')})" if star else "")
              + f"; the head beside it: {entry['head']['name']}", file=sys.stderr)
    plan = [r.describe() for r in releases]
    for r in plan:
        print(f"{r['repo_type']} {r['repo_id']}: create_repo(exist_ok=True), create_commit with "
              f"{len(r['operations'])} operations", file=sys.stderr)
        for o in r["operations"]:
            print(f"  CommitOperationAdd(path_in_repo={o['path_in_repo']!r})  {o['bytes']} bytes", file=sys.stderr)
    urls = [] if args.dry_run else push_release(releases, token)
    print(json.dumps({"dry_run": args.dry_run, "router": entry["name"] if entry else Path(router_dir).name,
                      "star": (star or {}).get("router"), "head": entry["head"]["name"] if entry else None,
                      "repos": plan, "commits": urls}))
    return 0


def _registry_of(args):
    """(the profile, its registry folder) for `promote` / `rollback`."""
    from pipeline.profile import load_profile
    from resources.storage import home_of

    use_override(args)
    profile = load_profile(args.profile)
    return profile, home_of(profile) / "registry"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cmd_promote(args) -> int:
    """Serve the registered router NAME (registry/<NAME>) from now on when the promotion gate passes it (or cannot
    judge it; `--force`: past its refusal); `--check`: the gate's verdict only. Recorded in
    registry/promotions.jsonl."""
    from pipeline.core.progress import heartbeat

    profile, root = _registry_of(args)
    _say(f"promote: judging {args.name} at {profile.serve.target} against the served router ({root})")
    with heartbeat(f"promote {args.name}", _say):
        from pipeline.report.promotion import judge_named, promote_named, verdict_lines

        _, _, verdict = judge_named(root, args.name, profile.serve.target)
        print("\n".join(verdict_lines(verdict)), flush=True)
        if args.check:  # a dry run: 0 when the gate would promote, 1 when it would refuse
            return 1 if verdict["passed"] is False else 0
        line, _ = promote_named(root, args.name, profile.serve.target, force=args.force)
    if line.get("repaired"):
        _say(f"promote: {line['repaired']}")
    print(f"promoted {line['name']} ({line['kind']}, target {line['target']}; {line['reason']}); replaced: "
          f"{(line['previous'] or {}).get('name', 'none')}")
    return 0


def cmd_rollback(args) -> int:
    """Serve the router promoted before the served one again; recorded in registry/promotions.jsonl."""
    from pipeline.core.progress import heartbeat
    from pipeline.route import pointer

    profile, root = _registry_of(args)
    pointer.latest_entry(root)  # a malformed pointer: its one error line before any progress line
    _say(f"rollback: returning to the router promoted before the served one ({root})")
    with heartbeat("rollback", _say):
        from pipeline.report.promotion import rollback

        line = rollback(root, profile.serve.target)
    if line.get("repaired"):
        _say(f"rollback: {line['repaired']}")
    print(f"rolled back to {line['name']} ({line['kind']}, target {line['target']}); before: "
          f"{(line['previous'] or {}).get('name', 'none')}")
    return 0


def cmd_promotions(args) -> int:
    """The promotion history (registry/promotions.jsonl), newest last, the served router marked ★; `--repair` sets
    junk lines aside first (kept verbatim in promotions.invalid.jsonl)."""
    from pipeline.route import pointer

    _, root = _registry_of(args)
    if args.repair:
        _say(pointer.repair_history(root) or f"promotions: {root / pointer.HISTORY} has no junk line")
    records = pointer.history(root)  # a junk line: one error naming it and --repair
    try:
        served = (pointer.read_latest(root) or {}).get("name")
    except RouterLiteError:
        served = None
    if args.json:
        print(json.dumps({"served": served, "history": records[-args.last:] if args.last else records}))
        return 0
    if not records:
        print(f"no promotion recorded in {root / pointer.HISTORY}")
        return 0
    shown = records[-args.last:] if args.last else records
    if len(shown) < len(records):
        print(f"(the last {len(shown)} of {len(records)}; --last 0 shows all)")
    stack = pointer.served_stack(records)
    standing = stack[-1] if stack and stack[-1].get("name") == served else None  # the line that serves now
    for r in shown:
        v = r.get("verdict") or {}
        gate = {True: "gate passed", False: "gate refused", None: "gate not judged"}.get(v.get("passed"), "") \
            if v else ""
        star = " ★" if r is standing else ""
        print(f"{r.get('at', '?')}  {r.get('action', '?'):<11} by {r.get('by', '?'):<8} {r.get('name')}{star} "
              f"({r.get('kind')}, {r.get('target')}); replaced: {(r.get('previous') or {}).get('name', 'none')}"
              + (f"; {gate}" if gate else "") + (f": {r['reason']}" if r.get("reason") else ""))
    print(f"served now: {served or 'none'}")
    return 0


def cmd_serve(args) -> int:
    """OpenAI-compatible router endpoint (pipeline/serve/app.py) over a profile's pool: the ★ router of the profile's
    latest run (registry/latest.json) at the profile's `serve.target`, or the router of `--head` / `--target`."""
    # torch's OpenMP threads spin-wait by default: next to the event loop (or other processes) on a small CPU that
    # multiplies embedding latency (measured 2 cores, loaded: 1.4 s vs 67 ms per prompt). Set before torch loads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from pipeline.serve.server import KeysOnHangup, bind_listener

    _check_serve_args(args)
    _take_stop_signals()
    hangup = KeysOnHangup().install()  # SIGHUP re-reads the keys (--workers N: the supervisor's, then every worker's)
    served = _serve_setup(args)  # every check: a bad input fails before anything listens or loads
    hangup.attach(served.keyring)
    # bind before the backbone loads: a taken port is one line at once (--workers N: the workers serve this socket)
    sock = bind_listener(args.host, args.port)
    if args.workers > 1:
        return _serve_workers(args, served.settings, sock, served.keyring)
    app, lines = _serve_app(args, served, sock.getsockname()[1])
    print("".join(line + "\n" for line in lines), end="", file=sys.stderr, flush=True)
    return _run_uvicorn(app, sock, served.settings, args.verbose)


def _serve_setup(args):
    """What `serve` serves, checked (the client keys, the profile, its pool and key, the router, the target, the
    settings): in `serve` before anything listens, and again in each worker of `--workers N`."""
    import types

    from pipeline.collect import bounded
    from pipeline.profile import load_profile
    from resources.pool import PoolResource

    keyring, allowed = _client_keys(args)  # a bad keys file, or no keys beyond loopback: one line, exit 2
    use_override(args)
    profile = load_profile(args.profile)
    from cli.traffic import traffic_settings

    traffic = traffic_settings(args, profile)  # --explore without its cap: one line, before anything loads
    bounded.configure(_grading_budget(args.grading_budget_ms, profile.collection))  # cascade grading (a bad one: 2)
    if args.workers == 1 or args.worker:  # this process serves: its grading worker starts now, beside the loading
        bounded.warm_up()
    pool = PoolResource(kind=profile.pool.kind, pool=profile.pool.name, base_url=profile.pool.base_url,
                        key_hosts=list(profile.pool.key_hosts))
    pool.require_key("serve")  # every request calls the pool: a missing key fails first, naming the variable
    reg, target, stands_for = _served_router(args, profile)  # a bad target fails before serving
    agents, wider = _serve_agents(pool, profile, following=not (args.head or args.follow_interval == 0))
    pool.check(agents, needed_by="serve")
    settings = _serve_settings(args, profile, target)  # a bad cap fails here, before any worker starts
    _check_guard(args, keyring, allowed, target)
    return types.SimpleNamespace(profile=profile, pool=pool, reg=reg, stands_for=stands_for, agents=agents,
                                 wider=wider, settings=settings, keyring=keyring, allowed=allowed, traffic=traffic,
                                 open_ended=_open_ended_setup(args))


def _open_ended_setup(args):
    """`--open-ended-profile P`: the open-ended world's router (`--open-ended-head`, else the ★ of P's latest run in
    the same home), its pool (P's, its key checked) and settings (P's collection defaults, P's serve.target unless
    --target), checked as the verifiable router's are; None without the option."""
    import types

    from pipeline.profile import load_profile
    from resources.pool import PoolResource

    if not args.open_ended_profile:
        if args.open_ended_head:
            raise RouterLiteError("--open-ended-head names the open-ended world's router: pass --open-ended-profile "
                                  "too (its pool answers it)")
        return None
    profile = load_profile(args.open_ended_profile)
    pool = PoolResource(kind=profile.pool.kind, pool=profile.pool.name, base_url=profile.pool.base_url,
                        key_hosts=list(profile.pool.key_hosts))
    pool.require_key("serve --open-ended-profile")
    own = argparse.Namespace(**{**vars(args), "head": args.open_ended_head})
    reg, target, stands_for = _served_router(own, profile)
    agents = pool.agents()
    pool.check(agents, needed_by="serve --open-ended-profile")
    return types.SimpleNamespace(profile=profile, pool=pool, reg=reg, stands_for=stands_for, agents=agents,
                                 settings=_serve_settings(args, profile, target))


def _serve_app(args, served, port: int):
    """(the app of `serve`, loaded: backbone, format guess, follower, client keys; its startup lines)."""
    from pipeline.serve.app import build_app
    from pipeline.serve.server import return_big_buffers_to_the_os

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    reg, profile, pool, agents, wider = served.reg, served.profile, served.pool, served.agents, served.wider
    bb = _head_backbone(reg, args.device, dtype=args.dtype, threads=args.threads or None)
    formats = _format_guess(reg, profile) if reg.needs_grader else None
    follow = _pointer_follower(args, profile)
    from cli.traffic import traffic_banner, traffic_recorder
    from pipeline.serve.traffic import record
    from resources.storage import home_of

    home = home_of(profile)
    open_ended, other = None, served.open_ended
    if other is not None:  # both worlds behind this endpoint (pipeline/serve/worlds.py)
        from pipeline.serve.worlds import open_ended_router, serve_both

        def trained_on(r):
            return tuple((r.manifest.get("backbone") or {}).get(k) for k in ("id", "key", "pooling", "max_seq_length"))

        other_bb = bb if trained_on(other.reg) == trained_on(reg) else \
            _head_backbone(other.reg, args.device, dtype=args.dtype, threads=args.threads or None)
        open_ended = open_ended_router(other.reg, other_bb, other.agents, other.pool.client_for, other.settings,
                                       _format_guess(other.reg, other.profile) if other.reg.needs_grader else None,
                                       log_prompts=args.log_prompts)
    app = build_app(reg, bb, agents, pool.client_for, served.settings, formats=formats, log_prompts=args.log_prompts,
                    follow=follow)
    if open_ended is not None:
        serve_both(app, open_ended)
    record(app, traffic_recorder(served.traffic, home, served.settings))  # each process its own file
    app, keys_line = _guarded(app, args, served.keyring, served.allowed)
    return_big_buffers_to_the_os()  # 1 MB bodies must not keep the process's memory (docs/serving.md, Limits)
    _serve_logging(args)
    banner = (f"router-lite serve: {served.stands_for}; {len(agents) - len(wider)} agents of pool {pool.pool!r} "
              f"({pool.kind})" + (f" and {len(wider)} more of its wider pool {profile.pool.wide_name!r}" if wider
                                  else "") + f" on http://{args.host}:{port}/v1 (backbone {bb.model_id} on {bb.device})"
              + (f"; a request without router_grader: answer format guessed from the {len(formats.X)} training "
                 f"prompts ({', '.join(formats.graders)})" if formats is not None else "")
              + (f"; following {follow.pointer} every {follow.interval_s:g} s" if follow is not None else "")
              + traffic_banner(served.traffic, home))
    if other is not None:
        banner += (f"\nrouter-lite serve: open-ended prompts (the verifiable router's OOD guard fired, or no answer "
                   f"format guessed; or router_grader judge): {other.stands_for}; {len(other.agents)} agents of pool "
                   f"{other.pool.pool!r} ({other.pool.kind}), not following its registry")
    return app, [*keys_line, banner]


def serve_worker_app(args, reports):
    """uvicorn's app factory in each worker process of `serve --workers N` (pipeline/serve/server.py `Workers`): the
    app of `serve`, set up again from its checked arguments, its startup lines sent on `reports` to the supervisor.
    A failure is one line (a bug: its traceback) and uvicorn's startup-failure exit, on which the supervisor stops
    the others instead of restarting it."""
    import multiprocessing
    import traceback

    from uvicorn.config import STARTUP_FAILURE

    from pipeline.serve.server import KeysOnHangup, die_with_parent

    die_with_parent(multiprocessing.parent_process().pid)  # no orphan on the port, however the supervisor dies
    hangup = KeysOnHangup(announce=False).install()  # the supervisor forwards SIGHUP: re-read the keys here too
    # tqdm (sentence-transformers' batch loop, disabled or not) would make a named multiprocessing lock, registered
    # with the supervisor's resource tracker and never released at the worker's exit: "leaked semaphore objects" at
    # every stop. A worker's bars never cross processes: a thread lock does.
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    _logging(args.verbose)
    try:
        served = _serve_setup(args)
        hangup.attach(served.keyring)
        app, lines = _serve_app(args, served, args.port)
    except Exception as exc:
        if isinstance(exc, RouterLiteError) and not debug_enabled():
            print(f"router-lite: error: {one_line(exc)}", file=sys.stderr, flush=True)
        else:
            traceback.print_exc()
        sys.exit(STARTUP_FAILURE)
    reports.send("".join(line + "\n" for line in lines))  # one write under PIPE_BUF: whole
    return app


def _run_uvicorn(app, sock, settings, verbose: bool) -> int:
    """Serve `app` on `sock` until stopped: SIGTERM drains (pipeline/serve/drain.py) and exits 0; Ctrl-C drains
    too, then uvicorn re-raises the signal, which ends here (exit 130, no traceback)."""
    import uvicorn

    from pipeline.serve.drain import DrainingServer, exit_drained

    config = uvicorn.Config(app, log_level="info" if verbose else "warning", access_log=bool(verbose),
                            **settings.uvicorn_options())
    server = DrainingServer(config, delay_s=settings.drain_delay_s)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        exit_drained(130)  # drained: exit now (pipeline/serve/drain.py)
    if server.stopped_by_sigterm:
        exit_drained(0)
    return 0


# --- client keys (docs/serving.md, "Client keys and budgets"; pipeline/serve/auth.py) -------------------------------
def _add_client_key_options(p) -> None:
    g = p.add_argument_group("client keys and budgets (docs/serving.md)")
    g.add_argument("--api-keys", default=None, metavar="FILE",
                   help="YAML file of client keys (name, sha256 or key, budget_usd, budget_window, rpm, targets); "
                        "clients send `Authorization: Bearer <key>` (default: $ROUTER_LITE_API_KEYS; none: no keys)")
    g.add_argument("--ledger", default=None, metavar="URL",
                   help="where the keys' spend is kept: a SQLite path or sqlite:///PATH, or postgresql://... "
                        "(default: $ROUTER_LITE_LEDGER_URL, else <home>/serve/ledger.sqlite)")
    g.add_argument("--allowed-targets", default=None, metavar="T1,T2",
                   help="the only operating points any client may ask for (others: 403)")
    g.add_argument("--allow-unauthenticated", action="store_true",
                   help="listen beyond loopback without client keys (every client may spend)")


def _client_keys(args):
    """(Keyring or None, allowed targets) of `serve`: the keys file (`--api-keys`, else $ROUTER_LITE_API_KEYS) read
    and checked; without keys, a non-loopback --host is refused unless --allow-unauthenticated."""
    import ipaddress

    from pipeline.serve.keys import KEYS_ENV, load_keys, parse_targets

    allowed = parse_targets(args.allowed_targets)
    path = args.api_keys or os.environ.get(KEYS_ENV) or None
    keyring = getattr(args, "keys_in_force", None)  # a worker of --workers N: its supervisor's, the file not read
    if keyring is None:
        keyring = load_keys(path, allowed) if path else None
    try:
        loopback = args.host == "localhost" or ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = False
    if keyring is None and not loopback:
        if not args.allow_unauthenticated:
            raise RouterLiteError(f"--host {args.host} is reachable beyond this machine and no client keys are set: "
                                  f"pass --api-keys FILE (or {KEYS_ENV}), or --allow-unauthenticated to let every "
                                  "client spend")
        if not args.worker:  # `serve` says it, not each worker of --workers N again
            print(f"router-lite serve: warning: binding {args.host} without client keys (--allow-unauthenticated): "
                  "every client may spend", file=sys.stderr)
    if keyring is None and args.ledger:
        raise RouterLiteError("--ledger keeps the spend of client keys: pass --api-keys FILE too")
    return keyring, allowed


def _ledger_url(args):
    from resources.ledger import LEDGER_ENV, default_ledger_url

    return args.ledger or os.environ.get(LEDGER_ENV) or default_ledger_url()


def _check_guard(args, keyring, allowed, target) -> None:
    """Before any worker starts: the default target within --allowed-targets, and the ledger can be opened."""
    from pipeline.route.targets import parse_target
    from resources.ledger import SpendLedger

    if allowed and parse_target(target).name not in allowed:
        raise RouterLiteError(f"the default target {parse_target(target).name} is not among --allowed-targets "
                              f"({', '.join(allowed)}): pass --target with one of them")
    if keyring is not None and not args.worker:
        SpendLedger(_ledger_url(args)).close()


def _guarded(app, args, keyring, allowed):
    from pipeline.serve.auth import budget_warnings, guard_clients
    from resources.ledger import SpendLedger, shown

    if keyring is not None:  # (the app, its startup lines: the keys, and a key whose budget refuses a default request)
        url = _ledger_url(args)
        return guard_clients(app, keyring, SpendLedger(url), allowed), \
            [f"router-lite serve: {len(keyring.keys)} client keys from {keyring.source}; spend ledger {shown(url)}",
             *budget_warnings(app, keyring, allowed)]
    return guard_clients(app, None, None, allowed), []


def _take_stop_signals() -> None:
    """A server stops on SIGTERM and Ctrl-C whatever it inherited: a signal mask survives exec, so a parent that
    started it with them blocked (a thread inside a multiprocessing helper's spawn, a supervisor) would have a
    supervisor's SIGTERM held forever; an ignored one (a shell's `&`) is restored. uvicorn (its server, or its
    supervisor of --workers N, whose workers inherit the mask) installs its handlers after this."""
    import signal

    stop = (signal.SIGTERM, signal.SIGINT)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stop)
    for sig in stop:
        if signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)


def _check_serve_args(args) -> None:
    if not 0 <= args.port <= 65535:
        raise RouterLiteError(f"--port {args.port} is not a TCP port (0-65535)")
    if args.threads < 0:
        raise RouterLiteError(f"--threads {args.threads} must be >= 0 (0: torch's default)")
    if args.workers is None:  # measured on 2 cores (docs/serving.md): 2 processes > 1 with the batcher
        args.workers = min(DEFAULT_WORKERS, os.cpu_count() or 1)
    if args.workers < 1:
        raise RouterLiteError(f"--workers {args.workers} must be >= 1")
    if not args.follow_interval >= 0:  # NaN too
        raise RouterLiteError(f"--follow-interval {args.follow_interval} must be >= 0 seconds (0: do not follow)")


def _served_router(args, profile):
    """(registered router, default target, the startup line's description): `--head`, else the ★ router of
    registry/latest.json (the best router by validation AIQ of the profile's latest run); the target: `--target`,
    else the profile's `serve.target` (max-quality for a head registered before operating points)."""
    from pathlib import Path

    from pipeline.report.value import validation_at
    from pipeline.route import registry
    from resources.storage import home_of

    star = None
    if args.head:
        reg = registry.load(args.head)
    else:
        root = Path(home_of(profile)) / "registry"  # this profile's lineage, beside other profiles' in one home
        entry = registry.latest_entry(root)
        if entry is None:
            raise RouterLiteError(f"no registered router under {root} ({registry.LATEST} missing): run `router-lite "
                                  f"run --profile {profile.name}` first, or pass --head registry/<name>")
        reg, star = registry.load(entry["path"]), entry.get("star")
    target = args.target or profile.serve.target
    if not args.target and not reg.needs_grader and not reg.operating_points:
        target = None  # registered before operating points: max-quality only
    v = validation_at(reg, target)
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    what = (f"★ router {star['label']}: " if star else "") + f"{reg.kind} {reg.name} at target {v['target']} " \
        f"(validation: {pct(v['quality_ratio'])} of the best single agent's quality at {pct(v['cost_ratio'])} of " \
        "its cost"
    held = (star or {}).get("held_out") or {}
    if star and star.get("target") == v["target"] and held.get("cost_ratio") is not None:
        what += f"; held-out test: {pct(held['quality_ratio'])} at {pct(held['cost_ratio'])}"
    return reg, v["target"], what + ")"


def _serve_agents(pool, profile, following: bool):
    """(agents the server may call, those of them only the wider pool has). A server that follows the registry also
    knows the agents of the profile's wider pool (`pool.wide_name`, which the re-collection schedule collects on): a
    router promoted after a wider re-collection routes to them and is swapped in without a restart. A client is made
    only for an agent a router calls."""
    agents = pool.agents()
    wide = profile.pool.wide_name
    if not following or not wide or wide == pool.pool:
        return agents, []
    known = {a.name for a in agents}
    wider = [a for a in pool.model_copy(update={"pool": wide}).agents() if a.name not in known]  # same kind, URL
    return agents + wider, wider


def _pointer_follower(args, profile):
    """Without --head: a follower of the profile's registry pointer that swaps in each router promoted there
    (pipeline/serve/follow.py); None with --head or --follow-interval 0."""
    from pathlib import Path

    from pipeline.serve.follow import PointerFollower
    from resources.storage import home_of

    if args.head or args.follow_interval == 0:
        return None
    home = home_of(profile)
    return PointerFollower(Path(home) / "registry", args.follow_interval,
                           formats_for=lambda reg: _format_guess(reg, profile))


def _format_guess(reg, profile):
    """A cascade's answer-format guess for requests that name none (pipeline/route/formats.py): the training prompts
    of the profile's task pool with their graders, embedded as the router was trained (the manifest's
    prompt_embeddings version must match the lineage's); None when the lineage does not hold them."""
    from cli import lineage
    from pipeline.core.io import frame_version
    from pipeline.route.formats import format_guess

    want = (reg.manifest.get("data_hashes") or {}).get("prompt_embeddings")
    if not want:
        return None
    emb = lineage.read("prompt_embeddings", profile, default=None)
    if emb is None or frame_version(emb) != want:
        return None
    pool = lineage.read("task_pool", profile, default=None)
    return None if pool is None else format_guess(pool, emb)


def _serve_logging(args) -> None:
    """The access log (logger router_lite.access, one JSON line per request) to stderr or `--access-log FILE`
    (`--access-log off`: none); httpx's line per upstream call only with --verbose."""
    if not args.verbose:
        logging.getLogger("httpx").setLevel(logging.WARNING)
    access = logging.getLogger("router_lite.access")
    access.propagate = False
    if args.access_log == "off":
        access.disabled = True
        return
    handler = logging.StreamHandler(sys.stderr) if args.access_log in (None, "-") else \
        logging.FileHandler(args.access_log, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    access.addHandler(handler)
    access.setLevel(logging.INFO)


def _serve_settings(args, profile, target: str | None = None):
    """The endpoint's ServeSettings from the profile's collection settings and the command's options."""
    from pipeline.serve.settings import ServeSettings

    return ServeSettings.from_collection(profile.collection, default_target=target, metrics=not args.no_metrics,
                                         **{name: getattr(args, name) for name in SERVE_OPTIONS})


def _serve_workers(args, settings, sock, keyring=None) -> int:
    """`serve --workers N`: N processes under uvicorn's supervisor (pipeline/serve/server.py `Workers`) that each
    build the app (`serve_worker_app`) and accept on the one socket bound here (the kernel hands each new connection
    to one of them); their metrics in files of one folder, summed by /metrics. Each worker's backend gets cores / N
    threads unless --threads says otherwise. `keyring`: the keys in force, which each worker starts with (the
    supervisor's copy, re-read on SIGHUP): a keys file made invalid since never keeps a worker from starting."""
    import contextlib
    import functools
    import multiprocessing

    from pipeline.serve.metrics import multiprocess_dir
    from pipeline.serve.server import WorkerConfig, Workers

    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    worker = argparse.Namespace(**{**vars(args), "port": sock.getsockname()[1], "threads": threads, "worker": True,
                                   "keys_in_force": keyring})  # pickled into each worker as it starts
    reports, reporter = multiprocessing.Pipe(duplex=False)  # (a Queue would start multiprocessing's resource tracker)
    config = WorkerConfig(functools.partial(serve_worker_app, worker, reporter), settings, workers=args.workers,
                          log_level="info" if args.verbose else "warning", access_log=bool(args.verbose))
    workers = Workers(config, sock, reports, threads, keyring)
    with contextlib.ExitStack() as stack:
        if not args.no_metrics:
            stack.enter_context(multiprocess_dir())  # the workers inherit PROMETHEUS_MULTIPROC_DIR
        rc = workers.serve()
    if workers.stopped_by_signal:  # the workers drained: exit now (pipeline/serve/drain.py)
        from pipeline.serve.drain import exit_drained

        exit_drained(rc)
    return rc


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="router-lite", description=__doc__)
    ap.add_argument("-v", "--verbose", action="store_true", help="debug logging (and uvicorn's access log for serve)")
    ap.add_argument("--debug", action="store_true",
                    help="show the stack trace of a user error (default: one error line, exit code 2)")
    sub = ap.add_subparsers(dest="command", required=True)
    _add_run_command(sub)
    _add_train_command(sub)
    _add_route_command(sub)
    _add_regrade_command(sub)
    _add_replicate_command(sub)
    _add_publish_command(sub)
    _add_serve_command(sub)
    _add_promotion_commands(sub)
    from cli.forecast import add_forecast_command

    add_forecast_command(sub)
    from cli.traffic import add_traffic_command

    add_traffic_command(sub)
    return ap


def _add_run_command(sub) -> None:
    p = sub.add_parser("run", help="materialise the whole lineage for a profile (default: demo)")
    p.add_argument("--profile", default=None,
                   help="profile name: config/profiles/<name>.yaml (default: $ROUTER_LITE_PROFILE or demo; a profile "
                        "elsewhere: ROUTER_LITE_CONFIG=<config dir>)")
    p.add_argument("--upto", default=None, action="append", metavar="ASSET",
                   help="materialise only this asset and what it depends on (e.g. task_pool); repeat it to end at "
                        "several assets")
    p.add_argument("--target", default=None, help=TARGET_HELP + " for the routed benchmark")
    p.add_argument("--override", default=None, metavar="FILE",
                   help="a YAML file merged over the profile, e.g. pool.base_url / pool.key_hosts for a local "
                        "endpoint (also ROUTER_LITE_OVERRIDE; docs/operations.md)")
    p.add_argument("--backbone", default=None, help=BACKBONE_HELP + " (default: the profile's backbone.model)")
    p.add_argument("--wait-for-collection", action="store_true",
                   help="if another run is collecting a partition, wait for it instead of failing (docs/operations.md)")
    p.add_argument("--quarantine-bad-log-lines", action="store_true",
                   help="move a call-log line that is not a JSON call row to <agent>.jsonl.quarantine instead of "
                        "stopping (docs/operations.md)")
    p.add_argument("--max-usd", default=None, type=float, metavar="X",
                   help="the collection spends at most X USD in all (reruns included; calls in flight reserved at "
                        "their worst case); default: the profile's collection.max_usd (docs/operations.md)")
    p.set_defaults(fn=cmd_run)


GRADING_BUDGET_HELP = ("wall time in ms one sympy evaluation of a reply may take before the reply counts as "
                       "unanswered (default: the profile's collection.grading_budget_ms, 250)")


def _grading_budget(ms, settings=None):
    """The grading budget of a command: --grading-budget-ms over the profile's collection settings."""
    from pipeline.collect.bounded import Budget

    base = Budget.of(settings) if settings is not None else Budget()
    return base if ms is None else Budget(float(ms), base.max_chars)


def _add_train_command(sub) -> None:
    p = sub.add_parser("train", help="train and register a head from your own reward matrix + tasks files")
    p.add_argument("--rewards", required=True,
                   help="reward rows (Parquet/JSONL/CSV): task_id, agent_order, mean_reward, ...")
    p.add_argument("--tasks", required=True, help="tasks (Parquet/JSONL/CSV): task_id, prompt, split")
    p.add_argument("--held-out-split", default="test",
                   help="the tasks' split value kept out of training and reported on (default: %(default)s)")
    _add_train_options(p)
    p.add_argument("--backbone", default="sentence-transformers/all-MiniLM-L6-v2", help=BACKBONE_HELP)
    p.add_argument("--pooling", default="mean", choices=["mean", "last_token"],
                   help="how the backbone's token vectors become one (mean: sentence encoders; last_token: decoders)")
    p.add_argument("--max-seq-length", type=int, default=256,
                   help="tokens of a prompt the backbone reads; longer prompts are cut (default: %(default)s)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--out", default=None, help="registry directory (default: $ROUTER_LITE_HOME/registry)")
    p.add_argument("--grading-budget-ms", type=float, default=None, help=GRADING_BUDGET_HELP)
    p.set_defaults(fn=cmd_train)


# the `TrainConfig` options `router-lite train` takes; their defaults and help are TrainConfig's own (its docstring
# table, docs/training.md), never repeated here
TRAIN_OPTIONS = ("hidden_dim", "sigma0", "generations", "popsize", "seed", "ship_confidence", "keep_confidence",
                 "router", "operating_points", "folds")


# the `ServeSettings` options `router-lite serve` takes: defaults and help are ServeSettings' own (its docstring table)
SERVE_OPTIONS = ("max_body_bytes", "max_messages", "max_batch", "batch_wait_ms", "max_connections",
                 "max_idle_per_client", "reserved_connections", "drain_delay_s")


# where TrainConfig's meaning names fields the command line does not take, its short form for --help
CLI_MEANING = {"sigma0": "Initial CMA-ES step size, in units of the ridge start's score spread per agent (an absolute "
                         "step when the start is all zeros; docs/training.md, TrainConfig.sigma0).",
               "folds": "Number of cross-fitting folds of the prompt-router kind selection and of --operating-points "
                        "crossfit; at least 2."}


def _add_train_options(p) -> None:
    from pipeline.route.train import TrainConfig

    _add_config_options(p, TrainConfig, TRAIN_OPTIONS, CLI_MEANING)


def _add_config_options(p, cls, names, short: dict | None = None) -> None:
    """Options `--name` for the fields `names` of the dataclass `cls`, with the field's default and the meaning its
    docstring table gives (`short`: a shorter meaning for the command line, by name)."""
    import dataclasses
    import typing

    from pipeline.core.config import option_table

    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)  # the plain types under the YAML ones (`Int` is an int, ...)
    meaning = {name: text for name, _, text in option_table(cls)}
    for name in names:
        f = fields[name]
        kind = next(t for t in (int, float, str) if t in (hints[name], *typing.get_args(hints[name])))
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=f.default,
                       help=(short or {}).get(name, meaning[name]).replace("%", "%%") + " (default: %(default)s)")


def _add_route_command(sub) -> None:
    p = sub.add_parser("route", help="print the agent a registered head picks for each prompt")
    p.add_argument("--head", required=True, help="registry/<name> directory")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--target", default=None, help=TARGET_HELP)
    p.add_argument("--grader", default=None,
                   help="a cascade router: the prompts' answer format (e.g. integer); prints which agents are asked "
                        "first and when it escalates. Without it: the cascade's plan per format, then the "
                        "prompt-only picks")
    p.add_argument("prompt", nargs="+", help="one or more prompts (quote each)")
    p.set_defaults(fn=cmd_route)


def _add_regrade_command(sub) -> None:
    p = sub.add_parser("regrade", help="recompute grades of stored calls from their completions (zero calls)")
    p.add_argument("--grading-budget-ms", type=float, default=None, help=GRADING_BUDGET_HELP)
    p.set_defaults(fn=cmd_regrade)


def _add_replicate_command(sub) -> None:
    p = sub.add_parser("replicate", help="RouterBench-style replication table on a bundled suite")
    p.add_argument("--suite", default="routerbench",
                   help="a suite of config/suites.yaml (default: %(default)s, the bundled RouterBench subset)")
    p.add_argument("--backbone", default="sentence-transformers/all-MiniLM-L6-v2", help=BACKBONE_HELP)
    p.add_argument("--max-seq-length", type=int, default=128,
                   help="tokens of a prompt the backbone reads; longer prompts are cut (default: %(default)s)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.set_defaults(fn=cmd_replicate)


def _add_publish_command(sub) -> None:
    p = sub.add_parser("publish", help="push the tasks and rewards datasets and the registered head to the "
                                       "Hugging Face Hub (token: env HF_TOKEN)")
    p.add_argument("--repo-id", required=True, help="OWNER/NAME: datasets OWNER/NAME-tasks and OWNER/NAME-rewards, "
                                                    "model OWNER/NAME")
    p.add_argument("--head", default=None, help="registry/<name> directory (default: the ★ router of the latest run, "
                                                "registry/latest.json)")
    p.add_argument("--dry-run", action="store_true", help="build the cards and list every file and commit "
                                                          "operation; push nothing (no token needed)")
    p.set_defaults(fn=cmd_publish)


def _add_serve_command(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible router endpoint for a registered router (docs/serving.md)")
    p.add_argument("--head", default=None, help="registry/<name> directory of any router kind (default: the ★ "
                                                "router of the profile's latest run, registry/latest.json)")
    p.add_argument("--profile", default=None, help="profile whose pool and collection settings are used "
                                                   "(default: $ROUTER_LITE_PROFILE or demo)")
    p.add_argument("--override", default=None, metavar="FILE",
                   help="a YAML file merged over the profile (also ROUTER_LITE_OVERRIDE)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s, loopback only)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default: %(default)s; 0: any free port)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--dtype", default="auto",
                   help="backbone dtype: auto (float16 on CUDA; on the CPU bfloat16 where it has bf16 units, else "
                        "float32) | float32 | float16 | bfloat16")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads for embedding (0: torch's default)")
    p.add_argument("--target", default=None, help=TARGET_HELP.replace("max-quality (default)", "max-quality")
                   + " when a request names none (header X-Router-Target or body field router_target; default: the "
                     "profile's serve.target, quality>=0.98 in the shipped profiles)")
    p.add_argument("--access-log", default=None, metavar="FILE",
                   help="one JSON line per request (request id, router, target, agents called, cost, latency, "
                        "status) to FILE; default: stderr; `off`: none")
    p.add_argument("--log-prompts", action="store_true", help="the access log carries each request's prompt text")
    p.add_argument("--workers", type=int, default=None,
                   help=f"server processes behind the one port, each with its own backbone and batcher (default "
                        f"{DEFAULT_WORKERS}, at most the core count; docs/serving.md has the measurement)")
    from pipeline.serve.settings import ServeSettings

    _add_config_options(p, ServeSettings, SERVE_OPTIONS)
    p.add_argument("--grading-budget-ms", type=float, default=None, help=GRADING_BUDGET_HELP)
    _add_client_key_options(p)
    p.add_argument("--follow-interval", type=float, default=DEFAULT_FOLLOW_INTERVAL_S, metavar="S",
                   help="without --head: check registry/latest.json every S seconds and swap in the router it "
                        "names without a restart (default %(default)g; 0: do not follow)")
    p.add_argument("--no-metrics", action="store_true", help="no GET /metrics (and no series recorded)")
    p.add_argument("--open-ended-profile", default=None, metavar="PROFILE",
                   help="serve both worlds: prompts the verifiable router gives up (its OOD guard fires, or no "
                        "answer format is guessed) are answered by this profile's ★ router over its own pool, e.g. "
                        "chat (docs/serving.md, \"Both worlds in one endpoint\")")
    p.add_argument("--open-ended-head", default=None, metavar="DIR",
                   help="with --open-ended-profile: this registry/<name> directory instead of its ★ router")
    from cli.traffic import add_traffic_serve_options

    add_traffic_serve_options(p)
    p.set_defaults(fn=cmd_serve, worker=False)  # worker: in a worker process of --workers N


def _add_promotion_commands(sub) -> None:
    for name, fn, text in (("promote", cmd_promote, "serve the registered router NAME from now on, when the "
                                                      "promotion gate passes it (its verdict is shown; --force: past "
                                                      "a refusal; recorded in registry/promotions.jsonl)"),
                           ("rollback", cmd_rollback, "serve again the router promoted before the served one"),
                           ("promotions", cmd_promotions, "the promotion history (registry/promotions.jsonl), the "
                                                          "served router marked ★")):
        p = sub.add_parser(name, help=text)
        if name == "promote":
            p.add_argument("name", help="a registered router: the folder name under the profile's registry/")
            p.add_argument("--check", action="store_true",
                           help="show the gate's verdict only (a dry run): exit 0 when it would promote NAME, 1 "
                                "when it would refuse")
            p.add_argument("--force", action="store_true",
                           help="promote NAME even when the gate refuses it (the history records the override)")
        if name == "promotions":
            p.add_argument("--last", type=int, default=20, metavar="N",
                           help="show the last N lines (default %(default)s; 0: all)")
            p.add_argument("--json", action="store_true", help="one JSON object: the served router and the lines")
            p.add_argument("--repair", action="store_true",
                           help="set aside lines that are not JSON objects first (kept verbatim in "
                                "promotions.invalid.jsonl)")
        p.add_argument("--profile", default=None, help="profile whose registry is re-pointed (default: "
                                                       "$ROUTER_LITE_PROFILE or demo)")
        p.add_argument("--override", default=None, metavar="FILE",
                       help="a YAML file merged over the profile (also ROUTER_LITE_OVERRIDE)")
        p.set_defaults(fn=fn)


def _logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "openai", "httpcore", "alembic"):  # one line per HTTP request is noise at INFO
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    # the console shows our progress lines (rate, ETA); transformers' per-load weight bars are noise there
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # --debug is read deeper down (cli/run.py, one_line), for this command only
    flags = {"ROUTER_LITE_DEBUG": "1"} if args.debug else {}
    _logging(args.verbose)
    with environ(**flags):
        try:
            return args.fn(args)
        except RouterLiteError as exc:  # the user's error: one line naming the bad input, exit 2
            if debug_enabled():
                raise
            print(f"router-lite: error: {one_line(exc)}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
