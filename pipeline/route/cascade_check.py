"""The door of a cascade entry's `cascade.json` (pipeline/route/cascade.py): checked at load, like the manifest's
operating points, so `route` says one line and `serve` refuses to start instead of answering 500 to every graded
request. Every problem is one RouterLiteError naming the file and the field:

- `agents` the entry's agents, `order` a permutation of them;
- each plan's policies (`path.points[i].plan.default`, `... .by_grader.<g>`): stages of known agents, none named twice
  (a duplicate would be called and paid twice), `1 <= k <=` the agents called so far for a stage before the last, the
  last one agent with `k` 0; `skip_below` / `accept_above` null or a number in [0, 1];
- `fallback` (a prompt router of another kind): a known kind other than `cascade` (a cascade falling back on itself
  would load itself forever), its `files` plain names of files directly inside the entry directory;
- what a target reads (pipeline/route/targets.py `resolve`, `path_table`): each point's `lambda` (increasing),
  `quality`, `cost_per_1k`, `ci_low`, `ci_high`, `gain`, `gain_low`, `gain_high` (and `gain_se` when present) finite
  numbers, `shares` an object; `path.best_single_validation.quality` and `path.guard_z` (when present) finite numbers;
- the file itself (`read_cascade_doc`): nested at most MAX_DEPTH deep, counted before it is parsed (a file nested
  100,000 deep would be a RecursionError, not an error line).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from pipeline.core.errors import RouterLiteError
from pipeline.core.text_guard import json_text_depth

MAX_DEPTH = 64  # a written cascade.json nests about 10 deep (points, plan, by_grader, stages, agents)
POINT_NUMBERS = ("lambda", "quality", "cost_per_1k", "ci_low", "ci_high", "gain", "gain_low", "gain_high")


def _cut(v, limit: int = 60) -> str:
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "..."


def read_cascade_doc(f: Path, names: list[str], directory: Path) -> dict:
    """The parsed cascade.json `f`, checked (`check_cascade_doc`); one RouterLiteError naming it otherwise."""
    try:
        text = f.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RouterLiteError(f"cascade file {f} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RouterLiteError(f"cascade file {f} cannot be read: {type(exc).__name__}") from None
    depth = json_text_depth(text)
    if depth > MAX_DEPTH:
        raise RouterLiteError(f"cascade file {f}: nested {depth} levels deep, more than {MAX_DEPTH}")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise RouterLiteError(f"cascade file {f} is corrupt: {exc}") from None
    check_cascade_doc(doc, f, names, directory)
    return doc


def check_cascade_doc(doc, f: Path, names: list[str], directory: Path) -> None:
    """Raise one RouterLiteError naming `f` and the field when `doc` (the parsed cascade.json) is not a valid
    cascade for the entry's agents `names` in `directory`."""
    def bad(field: str, problem: str):
        raise RouterLiteError(f"cascade file {f}: {field}: {problem}")

    if not isinstance(doc, dict) or not isinstance(doc.get("path"), dict) or \
            not isinstance(doc["path"].get("points"), list) or not doc["path"]["points"]:
        bad("path.points", "expected an object with a non-empty path.points list")
    if doc.get("agents") != names:
        bad("agents", f"fitted for agents {_cut(doc.get('agents'), 200)}, not {names}")
    order = doc.get("order", list(range(len(names))))
    if not isinstance(order, list) or sorted(o for o in order if type(o) is int) != list(range(len(names))) \
            or len(order) != len(names):
        bad("order", f"{_cut(order)} is not a permutation of the {len(names)} agents' indices")
    _check_path_numbers(doc["path"], bad)
    for i, point in enumerate(doc["path"]["points"]):
        plan = point.get("plan") if isinstance(point, dict) else None
        if not isinstance(plan, dict) or not isinstance(plan.get("default"), dict):
            bad(f"path.points[{i}].plan", "must be an object with a 'default' policy")
        by = plan.get("by_grader") or {}
        if not isinstance(by, dict):
            bad(f"path.points[{i}].plan.by_grader", "must be an object grader -> policy")
        for key, policy in [("default", plan["default"]), *((f"by_grader.{g}", p) for g, p in by.items())]:
            _check_policy(policy, names, f"path.points[{i}].plan.{key}", bad)
    if doc.get("fallback") is not None:
        _check_fallback(doc["fallback"], directory, bad)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_path_numbers(path: dict, bad) -> None:
    """The numbers a target resolves on: a string `lambda` or a point without `quality` is one line at load, not a
    500 on every request that names a target."""
    last = -math.inf
    for i, p in enumerate(path["points"]):
        if not isinstance(p, dict):
            bad(f"path.points[{i}]", f"must be an object, got {_cut(p)}")
        for key in POINT_NUMBERS + (("gain_se",) if "gain_se" in p else ()):
            if not _finite(p.get(key)):
                bad(f"path.points[{i}].{key}", f"must be a finite number, got {_cut(p.get(key))}")
        if p["lambda"] < 0 or p["lambda"] < last:
            bad(f"path.points[{i}].lambda", f"{p['lambda']!r} must be >= 0 and increase along the path")
        last = p["lambda"]
        if not isinstance(p.get("shares"), dict):
            bad(f"path.points[{i}].shares", f"must be an object agent -> share, got {_cut(p.get('shares'))}")
    bs = path.get("best_single_validation")
    if not isinstance(bs, dict) or not _finite(bs.get("quality")):
        bad("path.best_single_validation.quality", "must be a finite number (the best single agent's quality)")
    if path.get("guard_action") not in (None, "best_single", "plan", "off"):
        bad("path.guard_action", f"must be best_single, plan or off, got {_cut(path['guard_action'])}")
    if path.get("guard_z") is not None and not (_finite(path["guard_z"]) and path["guard_z"] >= 0):
        bad("path.guard_z", f"must be null or a finite number >= 0, got {_cut(path['guard_z'])}")


