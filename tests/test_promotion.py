"""The served pointer (registry/latest.json): relative to the registry so a copied home serves its own files, checked
at load (one line, exit 2), never followed outside the registry; promotion's gate, `router-lite promote` and
`rollback` with their history. Fast: routers registered directly (the register_small_head fixture)."""
import json
import shutil

import pytest

from cli.main import main
from pipeline.core.errors import RouterLiteError
from pipeline.route import registry


def _home(register, tmp_path, name="home"):
    """A home with two registered heads (`register`: the register_small_head fixture) and latest.json pointing at the
    first (the head beside it)."""
    root = tmp_path / name / "registry"
    a, b = register(root), register(root, seed=1)
    registry.mark_latest(root, a.name, a, head={"name": a.name, "path": str(a)}, kind="head")
    return tmp_path / name, a, b


def _copy(src, dst):
    shutil.copytree(src, dst, symlinks=True)  # what `cp -a` does
    return dst


def test_the_pointer_is_stored_relative_and_resolves_inside_the_registry(tmp_path, register_small_head):
    home, a, _ = _home(register_small_head, tmp_path)
    stored = json.loads((home / "registry" / "latest.json").read_text())
    assert stored["path"] == a.name and stored["head"]["path"] == a.name
    entry = registry.latest_entry(home / "registry")
    assert entry["path"] == str(a.resolve()) and registry.latest_path(home / "registry") == a.resolve()


def test_a_copied_home_serves_its_own_files_with_the_original_gone(tmp_path, register_small_head):
    home, a, _ = _home(register_small_head, tmp_path)
    copy = _copy(home, tmp_path / "moved")
    shutil.rmtree(home)
    path = registry.latest_path(copy / "registry")
    assert path == (copy / "registry" / a.name).resolve()
    assert registry.load(path).name == a.name


def test_a_copied_home_serves_its_own_files_with_the_original_present(tmp_path, register_small_head):
    home, a, _ = _home(register_small_head, tmp_path)
    copy = _copy(home, tmp_path / "copy")
    (a / "manifest.json").write_text("{broken")  # the original's files change: the copy must not read them
    path = registry.latest_path(copy / "registry")
    assert path.is_relative_to(copy.resolve()) and registry.load(path).name == a.name


def test_an_old_absolute_pointer_inside_the_registry_reads_and_is_made_relative(tmp_path, register_small_head):
    home, a, _ = _home(register_small_head, tmp_path)
    f = home / "registry" / "latest.json"
    f.write_text(json.dumps({"name": a.name, "path": str(a), "head": {"name": a.name, "path": str(a)}}))
    assert registry.latest_path(home / "registry") == a.resolve()
    stored = json.loads(f.read_text())
    assert stored["path"] == a.name and stored["head"]["path"] == a.name


def test_a_pointer_outside_the_registry_is_refused(tmp_path, register_small_head):
    home, a, _ = _home(register_small_head, tmp_path)
    other, b, _ = _home(register_small_head, tmp_path, "other")
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
def test_a_malformed_pointer_is_one_error_naming_the_file_and_field(tmp_path, text, why, register_small_head):
    home, _, _ = _home(register_small_head, tmp_path)
    (home / "registry" / "latest.json").write_text(text)
    with pytest.raises(RouterLiteError, match=why) as e:
        registry.latest_entry(home / "registry")
    assert "latest.json" in str(e.value)


@pytest.mark.parametrize("text,why", BAD_POINTERS[:3])
@pytest.mark.parametrize("command", [["publish", "--repo-id", "me/x", "--dry-run"],
                                     ["serve", "--profile", "smoke", "--workers", "2"],
                                     ["rollback", "--profile", "smoke"]])
def test_the_cli_says_a_malformed_pointer_in_one_line(tmp_path, monkeypatch, capsys, text, why, command,
                                                      register_small_head):
    home, _, _ = _home(register_small_head, tmp_path)
    (home / "registry" / "latest.json").write_text(text)
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert main(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "latest.json" in err[0] and why in err[0] and "Traceback" not in err[0]


# ------------------------------------------------------------------------------------ the gate, promote, rollback
def _rows(n=200, seed=0):
    """Held-out rows for the three agents of the small heads (max-quality: they have no operating points)."""
    import numpy as np

    from pipeline.report.promotion import HeldOut

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 8)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    U = (rng.random((n, 3)) < 0.5).astype(np.float64)
    C = np.tile([3e-3, 2e-3, 1e-3], (n, 1))
    return HeldOut([f"t{i}" for i in range(n)], X, U, C, [[None] * 3] * n, np.array(["integer"] * n, object),
                   ["a", "b", "c"], 0)


def _candidate(path, rows, value=None, cost=None):
    """(pointer fields, evidence) of the head at `path` scored on `rows`, its picks' rewards set to `value` and
    their cost to `cost` when given (a degraded or an improved matrix)."""
    import numpy as np

    from pipeline.report import promotion

    reg = registry.load(path)
    picks, _ = reg.route(rows.X)
    idx = np.arange(len(picks))
    if value is not None:
        rows.U[idx, picks] = value
    if cost is not None:
        rows.C[idx, picks] = cost
    reward, c = promotion.held_out_outcome(reg, "max-quality", rows)
    ev = promotion.evidence(reg.name, "head", "max-quality", rows, reward, c)
    return {"name": reg.name, "path": str(path), "kind": reg.kind, "target": "max-quality"}, ev


