"""Registry manifests: every file a manifest names lies inside the head directory (no absolute
path, '..' or symlink), and required keys are present — otherwise one error naming the manifest and the key."""
import json
import os

import numpy as np
import pytest

from cli.main import main
from pipeline.core.errors import RouterLiteError
from pipeline.route import registry
from pipeline.route.head import Head
from pipeline.route.ood import OODGuard


def _register(root, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(50, 8)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    head = Head(rng.normal(size=(8, 3)), rng.normal(size=3), agents=["a", "b", "c"])
    guard = OODGuard(k=5).fit(X[:40], X[40:])
    return registry.register(root, head, registry.PromptFit(guard, 1),
                             backbone={"id": "sentence-transformers/all-MiniLM-L6-v2", "dim": 8},
                             agents=[{"name": n, "model": f"m-{n}"} for n in "abc"], training={"generations": 3},
                             data_hashes={"rewards": "x"}, metrics={"head": 0.5})


def _edit(path, fn):
    mf = path / "manifest.json"
    m = json.loads(mf.read_text())
    fn(m)
    mf.write_text(json.dumps(m))


@pytest.fixture
def head(tmp_path):
    path = _register(tmp_path / "reg")
    registry.load(path)  # sane to start with
    return path


def test_weights_outside_the_head_directory_are_refused(head, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes((head / "head.safetensors").read_bytes())
    for name in (str(outside), "../elsewhere.safetensors", "../../reg/" + head.name + "/head.safetensors"):
        _edit(head, lambda m, name=name: m["files"].__setitem__("weights", name))
        with pytest.raises(RouterLiteError, match=r"manifest.json: files.weights .* must name a file directly inside"):
            registry.load(head)


def test_symlinked_files_are_refused(head, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes((head / "head.safetensors").read_bytes())
    os.symlink(outside, head / "link.safetensors")
    _edit(head, lambda m: m["files"].__setitem__("weights", "link.safetensors"))
    with pytest.raises(RouterLiteError, match=r"files.weights 'link.safetensors' .*symlink"):
        registry.load(head)
    _edit(head, lambda m: m["files"].__setitem__("weights", "head.safetensors"))
    guard = head / "guard.npz"
    (tmp_path / "g.npz").write_bytes(guard.read_bytes())
    guard.unlink()
    os.symlink(tmp_path / "g.npz", guard)
    with pytest.raises(RouterLiteError, match=r"files.guard 'guard.npz'"):
        registry.load(head)


@pytest.mark.parametrize("key", ["backbone", "dim", "agents", "best_single", "name"])
def test_missing_required_key_names_manifest_and_key(head, key):
    _edit(head, lambda m: m.pop(key))
    with pytest.raises(RouterLiteError, match=rf"manifest.json: required key '{key}' is missing"):
        registry.load(head)


def test_bad_backbone_and_agents(head, capsys):
    _edit(head, lambda m: m["backbone"].pop("id"))
    with pytest.raises(RouterLiteError, match=r"required key 'backbone.id'"):
        registry.load(head)
    _edit(head, lambda m: m.__setitem__("backbone", {"id": "x"}) or m["agents"].__setitem__(1, "b"))
    with pytest.raises(RouterLiteError, match=r"agents\[1\] must be an object"):
        registry.load(head)
    _edit(head, lambda m: m.pop("agents") and m.pop("backbone"))
    assert main(["route", "--head", str(head), "hello"]) == 2  # `route` before: a KeyError traceback
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "required key" in err[0] and "manifest.json" in err[0]
