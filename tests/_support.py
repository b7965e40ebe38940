"""What tests/conftest.py and the tests share that is no fixture: the repository's instance folders, the session mark
of the processes the suite starts, and a temporary DAGSTER_HOME. A helper module, not a test file: tests import it
(`from _support import ...`) rather than conftest."""
import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# what a Dagster instance (DAGSTER_HOME) or a router-lite home writes when pointed at the repository's root
INSTANCE_DIRS = ("history", "storage", "logs", "schedules", ".telemetry", ".router-lite")
SESSION_MARK = "ROUTER_LITE_TEST_SESSION"  # inherited by every process the suite starts: how leftovers are found


def instance_dagster_yaml(root: Path, capture_logs: bool = True) -> Path:
    """`root` as a DAGSTER_HOME: the repo's dagster.yaml with its relative storage folders made absolute under it.
    `capture_logs=False`: no compute-log capture (Dagster's local capture mirrors a step's stdout and stderr through
    two `tail -F` processes per run, which outlive a run that is left waiting)."""
    import yaml

    cfg = yaml.safe_load((REPO / "dagster.yaml").read_text())
    if not capture_logs:
        cfg["compute_logs"] = {"module": "dagster._core.storage.noop_compute_log_manager",
                               "class": "NoOpComputeLogManager"}
    root.mkdir(parents=True, exist_ok=True)
    if "sqlite" in cfg.get("storage", {}):
        cfg["storage"]["sqlite"]["base_dir"] = str(root / "storage")
    if "base_dir" in cfg.get("compute_logs", {}).get("config", {}):
        cfg["compute_logs"]["config"]["base_dir"] = str(root / "storage")
    if "local_artifact_storage" in cfg:
        cfg["local_artifact_storage"]["config"]["base_dir"] = str(root)
    (root / "dagster.yaml").write_text(yaml.safe_dump(cfg))
    return root


def repo_instance_files() -> dict[str, int]:
    """Every file under the repository's instance folders, with its modification time (ns)."""
    out = {}
    for d in INSTANCE_DIRS:
        for p in (REPO / d).rglob("*") if (REPO / d).exists() else ():
            if p.is_file():
                out[str(p.relative_to(REPO))] = p.stat().st_mtime_ns
    return out


# the forkserver (the bounded graders' workers fork from it: pipeline/collect/bounded.py) and the resource tracker
# of this very process: each reads a pipe only this process holds and exits when it closes, so they cannot outlive it
_OWN_HELPERS = ("multiprocessing.forkserver import main", "multiprocessing.resource_tracker import main")


def session_processes(mark: str) -> list[str]:
    """The live processes (not this one) whose environment carries `mark`: the ones the suite started."""
    needle = f"{SESSION_MARK}={mark}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                ppid = int((proc / "stat").read_text().split(")")[-1].split()[1])
                if ppid == os.getpid() and any(h in cmd for h in _OWN_HELPERS):
                    continue  # this process's multiprocessing helpers: they exit on EOF of its pipe, with it
                if (proc / "stat").read_text().split(")")[-1].split()[0] != "Z":  # a zombie is dead already
                    found.append(f"{proc.name}: {cmd}")
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


class AutomationTicks:
    """Successive ticks of the automation sensor, decided by Dagster's own evaluator (`evaluate_automation_conditions`,
    what the sensor runs on each tick) with its cursor carried over; a tick returns the asset keys it requests."""

    def __init__(self, defs, instance, cursor=None):
        self.defs, self.instance, self.cursor = defs, instance, cursor

    def __call__(self) -> set:
        from dagster import AssetSelection, evaluate_automation_conditions

        res = evaluate_automation_conditions(defs=self.defs, instance=self.instance, cursor=self.cursor,
                                             asset_selection=AssetSelection.all())
        self.cursor = res.cursor
        return {k.to_user_string() for a in self.defs.assets for k in a.keys if res.get_num_requested(k)}


@dataclass(frozen=True)
class SmokeLineage:
    """The suite's one materialised `smoke` lineage (tests/conftest.py `smoke_lineage`): its ROUTER_LITE_HOME and
    DAGSTER_HOME, what the automation evaluator requested on the tick before `router-lite run` and on the tick after
    it, and the evaluator's cursor after them."""

    home: Path
    dagster_home: Path
    ticks: tuple[set, set]
    cursor: object


def built_once(tmp_path_factory, name: str, build):
    """What `build(root)` returns for a session fixture, built once for the whole run: under pytest-xdist every
    worker is a session of its own, so the first worker to take the lock builds under a folder all workers share
    (the parent of their temp roots) and the others load its pickled result (pytest-xdist's "Making session-scoped
    fixtures execute only once"). A failed build leaves no result: the next worker tries again on a fresh folder.
    Without xdist it is `build` on a fresh temp folder."""
    import pickle
    import tempfile

    from filelock import FileLock

    if "PYTEST_XDIST_WORKER" not in os.environ:
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent
    done = shared / f"{name}.pickle"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.is_file():
            result = build(Path(tempfile.mkdtemp(prefix=f"{name}-", dir=shared)))
            done.write_bytes(pickle.dumps(result))
        return pickle.loads(done.read_bytes())


