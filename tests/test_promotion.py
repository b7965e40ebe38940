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
def _rows(n=200, seed=0, prefix="t"):
    """Held-out rows for the three agents of the small heads (max-quality: they have no operating points); task ids
    `prefix`0, `prefix`1, ..."""
    import numpy as np

    from pipeline.report.promotion import HeldOut

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 8)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    U = (rng.random((n, 3)) < 0.5).astype(np.float64)
    C = np.tile([3e-3, 2e-3, 1e-3], (n, 1))
    return HeldOut([f"{prefix}{i}" for i in range(n)], X, U, C, [[None] * 3] * n, np.array(["integer"] * n, object),
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
    assert action == "refused" and "dearer" in verdict["reason"] and verdict["dearer"]
    assert verdict["replaces"] == a.name
    # another task pool (other held-out tasks, none shared): the candidate stands on its own evidence, the reason
    # says why, and a dearer share of the best single agent's cost than the served router's is refused by rule
    action, verdict = decide(root, *_candidate(b, rows := _rows(150, seed=3, prefix="u"), value=1.0, cost=3e-3),
                             rows)
    assert action == "refused" and verdict["mode"] == "own" and "task pool changed" in verdict["reason"]
    assert "dearer than the served router" in verdict["reason"] and verdict["replaces"] == a.name
    action, verdict = decide(root, *_candidate(b, rows := _rows(150, seed=3, prefix="u"), value=1.0, cost=1e-3),
                             rows)
    assert action == "promoted" and verdict["mode"] == "own" and not verdict["dearer"]


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
    assert "nothing to roll back" in err[-1] and all(e.startswith("rollback: ") for e in err[:-1])
    assert registry.latest_entry(root)["name"] == a.name
    assert [(r["action"], r["by"], r["name"], (r["previous"] or {}).get("name")) for r in _lines(root)] == [
        ("promoted", "gate", a.name, None), ("promoted", "gate", b.name, a.name),
        ("promoted", "promote", c.name, b.name), ("rolled back", "rollback", b.name, c.name),
        ("rolled back", "rollback", a.name, b.name)]
    for bad in ("nope", "../registry", "evidence"):
        assert main(["promote", bad, *cli]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert f"no registered router {bad!r}" in err[-1] and a.name in err[-1]
        assert all(e.startswith("promote: ") for e in err[:-1])  # the progress line, no more
    elsewhere, far, _ = _home(register_small_head, tmp_path, "elsewhere")
    (root / "linked").symlink_to(far, target_is_directory=True)  # an entry that is a symlink out of the registry
    assert main(["promote", "linked", *cli]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "outside the registry" in err[-1] and all(e.startswith("promote: ") for e in err[:-1])
    assert registry.latest_entry(root)["name"] == a.name and len(_lines(root)) == 5


# ------------------------------------------------------------------------------------ the gate when the pool changed
def _evidence(name, agents, task_ids, reward, cost, best_reward, best_cost, target="quality>=0.98"):
    """Evidence as pipeline.report.promotion.evidence stores it, from constructed per-row outcomes."""
    return {"name": name, "router": "cascade:answers", "target": target, "agents": agents,
            "task_ids": list(task_ids), "reward": list(map(float, reward)), "cost": list(map(float, cost)),
            "best_single": "frontier_a", "best_reward": list(map(float, best_reward)),
            "best_cost": list(map(float, best_cost))}


def _wide_then_default(n=543, seed=0):
    """The operator's case: demo_wide's refresh promoted a cascade at ~29 % of frontier_a's cost (10 agents); the
    default lineage rerun (5 agents, the same held-out tasks) offers one at ~74 %, of about the same quality."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = [f"gsm8k/{i}" for i in range(n)]
    best_r, best_c = (rng.random(n) < 0.85).astype(float), rng.uniform(2e-3, 3e-3, n)
    wide_r = np.where(rng.random(n) < 0.97, best_r, 1 - best_r)
    default_r = np.where(rng.random(n) < 0.97, best_r, 1 - best_r)
    narrow = ["frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"]
    wide = _evidence("cascade-wide", narrow + ["w1", "w2", "w3", "w4", "w5"], ids, wide_r, 0.29 * best_c * 0.97
                     + rng.uniform(0, 0.02 * best_c.mean(), n), best_r, best_c)
    default = _evidence("cascade-default", narrow, ids, default_r, 0.74 * best_c, best_r, best_c)
    return wide, default


def test_after_a_wider_pool_a_dearer_router_of_the_default_lineage_is_refused_saying_so():
    from pipeline.report.promotion import gate, verdict_lines

    wide, default = _wide_then_default()
    served = {"name": "cascade-wide", "target": "quality>=0.98"}
    v = gate(default, wide, None, served=served)
    assert v["mode"] == "shared" and v["passed"] is False and v["dearer"] is True
    assert v["replaces"] == "cascade-wide" and v["incumbent"]["name"] == "cascade-wide"
    assert "the pool changed (−w1, −w2, −w3, −w4, −w5)" in v["reason"] and "dearer beyond noise" in v["reason"]
    assert v["cost_per_1k_minus_promoted"]["low"] > 0 and v["quality_minus_promoted"]["n"] == 543
    said = "\n".join(verdict_lines(v))
    assert "refuses cascade-default" in said and "replacing cascade-wide" in said
    assert "--force" in said and "dearer" in said
    # the old rule (own evidence: quality against 0.98 × best single only) would have passed it
    own = gate(default, None, None)
    assert own["mode"] == "own" and own["passed"] is True
    # the wider pool's router against the default's: cheaper, as good: it passes on the shared tasks
    back = gate(wide, default, None, served={"name": "cascade-default", "target": "quality>=0.98"})
    assert back["mode"] == "shared" and back["passed"] is True and not back["dearer"]


def test_too_few_shared_tasks_fall_back_to_the_stated_cost_rule():
    from pipeline.report.promotion_gate import COST_RATIO_SLACK, MIN_SHARED, gate

    wide, default = _wide_then_default()
    for k in ("task_ids", "reward", "cost", "best_reward", "best_cost"):
        default[k] = default[k][: MIN_SHARED - 1] if k != "task_ids" else \
            [f"other/{i}" for i in range(MIN_SHARED - 11)] + wide["task_ids"][:10]
    wide["held_out"] = {"quality_ratio": 1.0, "cost_ratio": 0.29}
    v = gate(default, wide, None, served={"name": "cascade-wide", "target": "quality>=0.98"})
    assert v["mode"] == "own" and f"10 held-out tasks scored by both (< {MIN_SHARED}" in v["reason"]
    assert v["passed"] is False and v["dearer"] and "29 % -> 74 %" in v["reason"]
    wide["held_out"]["cost_ratio"] = 0.74 - COST_RATIO_SLACK / 2  # within the slack: passes
    assert gate(default, wide, None, served={"name": "cascade-wide", "target": "quality>=0.98"})["passed"]


def test_the_lineage_gate_keeps_the_wider_pools_router_and_names_it(tmp_path, register_small_head):
    """decide() as the promotion asset calls it: the served router was promoted on a wider pool (its evidence over
    five agents, the same held-out tasks); the run's candidate over three agents is dearer: refused, the pointer
    untouched, the history line names the router it would have replaced."""
    import numpy as np

    from pipeline.report.promotion import decide, evidence
    from pipeline.route import pointer

    root = tmp_path / "registry"
    wide_dir, b = register_small_head(root), register_small_head(root, seed=1)
    rows = _rows()
    ev = evidence(wide_dir.name, "head", "max-quality", rows, rows.U[:, 0], np.full(len(rows.task_ids), 5e-4))
    ev["agents"] = ["a", "b", "c", "w1", "w2"]
    pointer.promote(root, {"name": wide_dir.name, "path": str(wide_dir), "kind": "head", "target": "max-quality",
                           "evidence": pointer.save_evidence(root, ev)}, by="gate", reason="wide pool's refresh")
    before = (root / "latest.json").read_text()
    entry, cand = _candidate(b, rows, value=1.0, cost=3e-3)
    action, verdict = decide(root, entry, cand, rows)
    assert action == "refused" and verdict["mode"] == "shared" and verdict["dearer"]
    assert (root / "latest.json").read_text() == before
    line = _lines(root)[-1]
    assert line["action"] == "refused" and line["verdict"]["replaces"] == wide_dir.name
    assert line["verdict"]["dearer"] is True and "the pool changed (−w1, −w2)" in line["reason"]
    assert (root / "evidence" / f"{b.name}.json").is_file()  # kept: `promote NAME` shows the same verdict


# ------------------------------------------------------------------------------------ the operator's commands
def _gated_home(tmp_path, register_small_head):
    """A home whose served router a passed the gate, b was refused (dearer), c was never a candidate."""
    from pipeline.report.promotion import decide

    home = tmp_path / "home"
    root = home / "registry"
    a, b, c = register_small_head(root), register_small_head(root, seed=1), register_small_head(root, seed=2)
    decide(root, *_candidate(a, rows := _rows(), value=1.0, cost=1e-3), rows)
    assert decide(root, *_candidate(b, rows := _rows(), value=1.0, cost=3e-3), rows)[0] == "refused"
    return home, a, b, c


@pytest.fixture
def operator(tmp_path, monkeypatch):
    from pipeline.profile import OVERRIDE_ENV

    override = tmp_path / "serve.yaml"
    override.write_text("serve: {target: max-quality}\n")  # the small heads have no operating points
    monkeypatch.setenv(OVERRIDE_ENV, str(override))
    return lambda home: monkeypatch.setenv("ROUTER_LITE_HOME", str(home))


def test_promote_shows_the_gates_refusal_and_asks_for_force(tmp_path, operator, capsys, register_small_head):
    home, a, b, c = _gated_home(tmp_path, register_small_head)
    operator(home)
    root = home / "registry"
    before, n = (root / "latest.json").read_text(), len(_lines(root))
    capsys.readouterr()
    assert main(["promote", b.name, "--check", "--profile", "smoke"]) == 1  # a dry run: would refuse
    out = capsys.readouterr()
    assert f"gate: refuses {b.name} at max-quality (replacing {a.name})" in out.out and "dearer" in out.out
    assert (root / "latest.json").read_text() == before and len(_lines(root)) == n
    assert main(["promote", b.name, "--profile", "smoke"]) == 2
    out = capsys.readouterr()
    err = out.err.strip().splitlines()
    assert f"gate: refuses {b.name}" in out.out and f"judging {b.name}" in err[0]
    assert f"the gate refuses {b.name}" in err[-1] and f"promote {b.name} --force" in err[-1]
    assert (root / "latest.json").read_text() == before and len(_lines(root)) == n
    assert main(["promote", b.name, "--force", "--profile", "smoke"]) == 0
    assert "past the gate's refusal" in capsys.readouterr().out
    line = _lines(root)[-1]
    assert line["by"] == "promote" and line["verdict"]["passed"] is False and line["verdict"]["replaces"] == a.name
    assert registry.latest_entry(root)["name"] == b.name
    # a router never gated: the gate cannot judge it, promote says so and goes on
    assert main(["promote", c.name, "--profile", "smoke"]) == 0
    out = capsys.readouterr().out
    assert f"gate: cannot judge {c.name}" in out and "no held-out evidence stored" in out
    assert main(["promote", a.name, "--check", "--profile", "smoke"]) == 0  # a passes against c (own evidence)
    assert main(["promotions", "--profile", "smoke"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(f"{c.name} ★" in s and "gate not judged" in s for s in out) and out[-1] == f"served now: {c.name}"
    assert any("refused" in s and b.name in s and "gate refused" in s for s in out)
    assert main(["promotions", "--json", "--profile", "smoke"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["served"] == c.name and [r["action"] for r in got["history"]] == [
        "promoted", "refused", "promoted", "promoted"]


def test_a_junk_line_in_the_history_is_set_aside_by_promote_saying_so(tmp_path, operator, capsys,
                                                                       register_small_head):
    home, a, b, c = _gated_home(tmp_path, register_small_head)
    operator(home)
    root = home / "registry"
    with open(root / "promotions.jsonl", "a") as f:
        f.write("{half a line\n")
    capsys.readouterr()
    assert main(["promotions", "--profile", "smoke"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 3 is not a JSON object" in err[0] and "--repair" in err[0]
    assert main(["promote", c.name, "--profile", "smoke"]) == 0
    err = capsys.readouterr().err
    assert "repaired" in err and "line 3" in err and "promotions.invalid.jsonl" in err
    assert (root / "promotions.invalid.jsonl").read_text() == "{half a line\n"  # kept verbatim
    assert [r["name"] for r in _lines(root)] == [a.name, b.name, c.name]  # every later line reads
    assert main(["rollback", "--profile", "smoke"]) == 0 and registry.latest_entry(root)["name"] == a.name
