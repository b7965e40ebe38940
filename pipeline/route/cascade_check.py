"""The door of a cascade entry's `cascade.json` (pipeline/route/cascade.py): checked at load, like the manifest's
operating points, so `route` says one line and `serve` refuses to start instead of answering 500 to every graded
request. Every problem is one RouterLiteError naming the file and the field:

- `agents` the entry's agents, `order` a permutation of them;
- each plan's policies (`path.points[i].plan.default`, `... .by_grader.<g>`): stages of known agents, none named twice
  (a duplicate would be called and paid twice), `1 <= k <=` the agents called so far for a stage before the last, the
  last one agent with `k` 0; `skip_below` / `accept_above` null or a number in [0, 1];
- `fallback` (a prompt router of another kind): a known kind other than `cascade` (a cascade falling back on itself
  would load itself forever), its `files` plain names of files directly inside the entry directory.
"""
from __future__ import annotations

import math
from pathlib import Path

from pipeline.core.errors import RouterLiteError


def _cut(v, limit: int = 60) -> str:
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "..."


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
    from pipeline.route.routers import router_kinds

    if not isinstance(fb, dict):
        bad("fallback", f"must be an object, got {_cut(fb)}")
    kind = fb.get("kind")
    if kind == "cascade":
        bad("fallback.kind", "a cascade cannot fall back on a cascade (it would load itself)")
    known = [k for k in router_kinds() if k != "cascade"]
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
