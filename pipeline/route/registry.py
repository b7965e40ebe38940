"""Registered routers: `registry/<name>/` with a stable name, manifest, weights and reference code.

A registered router is any router of the protocol in pipeline/route/routers.py: a trained `Head` (kind ``head``), the
kNN baseline (kind ``knn``), a cascade (kind ``cascade``) or a type added with `register_router`. The manifest records
the kind (`router_kind`; a manifest without one, written before kinds existed, is a ``head``) and `load` asks that
class to read its files.

name = `<kind>-<backbone slug>-<10 hex>` (`head-...` for heads) where the hex is a content hash of (the router's
`fingerprint`, agents, backbone key, training config, data hashes): the same inputs register under the same name;
anything else gets a new one.
Files: the router's own (`head.safetensors` for a head, `knn.safetensors` for kNN), `guard.npz` (OOD guard: training
embeddings in float16 + threshold), `manifest.json`, and for heads and cascades `reference.py` (standalone
embed-and-pick with numpy + sentence-transformers; it reads head weights and cascade plans only, so other kinds do not
get it). Never pickle.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import RouterLiteError
from pipeline.route.head import Head
from pipeline.route.kinds import router_class, router_kinds
from pipeline.route.ood import OODGuard

# the served pointer registry/latest.json (pipeline/route/pointer.py): its readers are this module's API too
from pipeline.route.pointer import LATEST, latest_entry, latest_path, mark_latest  # noqa: F401
from pipeline.route.routers import ROUTER_TYPES, Router, capability

MANIFEST = "manifest.json"
WEIGHTS = "head.safetensors"
GUARD = "guard.npz"
SCORER = "scorer.safetensors"  # value scorer (predicted rewards) behind the cost-aware operating points
COST_SCORER = "cost_scorer.safetensors"  # predicted cost per query and agent (the λ·cost term)
REFERENCE_SRC = Path(__file__).with_name("reference_router.py")


def _slug(backbone_id: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", backbone_id.split("/")[-1].lower()).strip("-")[:40]


def content_hash(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


@dataclass
class RegisteredRouter:
    path: Path
    manifest: dict
    router: Router  # a Head, a KnnRouter, a CascadeRouter or any registered router type (pipeline/route/routers.py)
    guard: OODGuard
    best_single: int
    scorer: Head | None = None
    cost_scorer: Head | None = None

    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def agents(self) -> list[dict]:
        return self.manifest["agents"]

    @property
    def kind(self) -> str:
        return self.manifest.get("router_kind", "head")

    @property
    def operating_points(self) -> dict | None:
        return self.manifest.get("operating_points")

    def resolve_target(self, target=None) -> dict:
        """The operating point (pipeline.route.targets.resolve) a target selects on this router's stored λ path."""
        from pipeline.route.targets import parse_target, resolve

        t = parse_target(target)
        if t.kind == "max-quality" and not self.operating_points:
            return {"target": t.name, "lambda": 0.0}
        if not self.operating_points or self.scorer is None:
            raise RouterLiteError(f"router {self.name} has no operating points (registered before targets existed); "
                                  f"only target max-quality is available")
        return resolve(t, self.operating_points)

    def at(self, target) -> TargetedRouter:
        """This router at one operating point: an object with `.name` and `.route(X)` (what the server's
        DecisionBatcher uses)."""
        return TargetedRouter(self, self.resolve_target(target))

    @property
    def needs_grader(self) -> bool:
        """Whether requests name an answer format to be routed by this router (`cascade_at`)."""
        return capability(self.router, "needs_grader")

    def cascade_at(self, target, grader: str):
        """This router at one operating point for requests of answer format `grader`, for a kind that
        `needs_grader` (a cascade: pipeline.route.cascade.CascadeView; `route(X)`: -1 = run the stages, j >= 0 =
        ask agent j alone: the prompt shortcuts, or the OOD guard's best single agent)."""
        if not self.needs_grader:
            raise RouterLiteError(f"router {self.name} is a {self.kind}, not a cascade")
        return self.router.view(self, target, grader)

    def route(self, X: np.ndarray, target=None) -> tuple[np.ndarray, np.ndarray]:
        """(picked agent index per row after the OOD guard, mask where the guard fired) at a target
        (None = max-quality: the shipped router; see pipeline.route.targets)."""
        return self.route_at(X, self.resolve_target(target) if target is not None else {"lambda": 0.0})

    def route_at(self, X: np.ndarray, point: dict) -> tuple[np.ndarray, np.ndarray]:
        """`route` at an operating point already resolved by `resolve_target` (a server resolves once per target,
        not once per batch)."""
        fired = self.guard.fires(X)
        lam = point["lambda"]
        if lam > 0:
            from pipeline.route.targets import cost_aware_pick
            from pipeline.route.value import pick_costs

            cost = pick_costs(self.cost_scorer, X, self.operating_points["agent_cost"])
            picks = cost_aware_pick(self.scorer.scores(X), cost, lam, self.operating_points.get("allowed"))
        else:
            picks = self.router.pick(X)
        picks[fired] = self.best_single
        return picks, fired


