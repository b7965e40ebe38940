"""k-nearest-neighbour router: the non-parametric baseline a trained head has to beat.

Cosine similarity on the embeddings; the score of agent j for a query is the mean (tie-aware) reward of agent j on
the query's k most similar training rows; the pick is the argmax (ties -> lowest agent index).  `fit` chooses k from
a grid on validation rows (the k whose picks earn the most there; the larger k on ties) when k is not given;
without validation rows k = DEFAULT_K (100). As in scikit-learn, the constructor's `k` stays as given (None: search)
and what `fit` learns ends in an underscore: `k_` (the k used), `val_rewards_` (validation reward per k searched).

Router protocol (pipeline/route/routers.py, kind ``knn``): a fitted kNN router can be registered and served like a head;
its file ``knn.safetensors`` holds the normalised training embeddings, their (tie-aware) rewards and k.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.collect.rewards import effective_rewards
from pipeline.core.errors import RouterLiteError
from pipeline.route.router_file import read_table_file, write_table_file
from pipeline.route.routers import register_router

K_GRID = (5, 10, 20, 50, 100, 200, 400)
DEFAULT_K = 100      # used when neither k nor validation rows are given
FILE_NAME = "knn.safetensors"
FILE_KIND = "router-lite-knn"


def _normalise(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float32)
    n = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.maximum(n, 1e-12)


def top_k_neighbours(Q: np.ndarray, X: np.ndarray, k: int, chunk: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """(indices (nq, k), cosine similarities (nq, k)) of the k most similar rows of X, most similar first."""
    Qn, Xn = _normalise(Q), _normalise(X)
    k = min(k, Xn.shape[0])
    idx = np.empty((Qn.shape[0], k), dtype=np.int64)
    sim = np.empty((Qn.shape[0], k), dtype=np.float32)
    for s in range(0, Qn.shape[0], chunk):
        S = Qn[s:s + chunk] @ Xn.T
        part = np.argpartition(-S, k - 1, axis=1)[:, :k] if k < S.shape[1] else np.tile(np.arange(S.shape[1]),
                                                                                        (S.shape[0], 1))
        ps = np.take_along_axis(S, part, axis=1)
        order = np.argsort(-ps, axis=1, kind="stable")
        idx[s:s + chunk] = np.take_along_axis(part, order, axis=1)
        sim[s:s + chunk] = np.take_along_axis(ps, order, axis=1)
    return idx, sim


@register_router("knn")
class KnnRouter:
    """Cosine kNN router. ``KnnRouter(k=None).fit(X_train, R_train, X_val, R_val)`` picks `k_` on validation."""

    def __init__(self, k: int | None = None, k_grid: tuple[int, ...] = K_GRID, agents: list[str] | None = None):
        if k is not None and k < 1:
            raise RouterLiteError(f"kNN k must be >= 1, got {k}")
        self.k = k  # the hyper-parameter as given (None: choose on validation); fit's choice is `k_`
        self.k_grid = tuple(int(x) for x in k_grid)
        self.k_: int | None = None
        self.val_rewards_: dict[int, float] = {}
        self.agents = None if agents is None else list(agents)

    def fit(self, X_train: np.ndarray, R_train: np.ndarray, X_val: np.ndarray | None = None,
            R_val: np.ndarray | None = None, best_train: np.ndarray | None = None,
            best_val: np.ndarray | None = None) -> KnnRouter:
        X_train = np.asarray(X_train, dtype=np.float32)
        if X_train.ndim != 2 or len(X_train) != len(R_train) or len(X_train) == 0:
            raise RouterLiteError(f"kNN: embeddings {X_train.shape} and rewards {np.shape(R_train)} do not match")
        self.X = _normalise(X_train)
        self.R = effective_rewards(R_train, best_train)
        if self.agents is not None and len(self.agents) != self.R.shape[1]:
            raise RouterLiteError(f"kNN: {len(self.agents)} agent names for rewards of {self.R.shape[1]} agents")
        self.val_rewards_ = {}
        if self.k is not None:
            self.k_ = int(self.k)
            return self
        if X_val is None or R_val is None or len(X_val) == 0:
            self.k_ = min(DEFAULT_K, len(self.X))
            return self
        Rv = effective_rewards(R_val, best_val)
        grid = sorted({min(k, len(self.X)) for k in self.k_grid})
        idx, _ = top_k_neighbours(X_val, self.X, grid[-1])
        csum = np.cumsum(self.R[idx], axis=1)                 # (nv, kmax, K)
        for k in grid:
            pick = csum[:, k - 1, :].argmax(axis=1)
            self.val_rewards_[k] = float(Rv[np.arange(len(pick)), pick].mean())
        self.k_ = max(grid, key=lambda k: (self.val_rewards_[k], k))
        return self

    def scores(self, X: np.ndarray) -> np.ndarray:
        """(n, K) mean reward of each agent on the k nearest training rows."""
        idx, _ = top_k_neighbours(X, self.X, self.k_)
        return self.R[idx].mean(axis=1)

    def pick(self, X: np.ndarray) -> np.ndarray:
        return self.scores(X).argmax(axis=1)

    # ---- router protocol (pipeline/route/routers.py) -------------------------------------------------------------
    @property
    def d(self) -> int:
        return int(self.X.shape[1])

    @property
    def K(self) -> int:
        return int(self.R.shape[1])

    def save_files(self, directory: str | Path) -> dict:
        """Write ``knn.safetensors`` (embeddings, rewards, the fitted `k_` under the key "k", agents) into `directory`;
        its manifest fields (`k`: the fitted k, as entries have always recorded it)."""
        write_table_file(Path(directory) / FILE_NAME, FILE_KIND, {"X": self.X, "R": self.R}, self.agents,
                         k=int(self.k_))
        return {"files": {"weights": FILE_NAME}, "k": int(self.k_), "n_reference": int(len(self.X))}

    @classmethod
    def from_files(cls, directory: str | Path, manifest: dict) -> KnnRouter:
        f = Path(directory) / manifest.get("files", {}).get("weights", FILE_NAME)
        X, R, meta = read_table_file(f, FILE_KIND, ("X", "R"), manifest, "kNN router")
        try:
            k = int(meta["k"])
        except (KeyError, ValueError):
            k = 0
        if k < 1:
            raise RouterLiteError(f"kNN router file {f} is invalid: k={meta.get('k')!r}")
        knn = cls(k=k, agents=[a["name"] for a in manifest["agents"]])  # the stored k is the fitted one: kept
        knn.X, knn.R, knn.k_ = X, R, k
        return knn

    def fingerprint(self) -> tuple[list[bytes], list]:
        return ([np.ascontiguousarray(self.X, np.float32).tobytes(),
                 np.ascontiguousarray(self.R, np.float32).tobytes()],
                ["knn", int(self.k_)])