def copy_home(src: Path, dst: Path, drop: tuple[str, ...] = (), symlinks: bool = False) -> Path:
    """A copy of the ROUTER_LITE_HOME `src` at `dst` without its top-level folders `drop`; `symlinks`: links copied
    as links (`cp -a`). The backbone cache (170 of the smoke home's 190 MB) is hard-linked, not copied: its files are
    written once and replaced by rename (pipeline/embed/fast_backbone.py), so a copy that rebuilds one leaves the
    original alone."""
    import shutil

    cache = str(Path(src) / "backbones") + os.sep

    def link_cache(s: str, d: str) -> None:
        if s.startswith(cache):
            try:
                return os.link(s, d)
            except OSError:  # another file system
                pass
        shutil.copy2(s, d)

    shutil.copytree(src, dst, symlinks=symlinks, copy_function=link_cache,
                    ignore=lambda d, names: [n for n in names if d == str(src) and n in drop])
    return dst


def two_cluster_rewards(n: int):
    """Synthetic reward rows over two clusters of queries: on cluster A only the expensive agent is right, on cluster
    B both are, the cheap one at 1/20 of the cost. (X, reward frame, split per row, cluster)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(1)
    d = 8
    cluster = rng.random(n) < 0.5
    centres = np.zeros((2, d))
    centres[0, 0], centres[1, 1] = 3, 3
    X = (centres[cluster.astype(int)] + rng.normal(0, 0.3, (n, d))).astype(np.float32)
    R = np.column_stack([np.ones(n), (~cluster).astype(float)])  # cluster True = A: cheap agent wrong
    C = np.tile([0.02, 0.001], (n, 1))
    names = ["expensive", "cheap"]
    rewards = pd.DataFrame({"task_id": [f"t{i}" for i in range(n)], "agent_order": [names] * n,
                            "mean_reward": list(R), "mean_cost": list(C)})
    split = pd.Series(np.array(["train", "validation", "test"])[np.arange(n) % 5 % 3])
    return X, rewards, split, cluster


def two_cluster_head(registry_dir: Path, n: int):
    """A registered synthetic head over `two_cluster_rewards(n)`. (fit, registered path, X, cluster)."""
    import numpy as np

    from pipeline.route import registry
    from pipeline.route.fit import fit_router
    from pipeline.route.train import TrainConfig

    X, rewards, split, cluster = two_cluster_rewards(n)
    names = list(rewards["agent_order"].iloc[0])
    fit = fit_router(X, rewards, split, TrainConfig(generations=2, log_every=0), labels=np.where(cluster, "A", "B"))
    path = registry.register(registry_dir, fit.head, registry.PromptFit(fit.guard, fit.best_single, fit.scorer,
                                                                        fit.cost_scorer, fit.operating_points),
                             backbone={"id": "synthetic", "key": "synthetic", "dim": int(X.shape[1])},
                             agents=[{"name": a, "model": a} for a in names], training={}, data_hashes={},
                             metrics=fit.metrics)
    return fit, path, X, cluster


@contextlib.contextmanager
def stopped_by_sigterm(proc, timeout_s: float = 30.0):
    """Run the body with the server process `proc` up; after it, SIGTERM must stop `proc` with exit code 0 within
    `timeout_s`. Whatever happens, no process is left behind: one still running is killed."""
    try:
        yield proc
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout_s) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def promote_the_other_router(home: Path) -> tuple[Path, str, str]:
    """On a smoke home's registry: `router-lite promote` the registered router that is not served, with a copy of the
    served one's evidence. -> (registry root, the router served before, the one promoted)."""
    import json

    from cli.main import main
    from pipeline.route import registry

    root = home / "registry"
    candidate = registry.latest_entry(root)["name"]
    other = next(p.name for p in sorted(root.iterdir()) if (p / "manifest.json").exists() and p.name != candidate)
    evidence = json.loads((root / registry.latest_entry(root)["evidence"]).read_text())
    (root / "evidence" / f"{other}.json").write_text(json.dumps({**evidence, "name": other}))
    assert main(["promote", other, "--profile", "smoke"]) == 0
    return root, candidate, other


def worker_pids(pid: int) -> list[int]:
    """The worker processes of a `serve --workers N` supervisor `pid` (uvicorn spawns them with multiprocessing, whose
    resource tracker is a child too)."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        return [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    except OSError:
        return []


def kill_and_wait_for_replacement(proc, worker: int, lines: list[str], workers: int = 2,
                                  timeout_s: float = 240.0) -> list[int]:
    """SIGKILL `worker` of the supervisor `proc`, then wait until it has `workers` workers again, `worker` not among
    them; the workers then. One snapshot per look: a SIGKILLed worker can be listed by one read and gone by the next,
    so two reads could see the count reached before the replacement started."""
    import time

    os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    now = worker_pids(proc.pid)
    while not (len(now) == workers and worker not in now):
        assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
        time.sleep(0.2)
        now = worker_pids(proc.pid)
    return now