def _check_policy(policy, names: list[str], where: str, bad) -> None:
    stages = policy.get("stages") if isinstance(policy, dict) else None
    if not isinstance(stages, list) or not stages:
        bad(f"{where}.stages", "must be a non-empty list of stages")
    called: list[str] = []
    for t, s in enumerate(stages):
        at = f"{where}.stages[{t}]"
        agents = s.get("agents") if isinstance(s, dict) else None
        if not isinstance(agents, list) or not agents:
            bad(f"{at}.agents", "must be a non-empty list of agent names")
        for a in agents:
            if a not in names:
                bad(f"{at}.agents", f"unknown agent {_cut(a)}; the entry's agents: {', '.join(names)}")
            if a in called:
                bad(f"{at}.agents", f"agent {a!r} is named twice in the policy (it would be called and paid twice)")
            called.append(a)
        k = s.get("k", 0)
        if isinstance(k, bool) or not isinstance(k, int):
            bad(f"{at}.k", f"must be an integer, got {_cut(k)}")
        if t == len(stages) - 1:
            if len(agents) != 1 or k != 0:
                bad(at, "the last stage asks one agent and answers without condition (k 0)")
        elif not 1 <= k <= len(called):
            bad(f"{at}.k", f"{k} must lie in [1, {len(called)}] (the agents called up to this stage)")
    for key in ("skip_below", "accept_above"):
        v = policy.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                              or not 0.0 <= v <= 1.0):
            bad(f"{where}.{key}", f"must be null or a predicted success in [0, 1], got {_cut(v)}")


def _check_fallback(fb, directory: Path, bad) -> None:
    from pipeline.route.routers import ROUTER_TYPES  # loaded: a registry or fitted router is loading the cascade

    if not isinstance(fb, dict):
        bad("fallback", f"must be an object, got {_cut(fb)}")
    kind = fb.get("kind")
    if kind == "cascade":
        bad("fallback.kind", "a cascade cannot fall back on a cascade (it would load itself)")
    known = [k for k in sorted(ROUTER_TYPES) if k != "cascade"]
    if kind not in known:
        bad("fallback.kind", f"unknown router kind {_cut(kind)}; known: {', '.join(known)}")
    files = fb.get("files")
    if not isinstance(files, dict):
        bad("fallback.files", "must be an object role -> file name")
    root = Path(directory).resolve()
    for role, name in files.items():
        p = Path(directory) / name if isinstance(name, str) and name else None
        if p is None or Path(name).is_absolute() or ".." in Path(name).parts or p.is_symlink() or \
                not p.is_file() or p.resolve().parent != root:
            bad(f"fallback.files.{role}", f"{_cut(name)} must name a file directly inside the entry directory "
                                          f"{directory} (no absolute path, '..' or symlink)")
