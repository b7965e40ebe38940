"""One safetensors file of a table router (kNN, cluster): two 2-D float tensors whose rows pair up (reference
embeddings or centroids; their per-agent rewards or scores), a `kind` tag, the agent names and a few integers in its
metadata. `write_table_file` writes it atomically; `read_table_file` reads it back and refuses, with one
`RouterLiteError` naming the file, a missing file, corrupt bytes, another kind, bad shapes or non-finite values, and
a file that does not fit the registry entry's manifest (its width, its agents)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.core.errors import RouterLiteError


def write_table_file(path: Path, kind: str, tensors: dict[str, np.ndarray], agents: list[str], **ints: int) -> None:
    """`tensors` (name -> 2-D array, written as float32) with metadata kind, agents and `ints` (as strings)."""
    from safetensors.numpy import save_file

    from pipeline.core.io import atomic_write

    arrays = {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}
    meta = {"kind": kind, **{k: str(int(v)) for k, v in ints.items()}, "agents": json.dumps(agents)}
    atomic_write(Path(path), lambda p: save_file(arrays, str(p), metadata=meta))


def read_table_file(path: Path, kind: str, names: tuple[str, str], manifest: dict, what: str,
                    ) -> tuple[np.ndarray, np.ndarray, dict]:
    """(rows tensor, per-agent tensor, metadata) of the file at `path`, checked against `manifest` (`dim`, `agents`);
    `names` are the two tensors' keys, `what` the router's name in messages ("kNN router")."""
    from safetensors import safe_open

    f = Path(path)
    agents_wanted = [a["name"] for a in manifest["agents"]]
    if not f.is_file():
        raise RouterLiteError(f"{what} file {f} does not exist")
    try:
        with safe_open(str(f), framework="numpy") as fh:
            meta = dict(fh.metadata() or {})
            A, B = np.array(fh.get_tensor(names[0])), np.array(fh.get_tensor(names[1]))
        if meta.get("kind") != kind:
            raise ValueError(f"not a {kind} file (metadata kind {meta.get('kind')!r})")
        agents = json.loads(meta.get("agents", "null"))
    except Exception as e:  # corrupt bytes, bad header, missing tensors, ...
        raise RouterLiteError(f"{what} file {f} is corrupt: {type(e).__name__}: {e}") from None
    if A.ndim != 2 or B.ndim != 2 or len(A) != len(B) or len(A) == 0 or not np.all(np.isfinite(A)) \
            or not np.all(np.isfinite(B)):
        raise RouterLiteError(f"{what} file {f} is invalid: {names[0]} {A.shape}, {names[1]} {B.shape}")
    if A.shape[1] != int(manifest["dim"]) or B.shape[1] != len(agents_wanted) or (
            agents is not None and agents != agents_wanted):
        raise RouterLiteError(f"{what} file {f} ({A.shape[1]} dims, agents {agents}) does not fit the manifest "
                              f"({manifest['dim']} dims, agents {agents_wanted})")
    return A.astype(np.float32), B.astype(np.float32), meta
