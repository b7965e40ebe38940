"""`serve`'s answer-format guess of a cascade reads the task pool and the prompt embeddings where the lineage's IO
manager stored them, without importing or building the profile's Dagster Definitions (seconds at start and again in
each worker), and only when the embeddings are the version the router was trained on."""
import types

import numpy as np
import pandas as pd
import pytest

from pipeline.core.io import atomic_write_parquet, frame_version
from pipeline.profile import load_profile
from resources.storage import asset_path, home_of


def _lineage(home):
    """A materialised task pool and its prompt embeddings in the smoke profile's lineage under `home`."""
    rng = np.random.default_rng(0)
    pool = pd.DataFrame({"task_id": [f"t{i}" for i in range(8)],
                         "grader": ["integer", "mcq_letter"] * 4,
                         "split": ["train"] * 6 + ["test"] * 2, "ood": [False] * 5 + [True] + [False] * 2})
    emb = pd.DataFrame({"task_id": pool["task_id"], "embedding": list(rng.normal(size=(8, 4)).astype(np.float32))})
    lineage = home_of(load_profile("smoke"), home=home)
    atomic_write_parquet(pool, asset_path(lineage, "task_pool"))
    atomic_write_parquet(emb, asset_path(lineage, "prompt_embeddings"))
    return emb


def test_the_format_guess_reads_the_lineage_without_dagster_definitions(tmp_path, monkeypatch):
    import assets.definitions
    from cli.main import _format_guess

    monkeypatch.setenv("ROUTER_LITE_HOME", str(tmp_path))
    emb = _lineage(tmp_path)

    def no_definitions(*a, **kw):
        raise AssertionError("the format guess built the Definitions")

    monkeypatch.setattr(assets.definitions, "build_definitions", no_definitions)
    profile = load_profile("smoke")
    reg = types.SimpleNamespace(manifest={"data_hashes": {"prompt_embeddings": frame_version(emb)}})
    guess = _format_guess(reg, profile)
    assert guess is not None and len(guess.X) == 5  # the 6 training rows less the OOD one
    assert guess.graders == ["integer", "mcq_letter"] and guess.labels.tolist() == [0, 1, 0, 1, 0]
    # other embeddings than the router's, or none recorded: no guess
    assert _format_guess(types.SimpleNamespace(manifest={"data_hashes": {"prompt_embeddings": "0" * 16}}),
                         profile) is None
    assert _format_guess(types.SimpleNamespace(manifest={}), profile) is None


@pytest.mark.parametrize("asset", ["task_pool", "missing"])
def test_read_is_what_the_io_manager_loads(tmp_path, monkeypatch, asset):
    from dagster import build_input_context

    from cli import lineage
    from resources.storage import ParquetIOManager

    monkeypatch.setenv("ROUTER_LITE_HOME", str(tmp_path))
    _lineage(tmp_path)
    profile = load_profile("smoke")
    io = ParquetIOManager(home=str(home_of(profile)))
    if asset == "missing":
        assert lineage.read(asset, profile, default=None) is None
        with pytest.raises(Exception, match="has not been materialised"):
            lineage.read(asset, profile)
        return
    from dagster import AssetKey

    expected = io.load_input(build_input_context(asset_key=AssetKey(asset)))
    pd.testing.assert_frame_equal(lineage.read(asset, profile), expected)
