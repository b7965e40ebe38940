"""`router-lite run`: materialise the whole lineage in process, stage by stage, on a persistent Dagster instance.

Partitioned stages run one Dagster run per partition (exactly what a UI backfill does); unpartitioned stages run
together. Runs land in the instance under DAGSTER_HOME, so `make ui` shows them afterwards.
"""
import logging
import os
import re
import time
from pathlib import Path

from dagster import AssetKey, DagsterInstance, materialize

from assets.automation import IN_PROCESS_TAG, OPT_IN_TAG, SENSOR_TAG
from pipeline.core.errors import RouterLiteError, debug_enabled
from pipeline.core.progress import heartbeat
from pipeline.profile import Profile, as_profile

Stage = tuple[str, list[str], object]  # (name, asset keys, partitions definition or None)

# the console shows our stage lines and warnings; every event is still in the instance (and the UI)
QUIET = {"loggers": {"console": {"config": {"log_level": os.environ.get("ROUTER_LITE_LOG_LEVEL", "WARNING")}}}}


def _run_config() -> tuple[dict, bool]:
    """(run config, whether we replay the runs' warnings ourselves). Dagster's console logger prints a failed step
    with its whole stack trace; outside --debug (and without an explicit ROUTER_LITE_LOG_LEVEL) it is silenced and
    `run_lineage` prints the warnings itself and turns a failure into one error line."""
    if debug_enabled() or os.environ.get("ROUTER_LITE_LOG_LEVEL"):
        return QUIET, False
    return {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}, True


_USER_ERROR = re.compile(r"^(?:[\w.]+\.)?RouterLiteError: ", re.DOTALL)


def user_error(result) -> str | None:
    """The message of the RouterLiteError (the user's error) that failed a run, from its failure events; None when
    the run failed for another reason (a bug, whose trace stays in the event log)."""
    for event in result.all_events:
        err = getattr(event.event_specific_data, "error", None)
        while err is not None:
            if err.cls_name == "RouterLiteError":
                return _USER_ERROR.sub("", err.message.strip(), count=1)
            err = err.cause or err.context
    return None


class Interrupted(Exception):
    """Ctrl-C (SIGINT) stopped the lineage in stage `args[0]`; nothing is lost: the call logs are append-only and every
    asset written before stays, so a rerun resumes."""


_INTERRUPTS = ("DagsterExecutionInterruptedError", "KeyboardInterrupt")


def interrupted(result) -> bool:
    """Whether a failed run failed because it was interrupted (Dagster turns SIGINT inside a step into
    DagsterExecutionInterruptedError; inside an asyncio task group it arrives wrapped in an exception group)."""
    for event in result.all_events:
        err = getattr(event.event_specific_data, "error", None)
        if err is not None and any(name in err.to_string() for name in _INTERRUPTS):
            return True
    return False


def calls_logged(storage) -> int:
    """The calls in the home's call logs (complete lines of every agent's log file): what a rerun will not ask again."""
    root = storage.path("calls")
    return sum(f.read_bytes().count(b"\n") for f in root.rglob("*.jsonl"))


def failed_blocking_check(result) -> str | None:
    """The message of the first failed blocking check (ERROR severity) of a run, None when there is none: Dagster
    skipped the check's downstream assets in the run, and `router-lite run` stops before the next stage."""
    for e in result.get_asset_check_evaluations():
        if not e.passed and e.blocking and getattr(e.severity, "value", "ERROR") == "ERROR":
            why = e.description or ", ".join(f"{k}={getattr(v, 'value', v)}" for k, v in e.metadata.items())
            return f"check {e.asset_key.to_user_string()}:{e.check_name} failed: {why}"
    return None


PLANNED_STOP_EXIT = 3  # `router-lite run` stopped as planned: run it again once the step it names is done


class PlannedStop(RouterLiteError):
    """The lineage stopped where it was meant to (a check's planned stop: new agents that may join are collected
    first); the message names them and the next step."""


def planned_stop(result) -> str | None:
    """The description of a check that stopped the run as planned (metadata `planned_stop`), None when none did."""
    for e in result.get_asset_check_evaluations():
        flag = e.metadata.get("planned_stop")
        if not e.passed and getattr(flag, "value", flag) is True:
            return e.description
    return None


def _failure(result, stage: str, pk) -> Exception:
    where = f"{stage}" + (f" (partition {pk})" if pk is not None else "")
    msg = failed_blocking_check(result) or user_error(result)
    if msg is not None:
        return RouterLiteError(f"{where}: {msg}")
    for event in result.all_events:  # not a user error: the whole trace, as Dagster recorded it
        err = getattr(event.event_specific_data, "error", None)
        if err is not None:
            return RuntimeError(f"{where} failed (run {result.run_id}):\n{err.to_string()}")
    return RuntimeError(f"{where} failed (run {result.run_id}); see the run in the Dagster UI")


