"""What tests/conftest.py and the tests share that is no fixture: the repository's instance folders, the session mark
of the processes the suite starts, and a temporary DAGSTER_HOME. A helper module, not a test file: tests import it
(`from _support import ...`) rather than conftest."""
import os
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
