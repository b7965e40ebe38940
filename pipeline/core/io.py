"""Atomic file writes: a crash leaves the old file or the new one, never half of either."""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp_path)` on a temp file beside `path`, fsync it, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        write(tmp_path)
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_path, 0o644)  # mkstemp creates 0600; published files are meant to be readable
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()
    return path


def atomic_write_parquet(df: pd.DataFrame, path: str | Path) -> Path:
    return atomic_write(path, lambda p: df.to_parquet(p, index=False, compression="zstd"))


def frame_version(df: pd.DataFrame) -> str:
    """The data version of a frame: the first 16 hex digits of the SHA-256 of the bytes `atomic_write_parquet`
    writes for it (pyarrow writes no time stamp, so same frame, same version). The assets give it to Dagster as
    their data version and the registry records it in a router's manifest."""
    import hashlib
    import io

    buf = io.BytesIO()
    df.to_parquet(buf, index=False, compression="zstd")
    return hashlib.sha256(buf.getvalue() + b"\0").hexdigest()[:16]


def atomic_write_text(text: str, path: str | Path) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def atomic_write_json(obj: Any, path: str | Path) -> Path:
    return atomic_write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", path)