def _lines(root):
    from pipeline.route import pointer

    return pointer.history(root)


def test_the_gate_refuses_a_worse_candidate_and_keeps_the_pointer_then_accepts_a_better_one(tmp_path,
                                                                                            register_small_head):
    from pipeline.report.promotion import decide

    root = tmp_path / "registry"
    a, b = register_small_head(root), register_small_head(root, seed=1)
    action, verdict = decide(root, *_candidate(a, rows := _rows(), value=1.0), rows)  # nothing promoted yet
    assert action == "promoted" and verdict["mode"] == "own" and "first promotion" in verdict["reason"]
    assert registry.latest_entry(root)["name"] == a.name and (root / "evidence" / f"{a.name}.json").is_file()
    before = (root / "latest.json").read_text()
    # b scored on a degraded matrix (its picks all wrong) on the same rows: worse beyond noise, refused
    action, verdict = decide(root, *_candidate(b, rows := _rows(), value=0.0), rows)
    assert action == "refused" and verdict["mode"] == "paired" and not verdict["passed"]
    assert verdict["quality_minus_promoted"]["high"] < 0 and "worse in quality" in verdict["reason"]
    assert (root / "latest.json").read_text() == before
    # b where its picks are right and cheap: not worse, not dearer -> promoted, a recorded as the previous one
    action, verdict = decide(root, *_candidate(b, rows := _rows(), value=1.0, cost=5e-4), rows)
    assert action == "promoted" and verdict["mode"] == "paired" and verdict["passed"]
    entry = registry.latest_entry(root)
    assert entry["name"] == b.name and entry["promoted_by"] == "gate" and entry["kind"] == "head"
    lines = _lines(root)
    assert [(r["action"], r["by"], r["name"]) for r in lines] == [
        ("promoted", "gate", a.name), ("refused", "gate", b.name), ("promoted", "gate", b.name)]
    assert lines[2]["previous"] == {"name": a.name, "path": a.name} and lines[2]["at"].endswith("+00:00")


def test_a_dearer_candidate_is_refused_and_other_rows_are_not_paired(tmp_path, register_small_head):
    from pipeline.report.promotion import decide

    root = tmp_path / "registry"
    a, b = register_small_head(root), register_small_head(root, seed=1)
    decide(root, *_candidate(a, rows := _rows(), value=1.0, cost=1e-3), rows)
    action, verdict = decide(root, *_candidate(b, rows := _rows(), value=1.0, cost=3e-3), rows)
    assert action == "refused" and "dearer" in verdict["reason"]
    # another task pool (other held-out rows): the candidate stands on its own evidence, the reason says why
    action, verdict = decide(root, *_candidate(b, rows := _rows(150, seed=3), value=1.0, cost=3e-3), rows)
    assert action == "promoted" and verdict["mode"] == "own" and "task pool changed" in verdict["reason"]


def test_promote_and_rollback_re_point_and_write_the_history(tmp_path, monkeypatch, capsys, register_small_head):
    from pipeline.profile import OVERRIDE_ENV
    from pipeline.report.promotion import decide

    home = tmp_path / "home"
    root = home / "registry"
    a, b, c = register_small_head(root), register_small_head(root, seed=1), register_small_head(root, seed=2)
    decide(root, *_candidate(a, rows := _rows(), value=1.0), rows)
    decide(root, *_candidate(b, rows := _rows(), value=1.0, cost=5e-4), rows)
    override = tmp_path / "serve.yaml"
    override.write_text("serve: {target: max-quality}\n")  # these heads have no operating points
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    monkeypatch.setenv(OVERRIDE_ENV, str(override))  # `--override` would set it for the rest of the session
    cli = ["--profile", "smoke"]
    assert main(["promote", c.name, *cli]) == 0
    entry = registry.latest_entry(root)
    assert entry["name"] == c.name and entry["promoted_by"] == "promote" and entry["path"] == str(c.resolve())
    assert main(["rollback", *cli]) == 0 and registry.latest_entry(root)["name"] == b.name
    assert registry.latest_entry(root)["promoted_by"] == "rollback"
    assert registry.latest_entry(root)["star"]["held_out"]["quality"] == 1.0  # b's stored evidence
    assert main(["rollback", *cli]) == 0 and registry.latest_entry(root)["name"] == a.name
    capsys.readouterr()
    assert main(["rollback", *cli]) == 2  # a was the first promotion: nothing before it
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to roll back" in err[0]
    assert registry.latest_entry(root)["name"] == a.name
    assert [(r["action"], r["by"], r["name"], (r["previous"] or {}).get("name")) for r in _lines(root)] == [
        ("promoted", "gate", a.name, None), ("promoted", "gate", b.name, a.name),
        ("promoted", "promote", c.name, b.name), ("rolled back", "rollback", b.name, c.name),
        ("rolled back", "rollback", a.name, b.name)]
    for bad in ("nope", "../registry", "evidence"):
        assert main(["promote", bad, *cli]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"no registered router {bad!r}" in err[0] and a.name in err[0]
    elsewhere, far, _ = _home(register_small_head, tmp_path, "elsewhere")
    (root / "linked").symlink_to(far, target_is_directory=True)  # an entry that is a symlink out of the registry
    assert main(["promote", "linked", *cli]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "outside the registry" in err[0]
    assert registry.latest_entry(root)["name"] == a.name and len(_lines(root)) == 5
