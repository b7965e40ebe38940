"""Attacks on the registry a user hands in: a tampered manifest.json or cascade.json (operating points, weights outside
the entry, missing fields, wrong shapes, 100,000-deep nesting), a malformed latest.json, an entry or a pointer leaving
the registry. Each is refused in one line naming the file and the field at load, route, serve and publish."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from attack_kit import cascade_files, cli, edit_manifest, head_copy, one_line, refused, world_files


def test_tampered_operating_points(tmp_path: Path) -> None:
    """registry: operating_points missing / not an object / string lambda (route, serve start-up)"""
    from pipeline.route import registry

    edits = {
        "not an object": lambda m: m.__setitem__("operating_points", "fast"),
        "no points": lambda m: m["operating_points"].pop("points"),
        "empty points": lambda m: m["operating_points"].__setitem__("points", []),
        "string lambda": lambda m: m["operating_points"]["points"][1].__setitem__("lambda", "0.5"),
        "short agent_cost": lambda m: m["operating_points"].__setitem__("agent_cost", [1.0]),
    }
    for edit in edits.values():
        head = head_copy(tmp_path)
        edit_manifest(head, edit)
        refused(lambda head=head: registry.load(head), "manifest.json", "operating_points")
        one_line(*cli("route", "--head", str(head), "--target", "parity", "What is 2 + 2?"), "operating_points")
    head = head_copy(tmp_path)
    edit_manifest(head, lambda m: m.pop("operating_points"))
    reg = registry.load(head)
    refused(lambda: reg.resolve_target("parity"), "no operating points")
    print(f"{len(edits)} tamperings: one line at load; a missing path serves max-quality only")


def test_weights_symlink_default_name(tmp_path: Path) -> None:
    """registry: head.safetensors a symlink out of the head dir, files.weights absent"""
    from pipeline.route import registry

    head = head_copy(tmp_path)
    outside = tmp_path / "outside.safetensors"
    shutil.move(head / "head.safetensors", outside)
    os.symlink(outside, head / "head.safetensors")
    edit_manifest(head, lambda m: m["files"].pop("weights"))
    refused(lambda: registry.load(head), "head.safetensors", "symlink")
    print("refused: every file the loader opens is a plain file of the entry directory")


def test_manifest_paths(tmp_path: Path) -> None:
    """registry: files.weights outside the head dir; manifest without backbone"""
    from pipeline.route import registry

    head = head_copy(tmp_path)
    edit_manifest(head, lambda m: m["files"].__setitem__("weights", "../outside.safetensors"))
    refused(lambda: registry.load(head), "files.weights")
    head = head_copy(tmp_path)
    edit_manifest(head, lambda m: m.pop("backbone"))
    refused(lambda: registry.load(head), "'backbone' is missing")
    print("one line each")


def _cascade_copy(tmp: Path, edit) -> Path:
    dst = tmp / "cascade"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(cascade_files(), dst)
    doc = json.loads((dst / "cascade.json").read_text())
    edit(doc, dst)
    (dst / "cascade.json").write_text(json.dumps(doc))
    return dst


def _point_policy(doc, i: int = 1) -> dict:
    return doc["path"]["points"][i]["plan"]["default"]


def test_cascade_json_tampered(tmp_path: Path) -> None:
    """registry: cascade.json tampered (k > stage, thresholds, duplicate/unknown agent, self fallback, fallback file
    outside) -> one line at load, route, serve"""
    from pipeline.route import registry

    (tmp_path / "outside.safetensors").write_bytes(b"x")
    edits = {
        "k": lambda d, _: _point_policy(d)["stages"][0].__setitem__("k", 2),
        "skip_below": lambda d, _: _point_policy(d).__setitem__("skip_below", -0.5),
        "accept_above": lambda d, _: _point_policy(d).__setitem__("accept_above", 1.5),
        "agents": lambda d, _: _point_policy(d)["stages"][0].__setitem__("agents", ["cheap", "cheap"]),
        ".agents": lambda d, _: _point_policy(d)["stages"][0].__setitem__("agents", ["nobody"]),
        "fallback.kind": lambda d, _: d.__setitem__("fallback", {"kind": "cascade", "files": {}}),
        "fallback.files.weights": lambda d, _: d.__setitem__("fallback", {"kind": "head", "files": {
            "weights": "../outside.safetensors"}}),
    }
    for field, edit in edits.items():
        head = _cascade_copy(tmp_path, edit)
        refused(lambda head=head: registry.load(head), "cascade.json", field)
        one_line(*cli("route", "--head", str(head), "row 3"), "cascade.json", field)
        one_line(*cli("serve", "--head", str(head), "--profile", "demo", "--port", "0"), "cascade.json", field)
    print(f"{len(edits)} tamperings: one RouterLiteError line naming cascade.json and the field (load, route, serve)")


def test_cascade_json_shapes(tmp_path: Path) -> None:
    """registry: cascade.json points without quality / best_single_validation, cost_per_1k null, a string lambda, nested
    100,000 deep -> one line at load, route, serve, publish"""
    from pipeline.report.hub_release import head_release
    from pipeline.route import registry

    def deep(_, dst):
        (dst / "cascade.json").write_text('{"path": ' + "[" * 100_000 + "]" * 100_000 + "}")

    edits = {
        "path.points[1].quality": lambda d, _: d["path"]["points"][1].pop("quality"),
        "path.best_single_validation": lambda d, _: d["path"].pop("best_single_validation"),
        "path.points[0].cost_per_1k": lambda d, _: d["path"]["points"][0].__setitem__("cost_per_1k", None),
        "path.points[1].lambda": lambda d, _: d["path"]["points"][1].__setitem__("lambda", "5"),
        "path.points[0].gain_high": lambda d, _: d["path"]["points"][0].__setitem__("gain_high", float("nan")),
        "nested": None,
    }
    for field, edit in edits.items():
        head = _cascade_copy(tmp_path, edit or (lambda d, _: None))
        if edit is None:
            deep(None, head)
        refused(lambda head=head: registry.load(head), "cascade.json", field)
        refused(lambda head=head: head_release("owner/name", head), "cascade.json", field)
        one_line(*cli("route", "--head", str(head), "--target", "lambda=5", "row 3"), "cascade.json", field)
        one_line(*cli("serve", "--head", str(head), "--profile", "demo", "--port", "0"), "cascade.json", field)
    print(f"{len(edits)} shapes: one RouterLiteError line naming cascade.json and the field (load, route, serve, "
            "publish)")


# ----------------------------------------------------------------------- the registry pointer a user hands in
def _registry_home(tmp: Path) -> Path:
    """A home whose registry holds one registered head (`head`), latest.json not written yet."""
    home = tmp / "home"
    if home.exists():
        shutil.rmtree(home)
    (home / "registry").mkdir(parents=True)
    shutil.copytree(world_files(), home / "registry" / "head")
    return home


def _cli_on(home: Path, *argv: str) -> tuple[int, str]:
    saved = os.environ.get("ROUTER_LITE_HOME")
    os.environ["ROUTER_LITE_HOME"] = str(home)
    try:
        return cli(*argv)
    finally:
        os.environ.pop("ROUTER_LITE_HOME") if saved is None else os.environ.__setitem__("ROUTER_LITE_HOME", saved)


def test_latest_json_malformed(tmp_path: Path) -> None:
    """registry: latest.json not JSON, a list, without name -> serve and publish: one line, exit 2"""
    home = _registry_home(tmp_path)
    for text in ("{not json", "[1, 2]", '{"path": "head"}'):
        (home / "registry" / "latest.json").write_text(text)
        for argv in (("serve", "--profile", "smoke", "--workers", "1"), ("publish", "--repo-id", "me/x", "--dry-run")):
            rc, err = _cli_on(home, *argv)
            lines = err.strip().splitlines()
            assert rc == 2 and len(lines) == 1 and "latest.json" in lines[0] and "Traceback" not in err, (argv, err)
    print("3 pointers x (serve, publish): one line naming latest.json, exit 2")


def test_registry_outside_home(tmp_path: Path) -> None:
    """registry: an entry symlinked to a folder outside the home, a pointer leaving it -> refused"""
    from pipeline.route import registry

    home = _registry_home(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    if elsewhere.exists():
        shutil.rmtree(elsewhere)
    shutil.copytree(world_files(), elsewhere)
    (home / "registry" / "linked").symlink_to(elsewhere, target_is_directory=True)
    pointer = home / "registry" / "latest.json"
    msgs = []
    for path in ("linked", str(elsewhere), "../../elsewhere"):
        pointer.write_text(json.dumps({"name": "x", "path": path}))
        msgs.append(refused(lambda: registry.latest_path(home / "registry"), "outside the registry"))
        rc, err = _cli_on(home, "publish", "--repo-id", "me/x", "--dry-run")
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "outside the registry" in err, err
    print(f"3 pointers refused in one line (publish: exit 2), e.g. {msgs[0][:90]}")
