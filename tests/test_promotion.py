"""The served pointer (registry/latest.json): relative to the registry so a copied home serves its own files, checked
at load (one line, exit 2), never followed outside the registry; promotion's gate, `router-lite promote` and
`rollback` with their history. Fast: routers registered directly (tests/test_registry.py's `_register`)."""
import json
import shutil

import pytest

from cli.main import main
from pipeline.core.errors import RouterLiteError
from pipeline.route import registry
from tests.test_registry import _register


def _home(tmp_path, name="home"):
    """A home with two registered heads and latest.json pointing at the first (the head beside it)."""
    root = tmp_path / name / "registry"
    a, b = _register(root), _register(root, seed=1)
    registry.mark_latest(root, a.name, a, head={"name": a.name, "path": str(a)}, kind="head")
    return tmp_path / name, a, b


def _copy(src, dst):
    shutil.copytree(src, dst, symlinks=True)  # what `cp -a` does
    return dst


def test_the_pointer_is_stored_relative_and_resolves_inside_the_registry(tmp_path):
    home, a, _ = _home(tmp_path)
    stored = json.loads((home / "registry" / "latest.json").read_text())
    assert stored["path"] == a.name and stored["head"]["path"] == a.name
    entry = registry.latest_entry(home / "registry")
    assert entry["path"] == str(a.resolve()) and registry.latest_path(home / "registry") == a.resolve()


def test_a_copied_home_serves_its_own_files_with_the_original_gone(tmp_path):
    home, a, _ = _home(tmp_path)
    copy = _copy(home, tmp_path / "moved")
    shutil.rmtree(home)
    path = registry.latest_path(copy / "registry")
    assert path == (copy / "registry" / a.name).resolve()
    assert registry.load(path).name == a.name


def test_a_copied_home_serves_its_own_files_with_the_original_present(tmp_path):
    home, a, _ = _home(tmp_path)
    copy = _copy(home, tmp_path / "copy")
    (a / "manifest.json").write_text("{broken")  # the original's files change: the copy must not read them
    path = registry.latest_path(copy / "registry")
    assert path.is_relative_to(copy.resolve()) and registry.load(path).name == a.name


def test_an_old_absolute_pointer_inside_the_registry_reads_and_is_made_relative(tmp_path):
    home, a, _ = _home(tmp_path)
    f = home / "registry" / "latest.json"
    f.write_text(json.dumps({"name": a.name, "path": str(a), "head": {"name": a.name, "path": str(a)}}))
    assert registry.latest_path(home / "registry") == a.resolve()
    stored = json.loads(f.read_text())
    assert stored["path"] == a.name and stored["head"]["path"] == a.name


def test_a_pointer_outside_the_registry_is_refused(tmp_path):
    home, a, _ = _home(tmp_path)
    other, b, _ = _home(tmp_path, "other")
    f = home / "registry" / "latest.json"
    for path in (str(b), f"../../other/registry/{b.name}", ".", "/etc"):
        f.write_text(json.dumps({"name": b.name, "path": path}))
        with pytest.raises(RouterLiteError, match="outside the registry") as e:
            registry.latest_entry(home / "registry")
        assert str(f) in str(e.value) and "\n" not in str(e.value)
    # an entry of this registry that is a symlink to a folder elsewhere is not followed
    (home / "registry" / "linked").symlink_to(b, target_is_directory=True)
    f.write_text(json.dumps({"name": "linked", "path": "linked"}))
    with pytest.raises(RouterLiteError, match="outside the registry"):
        registry.latest_path(home / "registry")
    f.write_text(json.dumps({"name": a.name, "path": a.name, "head": {"name": b.name, "path": str(b)}}))
    with pytest.raises(RouterLiteError, match="head.path"):
        registry.latest_entry(home / "registry")


BAD_POINTERS = [("{not json", "not JSON"), ("[1, 2]", "a JSON object is expected, got list"),
                ('{"path": "x"}', "'name' is missing"), ('{"name": "x"}', "'path' is missing"),
                ('{"name": 3, "path": "x"}', "'name' must be a non-empty string"),
                ('{"name": "x", "path": "x", "head": "x"}', "'head' must be an object"),
                ('{"name": "x", "path": "x", "promoted_at": 1}', "'promoted_at' must be a string")]


@pytest.mark.parametrize("text,why", BAD_POINTERS)
def test_a_malformed_pointer_is_one_error_naming_the_file_and_field(tmp_path, text, why):
    home, _, _ = _home(tmp_path)
    (home / "registry" / "latest.json").write_text(text)
    with pytest.raises(RouterLiteError, match=why) as e:
        registry.latest_entry(home / "registry")
    assert "latest.json" in str(e.value)


@pytest.mark.parametrize("text,why", BAD_POINTERS[:3])
@pytest.mark.parametrize("command", [["publish", "--repo-id", "me/x", "--dry-run"],
                                     ["serve", "--profile", "smoke", "--workers", "2"],
                                     ["rollback", "--profile", "smoke"]])
def test_the_cli_says_a_malformed_pointer_in_one_line(tmp_path, monkeypatch, capsys, text, why, command):
    home, _, _ = _home(tmp_path)
    (home / "registry" / "latest.json").write_text(text)
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert main(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "latest.json" in err[0] and why in err[0] and "Traceback" not in err[0]
