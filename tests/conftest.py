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
    from assets.run import run_lineage

    run_lineage(build_definitions(home=str(home), profile="smoke"), "smoke", log=lambda m: None)
    mp.undo()
    return home, dagster_home
