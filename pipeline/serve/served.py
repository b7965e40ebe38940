"""The router an app answers with, as one immutable object (`ServedRouter`), and what all the routers an app ever
serves share (`Endpoint`: the backbone, the settings, the micro-batcher, the pool's agents and one client per agent).

A request takes `app.state.served` once, at its start, and reads everything it needs from that object (the registered
router, its agents and clients, its operating-point views and their caches, the answer-format guess, its name), so a
swap (pipeline/serve/follow.py: one assignment of `app.state.served`) never mixes two routers in one request: a request
finishes on the router it started with. `served_router` checks a router the way `build_app` always did (backbone
width, every agent in the pool, the default operating point and answer format resolve) and is the one way to make one.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeline.collect.agents import AgentSpec
from pipeline.core.errors import RouterLiteError
from pipeline.serve.batching import DecisionBatcher
from pipeline.serve.settings import ServeSettings

log = logging.getLogger(__name__)

MODEL_OWNER = "router-lite"
WARM_TEXT = "What is 2 + 2?"  # the one prompt a router is warmed with before it serves


def resolve_agents(registered, agents: Sequence[AgentSpec]) -> list[AgentSpec]:
    """The pool's AgentSpec for each of the router's agents, in the router's order (the pool says which model to
    call); an agent of the router missing from the pool -> RouterLiteError naming it."""
    by_name = {a.name: a for a in agents}
    missing = [a["name"] for a in registered.agents if a["name"] not in by_name]
    if missing:
        raise RouterLiteError(f"router {registered.name} routes to agent(s) {missing} that the pool lacks; pool "
                              f"agents: {', '.join(sorted(by_name)) or '(none)'}")
    out = []
    for a in registered.agents:
        spec = by_name[a["name"]]
        if a.get("model") not in (None, a["name"], spec.model):
            log.warning("router %s: agent %s was trained on model %s but the pool calls %s", registered.name,
                        a["name"], a.get("model"), spec.model)
        out.append(spec)
    return out


def check_backbone(registered, backbone) -> None:
    """Refuse a backbone of the wrong width; warn when it is not the one the router was trained on."""
    dim = int(registered.manifest.get("dim", registered.router.d))
    if int(getattr(backbone, "dim", dim)) != dim:
        raise RouterLiteError(f"backbone {getattr(backbone, 'model_id', backbone)!r} embeds {backbone.dim} dims but "
                              f"router {registered.name} takes {dim}")
    want_key = (registered.manifest.get("backbone") or {}).get("key")
    if want_key and getattr(backbone, "key", want_key) != want_key:
        log.warning("router %s was trained on backbone %s; serving with %s", registered.name, want_key, backbone.key)


class Endpoint:
    """What every router an app serves shares: one backbone, one micro-batcher (one embedding thread; its decision
    LRU is keyed by router name, target and text, so two routers never share a decision), the pool's agents and one
    client per agent name, made on first use and closed when the app shuts down."""

    def __init__(self, backbone, agents: Sequence[AgentSpec], client_for: Callable[[AgentSpec], Any],
                 settings: ServeSettings, log_prompts: bool = False):
        self.backbone, self.agents, self.client_for, self.settings = backbone, list(agents), client_for, settings
        self.log_prompts = bool(log_prompts)
        self.clients: dict[str, Any] = {}
        self.retired: set[str] = set()  # routers served before a swap: a request naming one gets the current router
        self.batcher = DecisionBatcher(None, backbone, settings)  # every request names its router's view
        self.upstream_opts = {"timeout": float(settings.upstream_timeout_s), "max_retries": 0}

    def clients_for(self, specs: Sequence[AgentSpec]) -> list:
        for s in specs:
            if s.name not in self.clients:
                self.clients[s.name] = self.client_for(s)  # a missing key fails here, before the router serves
        return [self.clients[s.name] for s in specs]


MAX_TARGETS = 16  # target names whose router view (and format-guessing view) is kept
MAX_CASCADE_VIEWS = 64  # (target, answer format) views of a cascade kept


class ViewCache:
    """Views of one router made on first use and kept in an LRU of `limit` keys; the `pinned` ones (the server's
    default target) are never dropped. Every key resolves however many distinct ones clients send: a view is a
    resolved point of the router's stored path, cheap to make again; a `make` that raises caches nothing."""

    def __init__(self, limit: int, pinned: dict | None = None):
        self.limit, self.items, self.pinned = limit, collections.OrderedDict(pinned or {}), set(pinned or {})

    def get(self, key, make: Callable[[], Any]):
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        value = self.items[key] = make()
        while len(self.items) > self.limit:
            del self.items[next(k for k in self.items if k not in self.pinned)]
        return value

    def __getitem__(self, key):
        return self.items[key]

    def __len__(self) -> int:
        return len(self.items)


@dataclasses.dataclass
class RouterCaches:
    """A router's views, made on first use: by target name, by (target, answer format), and the format-guessing
    views by target. They belong to one router: a swapped-in router starts with its own."""
    views: ViewCache
    cascade_views: ViewCache = dataclasses.field(default_factory=lambda: ViewCache(MAX_CASCADE_VIEWS))
    auto_views: ViewCache = dataclasses.field(default_factory=lambda: ViewCache(MAX_TARGETS))