def _print_warnings(instance, run_id: str, log) -> None:
    """The warnings user code logged in a run (pre-flight failures, held-back tasks), as the console showed them."""
    for entry in instance.all_logs(run_id):
        if entry.dagster_event is None and entry.level >= logging.WARNING \
                and not entry.user_message.startswith("Dependencies for step"):  # a skip after a failure: said once
            log(f"  warning: {entry.step_key or ''}: {entry.user_message}")


REPO = Path(__file__).resolve().parents[1]  # the checkout whose dagster.yaml `make run` and `make ui` use


def _instance(log=print) -> DagsterInstance:
    """DAGSTER_HOME's instance; without it, run in the repository root (where `make ui` looks), the root's own
    instance, as `make run` uses it (its dagster.yaml names folders relative to the root); elsewhere an ephemeral one,
    said in one line."""
    if not os.environ.get("DAGSTER_HOME") and (REPO / "dagster.yaml").is_file() and Path.cwd().resolve() == REPO:
        os.environ["DAGSTER_HOME"] = str(REPO)
        log(f"Dagster instance: {REPO} (DAGSTER_HOME unset: the repository's, which `make ui` shows)")
    if os.environ.get("DAGSTER_HOME"):
        Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
        return DagsterInstance.get()
    log("Dagster instance: ephemeral (DAGSTER_HOME unset): these runs will not show in the UI; set DAGSTER_HOME to "
        "record them (`make ui` uses the repository root)")
    return DagsterInstance.ephemeral()


def _partition_keys(partitions_def) -> list:
    """The runs of a stage: one per partition of its partitions definition (the definitions factory builds them
    from the profile), [None] for an unpartitioned stage."""
    return [None] if partitions_def is None else partitions_def.get_partition_keys()


def _step_seconds(instance, run_id: str, into: dict) -> None:
    """Add each step's wall seconds of one run (summed over partitions) to `into` (step key -> seconds)."""
    try:
        for st in instance.get_run_step_stats(run_id):
            if st.start_time and st.end_time:
                into[st.step_key] = into.get(st.step_key, 0.0) + (st.end_time - st.start_time)
    except Exception:  # noqa: BLE001 - timing is a report, never a failure
        pass


def _group_depths(graph, keys) -> dict[str, int]:
    """Each group's depth in the graph of groups (a group feeding another comes first); a cycle between groups
    stops the deepening after as many rounds as there are groups."""
    groups = {graph.get(k).group_name for k in keys}
    edges = {(graph.get(p).group_name, graph.get(k).group_name) for k in keys for p in graph.get(k).parent_keys
             if graph.get(p).group_name in groups and graph.get(p).group_name != graph.get(k).group_name}
    depth = dict.fromkeys(groups, 0)
    for _ in groups:
        for a, b in edges:
            depth[b] = max(depth[b], depth[a] + 1)
    return depth


def _stage_name(group: str, keys: list[str]) -> str:
    """A stage of one asset is named after it ("task pool"), a stage of several after their group ("router")."""
    return keys[0].replace("_", " ") if len(keys) == 1 else group


def stages_of(defs, upto: str | list[str] | None = None, start: list[str] | None = None) -> list[Stage]:
    """The stages `run_lineage` materialises, read off the Definitions' asset graph: its assets (without the ones
    tagged opt-in and their descendants, and without those their sensor materialises; with `upto`, those assets
    and what they depend on: `+asset` in Dagster's
    selection syntax, one name or several; with `start`, only those assets and what depends on them: `asset+`, the
    rest read as materialised) in topological order, split where the group or the partitioning changes.
    Among the assets ready next, one of the stage being built comes first, then one of the earliest group (groups
    ordered as they feed each other), so a stage holds a group's assets together."""
    graph = defs.resolve_asset_graph()
    order = {k: i for i, k in enumerate(k for a in defs.assets for k in a.keys)}
    keys = [k for k in graph.toposorted_asset_keys if graph.get(k).is_materializable]
    opt_out = {k for k in keys if OPT_IN_TAG in (graph.get(k).tags or {})}
    for k in keys:  # descendants of an opt-in asset are opt-in too (toposorted: parents come first)
        if set(graph.get(k).parent_keys) & opt_out:
            opt_out.add(k)
    by_sensor = {k for k in keys if SENSOR_TAG in (graph.get(k).tags or {})}  # its descendants stay stages
    wanted = [k for k in keys if k not in opt_out and k not in by_sensor]
    if upto:
        by_name = {k.to_user_string(): k for k in wanted}
        names = [upto] if isinstance(upto, str) else list(upto)
        for name in names:
            if name not in by_name:
                raise RouterLiteError(f"--upto {name!r} is no asset of `router-lite run`; its assets: "
                                      + ", ".join(by_name))
        keep, todo = set(), [by_name[n] for n in names]
        while todo:
            k = todo.pop()
            if k not in keep:
                keep.add(k)
                todo += list(graph.get(k).parent_keys)
        wanted = [k for k in wanted if k in keep]
    if start:
        after = {AssetKey(n) for n in start}
        for k in wanted:  # toposorted: parents first
            if set(graph.get(k).parent_keys) & after:
                after.add(k)
        wanted = [k for k in wanted if k in after]
    def kind(k):
        return graph.get(k).group_name, graph.get(k).partitions_def

    depth = _group_depths(graph, wanted)
    left, stages = set(wanted), []
    while left:
        ready = sorted((k for k in left if not (set(graph.get(k).parent_keys) & left)),
                       key=lambda k: (depth[graph.get(k).group_name], order.get(k, 0)))
        same = [k for k in ready if stages and kind(k) == stages[-1][0]]
        key = (same or ready)[0]
        if not same:
            stages.append((kind(key), []))
        stages[-1][1].append(key.to_user_string())
        left.discard(key)
    return [(_stage_name(g, ks), ks, p) for (g, p), ks in stages]


