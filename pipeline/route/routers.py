"""What every router type is, and the name -> class table the registry and the server read.

A router maps query embeddings ``X (n, d)`` to one score per pool member (``scores``: (n, K), higher is better) and
picks one agent per row (``pick``: (n,) indices into ``agents``). Fitting (pipeline/route/fit.py,
pipeline/report/replication.py), the frontier (`pipeline.report.frontier.router_policies`), the registry
(pipeline/route/registry.py) and the server (pipeline/serve/app.py, through the registry's `route`) use only this
protocol, so a trained head (`pipeline.route.head.Head`, kind ``head``) and the kNN baseline
(`pipeline.route.knn.KnnRouter`, kind ``knn``) are interchangeable, and a new type needs one class and one
``@register_router("name")`` line (docs/architecture.md, "How to add a router type"). Looking a kind up by name
(`router_class`, `router_kinds`, `routers_restored`) is pipeline/route/kinds.py's, which loads the built-in kinds.

Files: ``save_files(directory)`` writes the router's files into a directory and returns the manifest fields that
describe them (at least ``files``: role -> file name, directly inside the directory); the classmethod
``from_files(directory, manifest)`` reads them back from a manifest holding those fields plus ``dim`` and
``agents`` (the registry's manifest). The names differ from `Head.save` / `Head.load`, which keep their one-file
signatures (the value scorers are saved with them). ``fingerprint()`` returns (array bytes, JSON-able settings)
that determine the picks: the registry's content hash, so the same router registers under the same name.

Capabilities (`CAPABILITIES`, read with `capability(router, name)`): what a kind needs beyond the protocol, declared
as class attributes (``needs_answers = True`` on the cascade), so that no code outside a kind's module compares a
kind's name.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from pipeline.core.errors import RouterLiteError
from pipeline.core.tables import Table


@runtime_checkable
class Router(Protocol):
    kind: ClassVar[str]  # the name it is registered under; recorded in the registry's manifest
    agents: list[str] | None  # agent names, in score-column order

    @property
    def d(self) -> int: ...  # input (embedding) dimension

    @property
    def K(self) -> int: ...  # number of agents (score columns)

    def scores(self, X: np.ndarray) -> np.ndarray: ...

    def pick(self, X: np.ndarray) -> np.ndarray: ...

    def save_files(self, directory: str | Path) -> dict: ...

    @classmethod
    def from_files(cls, directory: str | Path, manifest: dict) -> Router: ...

    def fingerprint(self) -> tuple[list[bytes], list]: ...


# Built-in kinds register on import of pipeline/route/kinds.py (which `router_class` lives in): this module imports
# no kind, so no import circle joins the table and the kinds' modules.
ROUTER_TYPES: Table[type] = Table("router kind")


def register_router(kind: str, replace: bool = False) -> Callable[[type], type]:
    """Class decorator: ``@register_router("knn") class KnnRouter: ...`` makes the registry able to load it."""
    ROUTER_TYPES.check_name(kind)  # a bad name fails here, not when the class is decorated

    def add(cls: type) -> type:
        missing = [m for m in ("scores", "pick", "save_files", "from_files", "fingerprint") if not hasattr(cls, m)]
        if missing:
            raise RouterLiteError(f"router type {cls.__name__} lacks {missing} (see pipeline.route.routers.Router)")
        ROUTER_TYPES.register(kind, cls, replace=replace)
        cls.kind = kind
        return cls

    return add


# What a router kind needs or offers beyond the protocol: class attributes, False when a class does not set them.
# Code outside a kind's module asks these (`capability`), never the kind's name.
CAPABILITIES = {
    "needs_answers": "fitted from the agents' recorded answers (their agreement), not from the rewards alone",
    "needs_grader": "a request names its answer format (grader) to be routed by it; `view(registered, target, "
                    "grader)` gives the routing of one (target, grader)",
    "reference_code": "its registry entry gets the standalone reference.py (it reads head weights / cascade plans)",
}


def capability(router, name: str) -> bool:
    """Whether `router` (an instance or a class) declares capability `name` (CAPABILITIES)."""
    if name not in CAPABILITIES:
        raise RouterLiteError(f"unknown router capability {name!r}; known: {', '.join(CAPABILITIES)}")
    return bool(getattr(router if isinstance(router, type) else type(router), name, False))


def check_scores(router, X: np.ndarray) -> np.ndarray:
    """`router.scores(X)` as an (n, K) float array; a router that answers another shape -> one error naming it."""
    S = np.asarray(router.scores(X))
    n = len(X)
    if S.ndim != 2 or S.shape[0] != n or (getattr(router, "agents", None) and S.shape[1] != len(router.agents)):
        raise RouterLiteError(f"router {type(router).__name__} (kind {getattr(router, 'kind', '?')!r}) returned scores "
                              f"of shape {S.shape} for {n} queries")
    return S
