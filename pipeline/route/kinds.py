"""The router table with its built-in kinds loaded: look a kind up by name here.

Importing this module registers ``head`` (pipeline/route/head.py), ``knn`` (pipeline/route/knn.py), ``cluster``
(pipeline/route/cluster.py) and ``cascade`` (pipeline/route/cascade.py); a kind added elsewhere registers when its
module is imported (`pipeline.route.routers.register_router`). The table itself and the protocol live in
pipeline/route/routers.py, which imports no kind: the kinds import it, this module imports them, and no import
circle joins them.
"""
from __future__ import annotations

from contextlib import AbstractContextManager

from pipeline.core.tables import Table
from pipeline.route import cascade, cluster, head, knn  # noqa: F401 - each registers its kind
from pipeline.route.routers import ROUTER_TYPES


def router_class(kind: str) -> type:
    """The class registered under `kind`; an unknown kind -> one error listing the known ones."""
    return ROUTER_TYPES.lookup(kind)


def router_kinds() -> list[str]:
    return sorted(ROUTER_TYPES)


def routers_restored() -> AbstractContextManager[Table[type]]:
    """The router table as it was on entry (built-ins loaded), restored on exit (tests that register toy kinds)."""
    return ROUTER_TYPES.restored()
