"""A fitted router as it travels along the lineage: the router (any registered kind), the routers fitted with it
(the value and cost scorers behind its operating points, the kNN baseline and the other prompt kinds the reports
measure), its OOD guard and the JSON summary of the fit.

`save` writes it into one directory through each router's own `save_files` and `load` reads it back through the
router table's `from_files`, so every kind the table knows passes from asset to asset alike (the storage layer's IO
manager calls these two; no asset opens another's files).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import RouterLiteError
from pipeline.core.io import atomic_write_json
from pipeline.route.kinds import router_class
from pipeline.route.ood import OODGuard
from pipeline.route.routers import Router

INDEX = "fitted.json"
GUARD_FILE = "guard.npz"


@dataclass
class FittedRouter:
    router: Router  # what the lineage ships and registers
    summary: dict  # JSON-able: metrics, operating points, curves (what the UI and the reports show)
    companions: dict[str, Router] = field(default_factory=dict)  # e.g. "scorer", "cost_scorer", "knn"
    guard: OODGuard | None = None

    def __getitem__(self, key):  # the summary's fields, as the assets read them
        return self.summary[key]

    def save(self, directory: str | Path) -> Path:
        """Write every router's files (each in its own sub-directory) and the index into `directory`."""
        from pipeline.route.registry import save_guard

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        index = {"summary": self.summary, "routers": {}}
        for role, r in {"router": self.router, **self.companions}.items():
            sub = directory / role
            sub.mkdir(exist_ok=True)
            index["routers"][role] = {"kind": r.kind, "dim": r.d, "agents": [{"name": a} for a in r.agents],
                                      **r.save_files(sub)}
        if self.guard is not None:
            save_guard(self.guard, directory / GUARD_FILE)
            index["guard"] = GUARD_FILE
        atomic_write_json(index, directory / INDEX)
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> FittedRouter:
        from pipeline.route.registry import load_guard

        directory = Path(directory)
        try:
            index = json.loads((directory / INDEX).read_text())
        except FileNotFoundError:
            raise RouterLiteError(f"fitted router {directory} has no {INDEX}: materialise it again") from None
        except ValueError as exc:
            raise RouterLiteError(f"fitted router {directory / INDEX} is corrupt: {exc}") from None
        routers = {role: router_class(m.get("kind")).from_files(directory / role, m)
                   for role, m in index.get("routers", {}).items()}
        if "router" not in routers:
            raise RouterLiteError(f"fitted router {directory / INDEX} names no router")
        guard = load_guard(directory / index["guard"]) if index.get("guard") else None
        return cls(routers.pop("router"), index["summary"], routers, guard)