@dataclass
class TargetedRouter:
    registered: RegisteredRouter
    point: dict  # pipeline.route.targets.resolve output (target, lambda, ...)

    @property
    def name(self) -> str:
        return self.registered.name

    def route(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.registered.route_at(X, self.point)


def save_guard(guard: OODGuard, path: Path) -> None:
    """The guard's reference embeddings (float16: the guard only thresholds cosine distances) and threshold."""
    with open(path, "wb") as fh:
        np.savez(fh, X=guard.X.astype(np.float16), threshold=np.float64(guard.threshold), k=np.int64(guard.k),
                 quantile=np.float64(guard.quantile))


def load_guard(path: Path) -> OODGuard:
    try:
        with np.load(path, allow_pickle=False) as z:
            guard = OODGuard(k=int(z["k"]), quantile=float(z["quantile"]))
            guard.X = np.asarray(z["X"], dtype=np.float32)
            guard.threshold = float(z["threshold"])
    except FileNotFoundError:
        raise RouterLiteError(f"{path} is missing") from None
    except Exception as exc:
        raise RouterLiteError(f"{path} is corrupt: {type(exc).__name__}: {exc}") from None
    return guard


def _digest(router: Router, guard: OODGuard, scorer: Head | None, cost_scorer: Head | None,
            operating_points: dict | None, settings_after: list) -> str:
    """The entry's content hash: array contents, not file bytes (zip (npz) entries carry write times)."""
    arrays, settings = router.fingerprint()
    return content_hash(*arrays,
                        guard.X.astype(np.float16).tobytes(), repr((guard.threshold, guard.k, guard.quantile)),
                        b"" if scorer is None else np.ascontiguousarray(scorer.to_vector(), np.float32).tobytes(),
                        b"" if cost_scorer is None else np.ascontiguousarray(cost_scorer.to_vector(),
                                                                            np.float32).tobytes(),
                        json.dumps(operating_points, sort_keys=True, default=str),
                        json.dumps([*settings, *settings_after], sort_keys=True, default=str))


@dataclass(frozen=True)
class PromptFit:
    """What an entry carries of the prompt router's fit, whatever kind it registers: the OOD guard, the best single
    agent (index), the value and cost scorers and the operating points (None: a router without targets)."""

    guard: OODGuard
    best_single: int
    scorer: Head | None = None
    cost_scorer: Head | None = None
    operating_points: dict | None = None

    @classmethod
    def of(cls, fitted) -> PromptFit:
        """The parts of a prompt router's fit `fitted` (pipeline.route.fitted.FittedRouter)."""
        return cls(fitted.guard, fitted["best_single"], fitted.companions.get("scorer"),
                   fitted.companions.get("cost_scorer"), fitted["operating_points"])


def register(root: Path, router: Router, prompt: PromptFit, *, backbone: dict, agents: list[dict], training: dict,
             data_hashes: dict, metrics: dict) -> Path:
    """Write `router` (any registered kind) with the `prompt` router's guard, scorers and operating points under
    `root/<name>/` (atomically: temp dir, then rename) and return that directory."""
    guard, best_single, scorer, cost_scorer = prompt.guard, prompt.best_single, prompt.scorer, prompt.cost_scorer
    operating_points = prompt.operating_points
    kind = getattr(router, "kind", None)
    if ROUTER_TYPES.get(kind) is not type(router):
        raise RouterLiteError(f"{type(router).__name__} is not a registered router type (kind {kind!r}; known kinds: "
                              f"{', '.join(router_kinds())}); see pipeline.route.routers.register_router")
    if [a["name"] for a in agents] != list(router.agents or [a["name"] for a in agents]):
        raise RouterLiteError(f"agents {[a['name'] for a in agents]} do not match the router's {router.agents}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".register.", dir=root))
    try:
        fields = dict(router.save_files(tmp))
        router_files = fields.pop("files")
        taken = sorted(set(fields) & {"name", "format_version", "router_kind", "backbone", "dim", "agents",
                                      "best_single", "ood_guard", "training", "data_hashes", "metrics",
                                      "operating_points"})
        if taken or set(router_files) & {"guard", "reference", "scorer", "cost_scorer"}:
            raise RouterLiteError(f"router kind {kind!r}: save_files returned manifest fields the registry owns "
                                  f"({taken or sorted(router_files)})")
        save_guard(guard, tmp / GUARD)
        if scorer is not None:
            scorer.save(tmp / SCORER)
        if cost_scorer is not None:
            cost_scorer.save(tmp / COST_SCORER)
        digest = _digest(router, guard, scorer, cost_scorer, operating_points,
                         [agents, backbone, training, data_hashes])
        name = f"{kind}-{_slug(backbone['id'])}-{digest[:10]}"
        manifest = {
            "name": name, "format_version": 1, "router_kind": kind, "backbone": backbone, "dim": router.d, **fields,
            "agents": agents, "best_single": agents[best_single]["name"],
            "ood_guard": {"k": guard.k, "quantile": guard.quantile, "threshold": guard.threshold,
                          "n_reference": int(len(guard.X))},
            "training": training, "data_hashes": data_hashes, "metrics": metrics,
            "files": {**router_files, "guard": GUARD,
                      **({"reference": "reference.py"} if capability(router, "reference_code") else {}),
                      **({"scorer": SCORER} if scorer is not None else {}),
                      **({"cost_scorer": COST_SCORER} if cost_scorer is not None else {})},
        }
        if operating_points is not None:
            manifest["operating_points"] = operating_points
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")
        if capability(router, "reference_code"):  # it applies head weights and reads cascade plans only
            shutil.copyfile(REFERENCE_SRC, tmp / "reference.py")
        for f in tmp.iterdir():
            f.chmod(0o644)
        tmp.chmod(0o755)
        final = root / name
        if final.exists():  # same content hash → same router: keep the existing entry
            shutil.rmtree(tmp)
            return final
        tmp.rename(final)
        return final
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def register_fitted(root: Path, router: Router, fitted, *, backbone: dict, training: dict, data_hashes: dict,
                    metrics: dict, models: dict[str, str] | None = None) -> Path:
    """The one fit -> register path (the lineage's assets and `router-lite train`): `router` (the shipped prompt
    router, or a cascade over it) registered with what the prompt router's fit `fitted` (a
    pipeline.route.fitted.FittedRouter) carries: OOD guard, best single agent, value and cost scorers, operating
    points. `backbone`: `Backbone.manifest_fields`; `models`: agent name -> model it calls (default: the name)."""
    models = models or {}
    return register(root, router, PromptFit.of(fitted), backbone=backbone,
                    agents=[{"name": a, "model": models.get(a, a)} for a in router.agents], training=training,
                    data_hashes=data_hashes, metrics=metrics)


def _check_manifest(mf: Path, m) -> None:
    """The keys `load`, `route` and `serve` read, present and of the right kind: one error naming the key."""
    if not isinstance(m, dict):
        raise RouterLiteError(f"{mf} is corrupt: a JSON object is expected, got {type(m).__name__}")
    for key, kind in (("name", str), ("backbone", dict), ("dim", int), ("agents", list), ("best_single", str)):
        if key not in m:
            raise RouterLiteError(f"{mf}: required key {key!r} is missing")
        if not isinstance(m[key], kind) or isinstance(m[key], bool):
            raise RouterLiteError(f"{mf}: key {key!r} must be a {kind.__name__}, got {type(m[key]).__name__}")
    if not isinstance(m["backbone"].get("id"), str) or not m["backbone"]["id"]:
        raise RouterLiteError(f"{mf}: required key 'backbone.id' (the embedding model) is missing")
    for i, a in enumerate(m["agents"]):
        if not isinstance(a, dict) or not isinstance(a.get("name"), str) or not isinstance(a.get("model"), str):
            raise RouterLiteError(f"{mf}: agents[{i}] must be an object with string 'name' and 'model'")
    if not isinstance(m.get("files", {}), dict):
        raise RouterLiteError(f"{mf}: key 'files' must be an object of file names")


def _check_operating_points(mf: Path, m: dict) -> None:
    """`operating_points` (when present): what `resolve_target` and `route_at` read, of the right kinds, so a
    tampered manifest is one error at load (route, serve start-up), not an IndexError at the first request."""
    if "operating_points" not in m:
        return
    op, k = m["operating_points"], len(m["agents"])

    def bad(key: str, want: str) -> RouterLiteError:
        return RouterLiteError(f"{mf}: operating_points{key} must be {want}")

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if not isinstance(op, dict):
        raise bad("", f"an object (the λ path written by training), got {type(op).__name__}")
    pts = op.get("points")
    if not isinstance(pts, list) or not pts:
        raise bad(".points", "a non-empty list of points")
    last = -1.0
    for i, p in enumerate(pts):
        if not isinstance(p, dict):
            raise bad(f".points[{i}]", "an object")
        for key in ("lambda", "quality", "cost_per_1k", "gain_high"):
            if not number(p.get(key)):
                raise bad(f".points[{i}].{key}", f"a finite number, got {type(p.get(key)).__name__}")
        if p["lambda"] < 0 or p["lambda"] < last:
            raise bad(f".points[{i}].lambda", "≥ 0 and increasing along the path")
        last = p["lambda"]
        missing = [key for key in ("ci_low", "ci_high", "gain", "gain_low", "shares") if key not in p]
        if missing:
            raise bad(f".points[{i}]", f"an object with {', '.join(missing)}")
    bs = op.get("best_single_validation")
    if not isinstance(bs, dict) or not number(bs.get("quality")):
        raise bad(".best_single_validation.quality", "a finite number")
    cost = op.get("agent_cost")
    if not isinstance(cost, list) or len(cost) != k or not all(number(c) for c in cost):
        raise bad(".agent_cost", f"a list of {k} numbers (one per agent)")
    allowed = op.get("allowed")
    if allowed is not None and (not isinstance(allowed, list) or len(allowed) != k
                                or not all(isinstance(a, bool) for a in allowed)):
        raise bad(".allowed", f"null or a list of {k} booleans")


def _no_links(entry_dir: Path) -> None:
    """No file of the entry directory is a symlink: the loader also opens files the manifest does not name (the
    router kind's default weights file, e.g. `head.safetensors` when `files.weights` is absent)."""
    for f in sorted(entry_dir.iterdir()):
        if f.is_symlink():
            raise RouterLiteError(f"{f}: a symlink in the entry directory {entry_dir}; a registered router holds only "
                                  "plain files")


def _inside(entry_dir: Path, name, mf: Path, key: str) -> Path:
    """A file the manifest names: a plain relative name that stays inside the entry directory, not a symlink
    (a manifest must not make `load` read files elsewhere)."""
    if not isinstance(name, str) or not name:
        raise RouterLiteError(f"{mf}: {key} must be a file name, got {name!r}")
    f = entry_dir / name
    root = entry_dir.resolve()
    if Path(name).is_absolute() or ".." in Path(name).parts or f.is_symlink() or f.is_dir() or \
            not f.resolve().is_relative_to(root) or f.resolve().parent != root:
        raise RouterLiteError(f"{mf}: {key} {name!r} must name a file directly inside the entry directory "
                              f"{entry_dir} (no absolute path, '..' or symlink)")
    return f


def load(path: str | Path) -> RegisteredRouter:
    """Load a registered router; any missing, corrupt or mismatched file → one error naming it."""
    path = Path(path)
    mf = path / MANIFEST
    if not mf.is_file():
        raise RouterLiteError(f"{path} is not a registered router: {MANIFEST} is missing")
    try:
        manifest = json.loads(mf.read_text())
    except ValueError as exc:
        raise RouterLiteError(f"{mf} is corrupt: {exc}") from None
    _check_manifest(mf, manifest)
    _check_operating_points(mf, manifest)
    names = [a["name"] for a in manifest["agents"]]
    dim = int(manifest["dim"])
    files = manifest.get("files", {})
    kind = manifest.get("router_kind", "head")  # manifests from before router kinds hold heads
    try:
        cls = router_class(kind)
    except RouterLiteError as exc:
        raise RouterLiteError(f"{mf}: {exc}") from None
    for role, fname in files.items():  # every file the manifest names stays inside the entry
        _inside(path, fname, mf, f"files.{role}")
    _no_links(path)  # ... and so does every file the loader opens without the manifest naming it
    router = cls.from_files(path, manifest)
    gf = _inside(path, files.get("guard", GUARD), mf, "files.guard")
    guard = load_guard(gf)
    if guard.X.ndim != 2 or guard.X.shape[1] != dim:
        raise RouterLiteError(f"{gf}: reference embeddings of shape {guard.X.shape} do not match dim {dim}")
    if manifest.get("best_single") not in names:
        raise RouterLiteError(f"{mf}: best_single {manifest.get('best_single')!r} is not one of the agents {names}")
    scorer = None
    if manifest.get("files", {}).get("scorer"):
        scorer = Head.load(path / manifest["files"]["scorer"], d=dim, K=len(names), agents=names)
    cost_scorer = None
    if manifest.get("files", {}).get("cost_scorer"):
        cost_scorer = Head.load(path / manifest["files"]["cost_scorer"], d=dim, K=len(names), agents=names)
    return RegisteredRouter(path, manifest, router, guard, names.index(manifest["best_single"]), scorer, cost_scorer)
