import json

import pytest

from pipeline.core.errors import RouterLiteError
from pipeline.route import registry


def test_round_trip_and_stable_name(tmp_path, register_small_head, small_head_parts):
    path = register_small_head(tmp_path)
    assert path.name.startswith("head-all-minilm-l6-v2-")
    assert register_small_head(tmp_path) == path  # same inputs → same name, same entry
    assert register_small_head(tmp_path, seed=1) != path
    reg = registry.load(path)
    head, guard, X = small_head_parts()
    picks, fired = reg.route(X)
    expected = head.pick(X)
    expected[guard.fires(X)] = 1
    assert (picks == expected).all()
    m = json.loads((path / "manifest.json").read_text())
    assert m["best_single"] == "b" and m["n_params"] == 27 and (path / "reference.py").exists()


def test_reference_code_matches_the_registry(tmp_path, register_small_head, small_head_parts):
    import importlib.util

    path = register_small_head(tmp_path)
    spec = importlib.util.spec_from_file_location("reference", path / "reference.py")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    manifest, weights, guard = ref.load(path)
    _, _, X = small_head_parts()
    assert (ref.pick(manifest, weights, guard, X) == registry.load(path).route(X)[0]).all()


def test_corrupt_or_mismatched_files_give_one_clear_error(tmp_path, register_small_head):
    path = register_small_head(tmp_path)
    (path / "head.safetensors").write_bytes(b"garbage")
    with pytest.raises(RouterLiteError, match="head.safetensors"):
        registry.load(path)
    path = register_small_head(tmp_path, seed=2)
    m = json.loads((path / "manifest.json").read_text())
    m["agents"] = m["agents"][:2]
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(RouterLiteError, match="agents"):
        registry.load(path)
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(RouterLiteError, match="manifest.json is corrupt"):
        registry.load(path)
    with pytest.raises(RouterLiteError, match="not a registered router"):
        registry.load(tmp_path / "nope")
