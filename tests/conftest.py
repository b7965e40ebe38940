import os

# tests never reach a hub: models and datasets come from bundled files
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smoke_home(tmp_path_factory):
    """The whole lineage of the `smoke` profile (300 MMLU-Pro tasks, replay pool, MiniLM) materialised once, on a
    persistent temp Dagster instance. Returns (ROUTER_LITE_HOME, DAGSTER_HOME) as Paths."""
    from pathlib import Path

    root = tmp_path_factory.mktemp("smoke")
    home, dagster_home = root / "home", root / "dagster"
    dagster_home.mkdir()
    # the repo's dagster.yaml with its relative dirs made absolute under this temp root
    text = (Path(__file__).resolve().parents[1] / "dagster.yaml").read_text()
    (dagster_home / "dagster.yaml").write_text(text.replace(".router-lite/dagster", str(dagster_home / "instance")))
    mp = pytest.MonkeyPatch()
    mp.setenv("ROUTER_LITE_HOME", str(home))
    mp.setenv("DAGSTER_HOME", str(dagster_home))
    from assets.definitions import build_definitions
    from cli.run import run_lineage

    run_lineage(build_definitions(home=str(home), profile="smoke"), "smoke", log=lambda m: None)
    mp.undo()
    return home, dagster_home


# --- operations tests (tests/test_ops.py, test_dask.py, test_postgres.py, test_ui.py) -----------------------------

@pytest.fixture
def smoke_home_copy(smoke_home, tmp_path):
    """A private copy of the materialised smoke ROUTER_LITE_HOME (assets, call log, caches) that a test may change;
    `drop` names top-level folders (e.g. "calls") left out of the copy."""
    import shutil

    def make(name: str = "home", drop: tuple[str, ...] = ()):
        dst = tmp_path / name
        shutil.copytree(smoke_home[0], dst, ignore=lambda d, names: [n for n in names if d == str(smoke_home[0])
                                                                        and n in drop])
        return dst

    return make


@pytest.fixture
def temp_instance_dir(tmp_path):
    """A DAGSTER_HOME with the repo's dagster.yaml, its relative storage folders made absolute under tmp_path
    (so the concurrency block is the repo's own)."""
    from pathlib import Path

    import yaml

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "dagster.yaml").read_text())
    root = tmp_path / "dagster_home"
    root.mkdir()
    if "sqlite" in cfg.get("storage", {}):
        cfg["storage"]["sqlite"]["base_dir"] = str(root / "storage")
    if "local_artifact_storage" in cfg:
        cfg["local_artifact_storage"]["config"]["base_dir"] = str(root)
    (root / "dagster.yaml").write_text(yaml.safe_dump(cfg))
    return root


def pytest_collection_modifyitems(config, items):
    """A test that takes the materialised lineage (`smoke_home`, `smoke_home_copy`) is `slow` even when its module
    forgot the mark, so `make test-fast` (`-m "not slow"`) never materialises the lineage."""
    for item in items:
        if {"smoke_home", "smoke_home_copy"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
