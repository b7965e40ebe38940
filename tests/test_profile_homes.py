"""Profiles live side by side: one ROUTER_LITE_HOME holds several profiles' lineages without
mixing. The first profile on a home keeps the root (a home from before keeps its lineage where it is); every other
profile's assets, reports, datasets and registry live under profiles/<name>/; the call log and the caches, keyed by
content, are shared."""
import hashlib
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from assets.definitions import build_resources
from resources.storage import OWNER_FILE, asset_path, profile_home, root_owner

REPO = Path(__file__).resolve().parents[1]


def lineage(home: Path, sources) -> None:
    """A lineage left at the root by a version without the owner file: its source_tasks partitions."""
    for s in sources:
        f = asset_path(home, "source_tasks", s)
        f.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame({"task_id": [f"{s}/0"]}).to_parquet(f)


def test_the_first_profile_keeps_the_root_and_the_others_go_beside_it(tmp_path):
    home = tmp_path / "home"
    assert profile_home(home, "demo", ["a"], claim=True) == home.resolve()  # fresh: nothing claimed, nothing made
    assert not home.exists()
    home.mkdir()
    assert profile_home(home, "demo", ["a"], claim=True) == home.resolve() and root_owner(home) == "demo"
    assert profile_home(home, "pilot", ["b"], claim=True) == home.resolve() / "profiles" / "pilot"
    assert root_owner(home) == "demo"


def test_a_home_from_before_stays_its_lineages_profiles(tmp_path):
    home = tmp_path / "home"
    lineage(home, ["zeroeval_gsm8k", "zeroeval_math_l5"])
    assert profile_home(home, "pilot", ["gsm8k", "math500"], claim=True) == home.resolve() / "profiles" / "pilot"
    assert root_owner(home) is None  # a stranger claims nothing
    assert profile_home(home, "demo", ["zeroeval_math_l5", "zeroeval_gsm8k"], claim=True) == home.resolve()
    assert (home / OWNER_FILE).read_text().strip() == "demo"


def test_the_resources_split_the_lineage_from_the_shared_caches(tmp_path):
    home = tmp_path / "home"
    lineage(home, ["mmlu_pro"])  # smoke's
    res = build_resources(str(home), "pilot")
    own = home.resolve() / "profiles" / "pilot"
    assert res["io_manager"].home == str(own) and res["router_io_manager"].home == str(own)
    assert res["io_manager"].owner == ""  # not the root's lineage: names nobody there
    storage = res["storage"]
    assert storage.path("reports") == own / "reports" and storage.path("registry") == own / "registry"
    assert storage.calls_dir("replay", "gsm8k", 0) == home.resolve() / "calls" / "replay" / "gsm8k" / "rep0"
    assert storage.path("embeddings") == home.resolve() / "embeddings"
    mine = build_resources(str(home), "smoke")
    assert mine["io_manager"].home == str(home.resolve()) and mine["io_manager"].owner == "smoke"
    assert root_owner(home) is None  # building definitions writes nothing: the lineage's first write names it


def test_the_roots_first_write_names_its_profile(tmp_path):
    from dagster import asset, materialize

    @asset(io_manager_key="io_manager")
    def one() -> pd.DataFrame:
        return pd.DataFrame({"x": [1]})

    home = tmp_path / "home"
    assert materialize([one], resources={"io_manager": build_resources(str(home), "smoke")["io_manager"]}).success
    assert root_owner(home) == "smoke" and asset_path(home, "one").exists()
    other = build_resources(str(home), "demo")["io_manager"]
    assert materialize([one], resources={"io_manager": other}).success
    assert root_owner(home) == "smoke" and asset_path(home / "profiles" / "demo", "one").exists()


@pytest.mark.slow
def test_a_pilot_task_pool_beside_a_lineage_leaves_it_intact(smoke_home_copy, temp_instance_dir):
    """`router-lite run --profile pilot --upto task_pool` (keyless) on a home with another profile's whole lineage:
    that lineage's task pool and reports are untouched, the pilot's pool lands under profiles/pilot, and the summary
    printed under pilot is the pilot's."""
    import os

    home = smoke_home_copy()
    (home / OWNER_FILE).unlink(missing_ok=True)  # as a home from before the owner file
    digest = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in [asset_path(home, "task_pool"),
                                                                      *sorted((home / "reports").glob("*"))]}
    env = {**os.environ, "ROUTER_LITE_HOME": str(home), "DAGSTER_HOME": str(temp_instance_dir),
           "PYTHONPATH": str(REPO)}
    env.pop("OPENROUTER_API_KEY", None)
    p = subprocess.run([sys.executable, "-m", "cli.main", "run", "--profile", "pilot", "--upto", "task_pool"],
                       env=env, capture_output=True, text=True, timeout=900, cwd=REPO, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert {f: hashlib.sha256(f.read_bytes()).hexdigest() for f in digest} == digest
    pilot = pd.read_parquet(asset_path(home / "profiles" / "pilot", "task_pool"))
    assert len(pilot) == 1110
    assert "Task pool: 1110 tasks" in p.stdout and "Router head" not in p.stdout and "Pool verdict" not in p.stdout
    assert len(pd.read_parquet(asset_path(home, "task_pool"))) == 300  # smoke's pool, as it was
