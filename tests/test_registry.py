import json

import numpy as np
import pytest

from pipeline.core.errors import RouterLiteError
from pipeline.route import registry
from pipeline.route.head import Head
from pipeline.route.ood import OODGuard


def _parts(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(50, 8)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    head = Head(rng.normal(size=(8, 3)), rng.normal(size=3), agents=["a", "b", "c"])
    guard = OODGuard(k=5).fit(X[:40], X[40:])
    return head, guard, X


def _register(root, seed=0):
    head, guard, _ = _parts(seed)
    return registry.register(root, head, guard, 1, backbone={"id": "sentence-transformers/all-MiniLM-L6-v2", "dim": 8},
                             agents=[{"name": n, "model": f"m-{n}"} for n in "abc"], training={"generations": 3},
                             data_hashes={"rewards": "x"}, metrics={"head": 0.5})


def test_round_trip_and_stable_name(tmp_path):
    path = _register(tmp_path)
    assert path.name.startswith("head-all-minilm-l6-v2-")
    assert _register(tmp_path) == path  # same inputs → same name, same entry
    assert _register(tmp_path, seed=1) != path
    reg = registry.load(path)
    head, guard, X = _parts()
    picks, fired = reg.route(X)
    expected = head.pick(X)
    expected[guard.fires(X)] = 1
    assert (picks == expected).all()
    m = json.loads((path / "manifest.json").read_text())
    assert m["best_single"] == "b" and m["n_params"] == 27 and (path / "reference.py").exists()


def test_reference_code_matches_the_registry(tmp_path):
    import importlib.util

    path = _register(tmp_path)
    spec = importlib.util.spec_from_file_location("reference", path / "reference.py")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    manifest, weights, guard = ref.load(path)
    _, _, X = _parts()
    assert (ref.pick(manifest, weights, guard, X) == registry.load(path).route(X)[0]).all()


def test_corrupt_or_mismatched_files_give_one_clear_error(tmp_path):
    path = _register(tmp_path)
    (path / "head.safetensors").write_bytes(b"garbage")
    with pytest.raises(RouterLiteError, match="head.safetensors"):
        registry.load(path)
    path = _register(tmp_path, seed=2)
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
