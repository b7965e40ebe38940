"""The Dask scheduler the `collection_dask` job runs on (assets/ops.py): an address from the code location's
environment, or none (a small in-process LocalCluster)."""
from __future__ import annotations

import os

DASK_ADDRESS_ENV = "ROUTER_LITE_DASK_ADDRESS"


def dask_address() -> str | None:
    """`tcp://host:8786` when ROUTER_LITE_DASK_ADDRESS is set for the code location, else None."""
    return os.environ.get(DASK_ADDRESS_ENV) or None
