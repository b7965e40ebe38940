"""The routing head: a tiny function from a query embedding to one score per pool member (agent).

Two shapes, both flat parameter vectors for CMA-ES (`Head.from_vector` / `Head.to_vector`):

* linear (``hidden_dim=0``): ``scores = z @ W1 + b1`` with ``W1 (d, K)``, ``b1 (K,)`` -> ``(d + 1) * K`` parameters
  (2048 x 5 -> 10,245).  Row ``j`` of the flat vector reshaped to ``(d + 1, K)`` is input feature ``j``; the last
  row is the bias.
* one hidden layer (``hidden_dim=H > 0``): ``scores = act(z @ W1 + b1) @ W2 + b2`` with ``act`` = tanh or relu ->
  ``(d + 1) * H + (H + 1) * K`` parameters; the flat vector is layer 1 as ``(d + 1, H)`` then layer 2 as
  ``(H + 1, K)``.

``z`` is the embedding, optionally standardised with a per-feature ``mean``/``std`` stored with the head (not
counted in the parameters: they are fitted on the training embeddings, not searched).  ``pick(X)`` is the argmax of
the scores (ties -> the lowest agent index).

Files: ``save(path)`` writes safetensors (``head.safetensors`` inside a directory, or the ``.safetensors`` / ``.npz``
file named); never pickle.  ``load(path)`` checks every shape and value and raises one `RouterLiteError` naming the
file when it is corrupt or does not fit.

Router protocol (pipeline/route/routers.py, kind ``head``): ``save_files(directory)`` / ``from_files(directory,
manifest)`` are the registry's view of the same file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from pipeline.core.errors import RouterLiteError
from pipeline.route.routers import register_router

ACTIVATIONS = ("tanh", "relu")
FILE_NAME = "head.safetensors"
FORMAT_VERSION = "1"


def n_params(d: int, K: int, hidden_dim: int = 0) -> int:
    """Number of searched parameters of a head with input dim `d`, `K` agents and `hidden_dim` hidden units."""
    if d < 1 or K < 1 or hidden_dim < 0:
        raise RouterLiteError(f"bad head shape d={d}, K={K}, hidden_dim={hidden_dim}")
    if hidden_dim == 0:
        return (d + 1) * K
    return (d + 1) * hidden_dim + (hidden_dim + 1) * K


def _act(name: str, a: np.ndarray) -> np.ndarray:
    return np.tanh(a) if name == "tanh" else np.maximum(a, 0.0)


@register_router("head")
@dataclass
class Head:
    """Linear head (W2 is None) or one-hidden-layer head; see the module docstring."""

    reference_code: ClassVar[bool] = True  # its entry gets reference.py (pipeline.route.routers.CAPABILITIES)

    W1: np.ndarray
    b1: np.ndarray
    W2: np.ndarray | None = None
    b2: np.ndarray | None = None
    activation: str = "tanh"
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    agents: list[str] | None = field(default=None)

    def __post_init__(self) -> None:
        self.W1 = np.asarray(self.W1, dtype=np.float32)
        self.b1 = np.asarray(self.b1, dtype=np.float32)
        if (self.W2 is None) != (self.b2 is None):
            raise RouterLiteError("a hidden-layer head needs both W2 and b2")
        if self.W2 is not None:
            self.W2 = np.asarray(self.W2, dtype=np.float32)
            self.b2 = np.asarray(self.b2, dtype=np.float32)
        if (self.mean is None) != (self.std is None):
            raise RouterLiteError("input standardisation needs both mean and std")
        if self.mean is not None:
            self.mean = np.asarray(self.mean, dtype=np.float32)
            self.std = np.asarray(self.std, dtype=np.float32)
        if self.activation not in ACTIVATIONS:
            raise RouterLiteError(f"unknown activation {self.activation!r}; use one of {ACTIVATIONS}")
        self._check_shapes()

    # ---- shape ---------------------------------------------------------------------------------------------
    def _check_shapes(self) -> None:
        if self.W1.ndim != 2 or self.b1.shape != (self.W1.shape[1],):
            raise RouterLiteError(f"head layer 1 shapes W1 {self.W1.shape}, b1 {self.b1.shape} do not fit")
        if self.W2 is not None:
            H = self.W1.shape[1]
            if self.W2.ndim != 2 or self.W2.shape[0] != H or self.b2.shape != (self.W2.shape[1],):
                raise RouterLiteError(
                    f"head layer 2 shapes W2 {self.W2.shape}, b2 {self.b2.shape} do not fit hidden_dim {H}")
        if self.mean is not None and (self.mean.shape != (self.d,) or self.std.shape != (self.d,)):
            raise RouterLiteError(f"standardisation mean/std shapes {self.mean.shape}/{self.std.shape} != ({self.d},)")
        if self.mean is not None and not np.all(self.std > 0):
            raise RouterLiteError("standardisation std must be > 0 everywhere")
        if self.agents is not None and len(self.agents) != self.K:
            raise RouterLiteError(f"{len(self.agents)} agent names for a head with K={self.K} outputs")

    @property
    def d(self) -> int:
        return int(self.W1.shape[0])

    @property
    def hidden_dim(self) -> int:
        return 0 if self.W2 is None else int(self.W1.shape[1])

    @property
    def K(self) -> int:
        return int(self.W1.shape[1] if self.W2 is None else self.W2.shape[1])

    @property
    def n_params(self) -> int:
        return n_params(self.d, self.K, self.hidden_dim)

    # ---- flat vector (CMA-ES) ------------------------------------------------------------------------------
    @classmethod
    def from_vector(cls, theta: np.ndarray, d: int, K: int, hidden_dim: int = 0, activation: str = "tanh",
                    mean: np.ndarray | None = None, std: np.ndarray | None = None,
                    agents: list[str] | None = None) -> Head:
        theta = np.asarray(theta, dtype=np.float64).ravel()
        n = n_params(d, K, hidden_dim)
        if theta.size != n:
            raise RouterLiteError(f"parameter vector has {theta.size} values; d={d}, K={K}, "
                                  f"hidden_dim={hidden_dim} needs {n}")
        if hidden_dim == 0:
            M = theta.reshape(d + 1, K)
            return cls(M[:d], M[d], activation=activation, mean=mean, std=std, agents=agents)
        n1 = (d + 1) * hidden_dim
        M1 = theta[:n1].reshape(d + 1, hidden_dim)
        M2 = theta[n1:].reshape(hidden_dim + 1, K)
        return cls(M1[:d], M1[d], M2[:hidden_dim], M2[hidden_dim], activation=activation, mean=mean, std=std,
                   agents=agents)

    def to_vector(self) -> np.ndarray:
        parts = [np.vstack([self.W1, self.b1[None, :]]).ravel()]
        if self.W2 is not None:
            parts.append(np.vstack([self.W2, self.b2[None, :]]).ravel())
        return np.concatenate(parts).astype(np.float64)

    # ---- inference -----------------------------------------------------------------------------------------
    def standardise(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self.d:
            raise RouterLiteError(f"embeddings of shape {X.shape} do not fit a head with input dim {self.d}")
        return X if self.mean is None else (X - self.mean) / self.std

    def scores(self, X: np.ndarray) -> np.ndarray:
        """(n, K) agent scores of the (n, d) embeddings `X`."""
        Z = self.standardise(X)
        A = Z @ self.W1 + self.b1
        if self.W2 is None:
            return A
        return _act(self.activation, A) @ self.W2 + self.b2

    def pick(self, X: np.ndarray) -> np.ndarray:
        """(n,) index of the chosen agent per row (argmax of the scores; ties -> lowest index)."""
        return np.argmax(self.scores(X), axis=1)

    # ---- files ---------------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the head (atomically). A directory (or a path without suffix) gets ``head.safetensors`` inside;
        a ``.safetensors`` or ``.npz`` path is written as named. Returns the file written."""
        from pipeline.core.io import atomic_write

        f = _file_of(path, for_write=True)
        tensors = {"W1": self.W1, "b1": self.b1}
        if self.W2 is not None:
            tensors.update(W2=self.W2, b2=self.b2)
        if self.mean is not None:
            tensors.update(mean=self.mean, std=self.std)
        tensors = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}
        meta = {"format_version": FORMAT_VERSION, "kind": "router-lite-head", "activation": self.activation,
                "d": str(self.d), "K": str(self.K), "hidden_dim": str(self.hidden_dim),
                "agents": json.dumps(self.agents)}
        if f.suffix == ".npz":
            def write(p: Path) -> None:
                with open(p, "wb") as fh:  # np.savez on a file object: no ".npz" appended to the temp name
                    np.savez(fh, **tensors, __meta__=np.array(json.dumps(meta)))
        else:
            def write(p: Path) -> None:
                from safetensors.numpy import save_file
                save_file(tensors, str(p), metadata=meta)
        return atomic_write(f, write)

    @classmethod
    def load(cls, path: str | Path, d: int | None = None, K: int | None = None,
             agents: list[str] | None = None) -> Head:
        """Read a head written by `save`; `d`, `K`, `agents` (optional) are checked against the file."""
        f = _file_of(path, for_write=False)
        if not f.is_file():
            raise RouterLiteError(f"head file {f} does not exist")
        try:
            tensors, meta = _read(f)
            if meta.get("kind") != "router-lite-head":
                raise ValueError("not a router-lite head file (metadata kind missing)")
            allowed = {"W1", "b1", "W2", "b2", "mean", "std"}
            if not {"W1", "b1"} <= set(tensors) or set(tensors) - allowed:
                raise ValueError(f"unexpected tensors {sorted(tensors)}")
            for k, v in tensors.items():
                if v.dtype.kind != "f" or not np.all(np.isfinite(v)):
                    raise ValueError(f"tensor {k} is not finite float data")
            head = cls(tensors["W1"], tensors["b1"], tensors.get("W2"), tensors.get("b2"),
                       activation=meta.get("activation", "tanh"), mean=tensors.get("mean"), std=tensors.get("std"),
                       agents=json.loads(meta.get("agents", "null")))
            if (str(head.d), str(head.K), str(head.hidden_dim)) != (meta.get("d"), meta.get("K"),
                                                                    meta.get("hidden_dim")):
                raise ValueError(f"tensor shapes (d={head.d}, K={head.K}, hidden_dim={head.hidden_dim}) disagree "
                                 f"with the metadata (d={meta.get('d')}, K={meta.get('K')}, "
                                 f"hidden_dim={meta.get('hidden_dim')})")
        except RouterLiteError as e:
            raise RouterLiteError(f"head file {f} is invalid: {e}") from None
        except Exception as e:  # corrupt bytes, bad header, bad JSON, ...
            raise RouterLiteError(f"head file {f} is corrupt or not a head: {type(e).__name__}: {e}") from None
        if d is not None and head.d != d:
            raise RouterLiteError(f"head file {f} expects {head.d}-dim embeddings, got {d}")
        if K is not None and head.K != K:
            raise RouterLiteError(f"head file {f} routes over {head.K} agents, the pool has {K}")
        if agents is not None and head.agents is not None and list(agents) != list(head.agents):
            raise RouterLiteError(f"head file {f} was trained for agents {head.agents}, not {list(agents)}")
        return head

    # ---- router protocol (pipeline/route/routers.py) -------------------------------------------------------------
    def save_files(self, directory: str | Path) -> dict:
        """Write ``head.safetensors`` into `directory`; the manifest fields describing it."""
        self.save(Path(directory) / FILE_NAME)
        return {"files": {"weights": FILE_NAME}, "hidden_dim": self.hidden_dim, "n_params": self.n_params}

    @classmethod
    def from_files(cls, directory: str | Path, manifest: dict) -> Head:
        names = [a["name"] for a in manifest["agents"]]
        return cls.load(Path(directory) / manifest.get("files", {}).get("weights", FILE_NAME), d=int(manifest["dim"]),
                        K=len(names), agents=names)

    def fingerprint(self) -> tuple[list[bytes], list]:
        return ([np.ascontiguousarray(self.to_vector(), np.float32).tobytes(),
                 b"" if self.mean is None else self.mean.tobytes() + self.std.tobytes()],
                [self.activation, self.hidden_dim])


def _file_of(path: str | Path, for_write: bool) -> Path:
    p = Path(path)
    if p.suffix in (".safetensors", ".npz"):
        return p
    if p.is_dir() or p.suffix == "" or for_write:
        return p / FILE_NAME
    return p


def _read(f: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    if f.suffix == ".npz":
        with np.load(f, allow_pickle=False) as z:
            tensors = {k: np.array(z[k]) for k in z.files if k != "__meta__"}
            meta = json.loads(str(z["__meta__"])) if "__meta__" in z.files else {}
        return tensors, meta
    from safetensors import safe_open

    with safe_open(str(f), framework="numpy") as fh:
        meta = dict(fh.metadata() or {})
        tensors = {k: np.array(fh.get_tensor(k)) for k in fh.keys()}
    return tensors, meta