@dataclasses.dataclass(frozen=True, eq=False)
class ServedRouter:
    """Everything a request needs about the router that answers it (the handlers of pipeline/serve/app.py read it
    where they read `app.state` before routers could change)."""
    registered: Any  # pipeline.route.registry.RegisteredRouter
    endpoint: Endpoint
    specs: list  # the pool's AgentSpec of each of the router's agents, in its order
    clients: list  # their clients, in the same order
    default_point: dict  # the operating point of a request that names none
    formats: Any  # a cascade's answer-format guess (pipeline/route/formats.py FormatGuess) or None
    origin: dict  # where it came from: path, promoted_at (unix seconds) and promoted_source (`origin_of`)
    caches: RouterCaches

    @property
    def router_name(self) -> str:
        return self.registered.name

    @property
    def model_obj(self) -> dict:
        return {"id": self.router_name, "object": "model", "created": 0, "owned_by": MODEL_OWNER}

    @property
    def default_view(self):
        return self.caches.views[self.default_point["target"]][0]

    @property
    def views(self) -> ViewCache:
        return self.caches.views

    @property
    def cascade_views(self) -> ViewCache:
        return self.caches.cascade_views

    @property
    def auto_views(self) -> ViewCache:
        return self.caches.auto_views

    @property
    def settings(self) -> ServeSettings:
        return self.endpoint.settings

    @property
    def backbone(self):
        return self.endpoint.backbone

    @property
    def batcher(self) -> DecisionBatcher:
        return self.endpoint.batcher

    @property
    def upstream_opts(self) -> dict:
        return self.endpoint.upstream_opts

    @property
    def log_prompts(self) -> bool:
        return self.endpoint.log_prompts

    def with_origin(self, origin: dict) -> ServedRouter:
        """The same router (same views and caches) with another promotion record (re-promoted to itself)."""
        return dataclasses.replace(self, origin=origin)


def served_router(registered, endpoint: Endpoint, formats=None, origin: dict | None = None) -> ServedRouter:
    """`registered` ready to serve on `endpoint`, checked: the backbone's width, every agent in the pool (their
    clients made), the server's default target among its operating points, the default answer format of a cascade.
    Any failure -> RouterLiteError naming it. `formats` is kept only for a cascade of the backbone's width."""
    settings = endpoint.settings
    check_backbone(registered, endpoint.backbone)
    specs = resolve_agents(registered, endpoint.agents)
    if hasattr(registered, "resolve_target"):
        default_point = registered.resolve_target(settings.default_target)
        default_view = registered.at(settings.default_target)
    else:
        default_point, default_view = {"target": "max-quality", "lambda": 0.0}, registered
    is_cascade = getattr(registered, "needs_grader", False)  # answer formats select a cascade's plan
    if settings.default_grader is not None and is_cascade:
        registered.cascade_at(settings.default_target, settings.default_grader)  # a bad default fails here
    if not (is_cascade and formats is not None and formats.d == int(registered.manifest.get("dim",
                                                                                            registered.router.d))):
        formats = None
    caches = RouterCaches(ViewCache(MAX_TARGETS, {default_point["target"]: (default_view, default_point)}))
    return ServedRouter(registered, endpoint, specs, endpoint.clients_for(specs), default_point, formats,
                        origin or origin_of(None, getattr(registered, "path", None)), caches)


def origin_of(entry: dict | None, path) -> dict:
    """The promotion record of the router in directory `path`: `promoted_at` (unix seconds) from the pointer entry's
    `promoted_at` (UTC ISO) when it has one (`promoted_source` "promoted_at"), else the entry's registration time
    (its manifest's mtime: the registry writes an entry once; "registered"), else now ("loaded")."""
    import datetime

    out = {"path": None if path is None else str(path), "promoted_by": (entry or {}).get("promoted_by")}
    stamp = (entry or {}).get("promoted_at")
    if isinstance(stamp, str):
        try:
            when = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            if when.tzinfo is None:
                when = when.replace(tzinfo=datetime.UTC)
            return {**out, "promoted_at": when.timestamp(), "promoted_source": "promoted_at"}
        except ValueError:
            log.warning("registry pointer: promoted_at %r is not an ISO time; using the registration time", stamp)
    try:
        return {**out, "promoted_at": (Path(path) / "manifest.json").stat().st_mtime, "promoted_source": "registered"}
    except (OSError, TypeError):
        return {**out, "promoted_at": time.time(), "promoted_source": "loaded"}


async def warm(served: ServedRouter) -> None:
    """One decision by `served` at its default target through the app's batcher: an embedding and the router's pick
    (the first forward of a backbone and the first use of a router's weights are the slow ones)."""
    await served.batcher.decide(WARM_TEXT, served.default_view, decision_tag(served, served.default_point["target"]))


def decision_tag(served: ServedRouter, tag: str) -> str:
    """The batcher's cache key prefix of a decision by `served` under view tag `tag`: the router's name first, so a
    prompt decided by one router is never answered from the cache by another."""
    return f"{served.router_name}|{tag}"
