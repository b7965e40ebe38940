"""Assets built once, by the factory: importing an asset module (or the code location) reads no
profile, so a plugin can register a pool kind after the import and the profile naming it then builds."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from dagster import AssetKey

from assets import benchmark, collection, tasks
from assets.benchmark import SUITES
from assets.definitions import build_assets, profile_assets
from pipeline.profile import load_profile

REPO = Path(__file__).resolve().parents[1]
MODULES = sorted(f"assets.{p.stem}" for p in (REPO / "assets").glob("*.py") if p.stem != "__init__")

# imports every asset module with an audit hook noting each file opened under the config directory; then, with
# `build`, builds the code location (`defs`) before and after registering the pool kind the profile names
SCRIPT = """
import importlib, json, os, sys
config = os.path.realpath(os.environ["ROUTER_LITE_CONFIG"])
opened = []
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.realpath(os.fsdecode(args[0]))
        if path.startswith(config + os.sep) or path.endswith((".yaml", ".yml")) and "site-packages" not in path:
            opened.append(path)
sys.addaudithook(hook)
out = {"errors": []}
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        out["errors"].append(f"{name}: {type(exc).__name__}: {exc}")
out["opened_on_import"] = list(opened)
if sys.argv[1] == "build":
    from assets.definitions import defs
    try:
        defs()
    except Exception as exc:
        out["before_registering"] = str(exc)
    from pipeline.collect.replay import REPLAY_BASE_URL
    from resources.pool import _check_replay, _replay_client, register_pool_kind
    register_pool_kind("replay_plugin", _replay_client, _check_replay, free=True, recorded_only=True)
    built = defs()
    out["graded_calls_partitions"] = len(built.resolve_assets_def("graded_calls").partitions_def.get_partition_keys())
    out["source_tasks_partitions"] = built.resolve_assets_def("source_tasks").partitions_def.get_partition_keys()
    out["automated"] = sorted(k.to_user_string() for a in built.assets
                              for k, c in a.automation_conditions_by_key.items() if c)
    out["opened_by_build"] = sorted({os.path.basename(p) for p in opened[len(out["opened_on_import"]):]})
print("RESULT " + json.dumps(out))
"""


def _run(tmp_path, profile: str, build: bool) -> dict:
    config = tmp_path / "config"
    if not config.exists():
        shutil.copytree(REPO / "config", config)
        smoke = (config / "profiles" / "smoke.yaml").read_text()
        assert "  kind: replay " in smoke
        (config / "profiles" / "plugin.yaml").write_text(
            smoke.replace("name: smoke", "name: plugin").replace("  kind: replay ", "  kind: replay_plugin "))
    env = {**os.environ, "PYTHONPATH": str(REPO), "ROUTER_LITE_CONFIG": str(config), "ROUTER_LITE_PROFILE": profile,
           "ROUTER_LITE_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-c", SCRIPT, "build" if build else "import", *MODULES], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_importing_the_asset_modules_reads_no_profile(tmp_path):
    out = _run(tmp_path, "nonexistent", build=False)
    assert out["errors"] == [] and out["opened_on_import"] == []


def test_a_pool_kind_registered_after_the_import_builds(tmp_path):
    out = _run(tmp_path, "plugin", build=True)
    assert out["errors"] == [] and out["opened_on_import"] == []  # the profile names a kind nobody registered yet
    assert "pool.kind: str 'replay_plugin' is not one of" in out["before_registering"]
    assert out["source_tasks_partitions"] == ["mmlu_pro"] and out["graded_calls_partitions"] == 3
    assert "benchmark_report" in out["automated"]  # a free kind: its benchmark refreshes by itself
    assert "plugin.yaml" in out["opened_by_build"]  # the build reads the profile (the hook sees the reads)


def test_the_profile_dependent_assets_exist_only_as_the_factory_builds_them():
    assert not hasattr(tasks, "source_tasks") and not hasattr(collection, "graded_calls") \
        and not hasattr(benchmark, "routerbench_replication")
    keys = [k for a in build_assets("smoke") for k in a.keys]
    assert {AssetKey("source_tasks"), AssetKey("graded_calls"), AssetKey("routerbench_replication")} <= set(keys)
    assert len(keys) == len(set(keys))  # each asset once
    source_tasks, graded_calls, replication, traffic = profile_assets(load_profile("pilot"))
    assert traffic.partitions_def.get_first_partition_key() == "2026-01-01"  # one partition per UTC day
    assert replication.partitions_def.get_partition_keys() == list(load_profile("pilot").benchmark.suites or SUITES)
    assert source_tasks.partitions_def.get_partition_keys() == ["math500", "gsm8k", "aime2025_i", "aime2025_ii",
                                                                "arc_challenge", "mmlu", "mmlu_pro"]
    assert graded_calls.op.pool == "provider:openrouter"