def check_key(defs, stages) -> None:
    """Before any stage: when a stage about to run calls the pool (`assets.collection.POOL_CALLERS`) and the pool's
    key is missing, one error naming the variable and the first asset that needs it."""
    from assets.collection import POOL_CALLERS

    pool = (defs.resources or {}).get("pool")
    callers = [k for _, keys, _ in stages for k in keys if k in POOL_CALLERS]
    if callers and callable(getattr(pool, "check", None)):
        from resources.pool import MissingKeyError, missing_key_message

        try:
            pool.check()
        except MissingKeyError as exc:
            raise RouterLiteError(missing_key_message(exc.env, callers[0], pool.pool, pool.kind)
                                  + "; set it, or stop before: `router-lite run --upto task_pool` needs no key"
                                  ) from None


def _with_config(run_config: dict, asset_config: dict | None, keys: list[str]) -> dict:
    """`run_config` plus the run config of the assets of `keys` that `asset_config` has (asset -> its config)."""
    ops = {k: {"config": asset_config[k]} for k in keys if k in (asset_config or {})}
    return {**run_config, "ops": ops} if ops else run_config


def run_lineage(defs, profile: Profile | str | None = None, upto: str | list[str] | None = None, log=print,
                asset_config: dict | None = None, start: list[str] | None = None, instance=None) -> dict:
    """Materialise the stages in order, each asset with its run config from `asset_config` (asset -> config, e.g.
    {"benchmark_report": {"target": "parity"}}; `start`: see `stages_of`; `instance`: default `_instance`); returns
    {"stages": {stage: s}, "steps": {asset step: s}, "total_s": s}."""
    profile = as_profile(profile)
    times: dict = {"stages": {}, "steps": {}}
    t_all = time.time()
    all_assets = list(defs.assets)
    checks = list(defs.asset_checks or [])
    stages = stages_of(defs, upto, start)
    check_key(defs, stages)  # a missing key fails now, not after the stages that need none
    if profile.override:
        log(f"profile {profile.name} with override {profile.override}")
    instance = instance or _instance(log)
    resources = defs.resources
    run_config, replay_warnings = _run_config()
    for stage, keys, partitions_def in stages:
        t0 = time.time()
        for pk in _partition_keys(partitions_def):
            try:
                with heartbeat(f"[{stage}]" + (f" partition {pk}" if pk is not None else ""), log):
                    result = materialize(all_assets + checks, selection=[AssetKey(k) for k in keys], instance=instance,
                                         resources=resources, partition_key=str(pk) if pk is not None else None,
                                         raise_on_error=False, run_config=_with_config(run_config, asset_config, keys),
                                         tags={IN_PROCESS_TAG: "true"})  # no trigger for the refresh automation
            except KeyboardInterrupt:  # between Dagster's own interrupt handling (e.g. while a run starts)
                raise Interrupted(stage) from None
            _step_seconds(instance, result.run_id, times["steps"])
            if replay_warnings:
                _print_warnings(instance, result.run_id, log)
            if not result.success and interrupted(result):
                raise Interrupted(stage)
            if not result.success or failed_blocking_check(result):
                raise _failure(result, stage, pk)
            stop = planned_stop(result)
            if stop:  # the next stages would read the matrix it withheld: stop here, saying why and what is next
                raise PlannedStop(f"[{stage}] {stop}")
            failed = [e for e in result.get_asset_check_evaluations() if not e.passed]
            for e in failed:
                # non-blocking: reported only
                level = "WARN" if getattr(e.severity, "value", "") == "WARN" else "FAILED"
                why = e.description or ", ".join(f"{k}={getattr(v, 'value', getattr(v, 'data', v))}"
                                                 for k, v in e.metadata.items())
                log(f"  check {level}: {e.asset_key.to_user_string()}:{e.check_name}: {why}")
        times["stages"][stage] = round(time.time() - t0, 1)
        log(f"[{stage}] {', '.join(keys)} done in {time.time() - t0:.1f}s")
    times["total_s"] = round(time.time() - t_all, 1)
    times["steps"] = {k: round(v, 1) for k, v in times["steps"].items()}
    return times
