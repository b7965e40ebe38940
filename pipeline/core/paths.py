"""Where the bundled data lives: one `data_dir()` for every stage that reads it (task sources, replay recordings,
replication suites)."""
from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "ROUTER_LITE_DATA"
REPO_DATA = Path(__file__).resolve().parents[2] / "data"


def data_dir() -> Path:
    """`$ROUTER_LITE_DATA` when set (and not empty), else the repository's `data/` folder."""
    env = os.environ.get(DATA_ENV)
    return Path(env) if env else REPO_DATA
