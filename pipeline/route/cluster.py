"""Coarse cluster router: k-means on the embeddings, the best agent of each cluster on train.

Where agents complement each other by *kind* of query (one leads ARC, another MBPP, a third Winogrande) a coarse
partition of the embedding space carries most of what is routable, and it generalises better than a linear head
fitted to per-row argmax noise (docs/training.md, "Which prompt router ships"). The router:

* normalises the embeddings to unit length (the backbones' similarity is cosine) and runs scikit-learn's `KMeans`
  (one seeded k-means++ start, Lloyd iterations) for every k of `K_GRID`
  that leaves at least `min_cluster` training rows per cluster on average;
* scores agent j in cluster c by its mean (tie-aware) training reward on the cluster's rows, shrunk toward the
  agent's mean over all training rows by `prior` pseudo-rows (so a cluster of a handful of rows cannot hand a share to
  an agent on noise); the pick is the argmax (ties -> lowest agent index);
* chooses k by `folds`-fold cross-validation on the **training** rows (scikit-learn's `KFold`, shuffled with `seed`:
  the out-of-fold reward of each k's picks, every fold clustered on the rest), with the one-standard-error rule of
  GridSearchCV's ``refit=callable`` pattern (`one_standard_error`): the smallest k whose out-of-fold reward is
  within one standard error (of its paired per-row difference) of the best k's. The validation rows are left for
  the choice among router kinds (pipeline/route/select.py), so the cluster router's validation figure is a clean
  hold-out. Choosing k by the best of 11 validation rewards over a few hundred rows was the winner's curse: on
  tests/test_complementary.py's pool it picked k = 64 (clusters of ~10 rows), best on validation and far below
  kNN on test (docs/training.md, "Which prompt router ships").

As in scikit-learn, the constructor's `k` stays as given (None: search) and what `fit` learns ends in an underscore:
`k_`, `cv_rewards_` (out-of-fold reward per k searched), `val_reward_` (validation reward of the fitted router).

Router protocol (pipeline/route/routers.py, kind ``cluster``): ``cluster.safetensors`` holds the centroids and the
per-cluster agent scores (no pickle), so it registers, routes and serves like the head and kNN.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.cluster import KMeans, kmeans_plusplus
from sklearn.model_selection import KFold
from threadpoolctl import threadpool_limits

from pipeline.collect.rewards import effective_rewards
from pipeline.core.errors import RouterLiteError
from pipeline.route.router_file import read_table_file, write_table_file
from pipeline.route.routers import register_router

K_GRID = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
DEFAULT_K = 8
FILE_NAME = "cluster.safetensors"
FILE_KIND = "router-lite-cluster"
N_INIT = 1  # one seeded k-means++ start per fit (scikit-learn's "auto" for k-means++)
MAX_ITER = 50


def _normalise(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float32)
    return X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)


def kmeans(X: np.ndarray, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(centroids (k, d), labels (n,)): scikit-learn's `KMeans` (Lloyd, at most `MAX_ITER` iterations) from one
    plain k-means++ start (`kmeans_plusplus` with one trial per centroid: scikit-learn's greedy default of
    2 + log k trials was two thirds of the search's time), both seeded by `seed`. float32 throughout (the
    embeddings' own precision)."""
    X = np.asarray(X, dtype=np.float32)
    k = max(1, min(int(k), len(X)))
    start, _ = kmeans_plusplus(X, k, random_state=seed, n_local_trials=1)
    km = KMeans(n_clusters=k, init=start, n_init=N_INIT, max_iter=MAX_ITER, random_state=seed).fit(X)
    return km.cluster_centers_.astype(np.float32), km.labels_.astype(np.int64)


def nearest(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Index of each row's nearest centroid (Euclidean; on unit rows the same as cosine), in float64 as
    scikit-learn's `pairwise_distances_argmin` upcasts float32 rows. NumPy, not that function: for the one prompt
    of a served request its checks and thread-pool set-up cost ~40 ms where the product takes microseconds."""
    X, C = np.asarray(X, dtype=np.float32).astype(np.float64), np.asarray(C, dtype=np.float32).astype(np.float64)
    return ((C * C).sum(axis=1)[None, :] - 2.0 * (X @ C.T)).argmin(axis=1)


def one_standard_error(oof: dict[int, np.ndarray]) -> int:
    """The smallest k whose out-of-fold reward is within one standard error of the best k's (GridSearchCV's
    ``refit=callable`` rule, with the standard error of the paired per-row difference: every k was scored on the same
    rows, so the pairing removes the rows' own difficulty from the noise)."""
    means = {k: float(v.mean()) for k, v in oof.items()}
    top = max(oof, key=lambda k: (means[k], -k))
    se = {k: float((v - oof[top]).std() / np.sqrt(len(v))) for k, v in oof.items()}
    return min(k for k in oof if means[k] >= means[top] - se[k])


def cluster_scores(labels: np.ndarray, R_eff: np.ndarray, k: int, prior: float) -> np.ndarray:
    """(k, K): each cluster's mean reward per agent, shrunk toward the all-rows mean by `prior` pseudo-rows."""
    R_eff = np.asarray(R_eff, dtype=np.float64)
    glob = R_eff.mean(axis=0)
    S = np.empty((k, R_eff.shape[1]))
    for c in range(k):
        rows = labels == c
        S[c] = (R_eff[rows].sum(axis=0) + prior * glob) / (rows.sum() + prior)
    return S.astype(np.float32)


@register_router("cluster")
class ClusterRouter:
    """``ClusterRouter(k=None).fit(X_train, R_train, X_val, R_val)`` clusters the training prompts and picks `k_` on
    validation; ``pick(X)`` = the best training agent of each query's nearest centroid."""

    def __init__(self, k: int | None = None, k_grid: tuple[int, ...] = K_GRID, agents: list[str] | None = None,
                 prior: float = 5.0, min_cluster: int = 10, seed: int = 0, folds: int = 5):
        if k is not None and k < 1:
            raise RouterLiteError(f"cluster router k must be >= 1, got {k}")
        if prior < 0 or min_cluster < 1:
            raise RouterLiteError(f"cluster router: prior must be >= 0 and min_cluster >= 1, got {prior}, "
                                  f"{min_cluster}")
        self.k, self.k_grid, self.prior, self.min_cluster, self.seed = k, tuple(int(x) for x in k_grid), prior, \
            min_cluster, seed
        self.folds = max(2, int(folds))
        self.agents = None if agents is None else list(agents)
        self.k_: int | None = None
        self.cv_rewards_: dict[int, float] = {}
        self.val_reward_: float | None = None

    def fit(self, X_train: np.ndarray, R_train: np.ndarray, X_val: np.ndarray | None = None,
            R_val: np.ndarray | None = None, best_train: np.ndarray | None = None,
            best_val: np.ndarray | None = None) -> ClusterRouter:
        X_train = np.asarray(X_train, dtype=np.float32)
        if X_train.ndim != 2 or len(X_train) != len(R_train) or len(X_train) == 0:
            raise RouterLiteError(f"cluster router: embeddings {X_train.shape} and rewards {np.shape(R_train)} "
                                  f"do not match")
        U = effective_rewards(R_train, best_train)
        if self.agents is not None and len(self.agents) != U.shape[1]:
            raise RouterLiteError(f"cluster router: {len(self.agents)} agent names for rewards of {U.shape[1]} agents")
        Z = _normalise(X_train)
        fold_rows = len(Z) * (self.folds - 1) // self.folds
        grid = sorted({k for k in self.k_grid if k * self.min_cluster <= fold_rows})
        # one thread: the search is hundreds of small k-means fits, and on a few (shared) cores BLAS and OpenMP
        # threads spin more than they compute (2,434 MMLU-Pro training rows on 2 loaded cores: 16.4 s of CPU with
        # the default threads, 1.6 s on one, same k; bench/select_kinds.py)
        with threadpool_limits(1):
            if self.k is not None or not grid:
                self.k_ = min(int(self.k or DEFAULT_K), len(Z))
                self.cv_rewards_ = {}
            else:
                self.k_, self.cv_rewards_ = self._cross_validate(Z, U, grid)
            self.centroids, labels = kmeans(Z, self.k_, seed=self.seed)
        self.S = cluster_scores(labels, U, len(self.centroids), self.prior)
        self.val_reward_ = None
        if X_val is not None and R_val is not None and len(X_val) > 0:
            Rv = effective_rewards(R_val, best_val)
            pick = self.pick(X_val)
            self.val_reward_ = float(Rv[np.arange(len(pick)), pick].mean())
        return self

    def _cross_validate(self, Z: np.ndarray, U: np.ndarray, grid: list[int]) -> tuple[int, dict[int, float]]:
        """(k by the one-standard-error rule, {k: out-of-fold reward}) over `folds` seeded folds of the rows
        (scikit-learn's `KFold`, shuffled with `seed`)."""
        oof = {k: np.empty(len(Z)) for k in grid}
        for fit, held in KFold(self.folds, shuffle=True, random_state=self.seed).split(Z):
            for k in grid:
                C, labels = kmeans(Z[fit], k, seed=self.seed)
                pick = cluster_scores(labels, U[fit], len(C), self.prior)[nearest(Z[held], C)].argmax(axis=1)
                oof[k][held] = U[held, pick]
        return one_standard_error(oof), {k: float(v.mean()) for k, v in oof.items()}

    def assign(self, X: np.ndarray) -> np.ndarray:
        """Index of each query's nearest centroid."""
        return nearest(_normalise(X), self.centroids)

    def scores(self, X: np.ndarray) -> np.ndarray:
        """(n, K): the (shrunk) mean training reward of each agent in the query's cluster."""
        return self.S[self.assign(X)]

    def pick(self, X: np.ndarray) -> np.ndarray:
        return self.scores(X).argmax(axis=1)

    # ---- router protocol (pipeline/route/routers.py) -------------------------------------------------------------
    @property
    def d(self) -> int:
        return int(self.centroids.shape[1])

    @property
    def K(self) -> int:
        return int(self.S.shape[1])

    def save_files(self, directory: str | Path) -> dict:
        """Write ``cluster.safetensors`` (centroids, per-cluster scores, agents) into `directory`."""
        write_table_file(Path(directory) / FILE_NAME, FILE_KIND, {"centroids": self.centroids, "scores": self.S},
                         self.agents, k=int(self.k_))
        return {"files": {"weights": FILE_NAME}, "k": int(self.k_)}

    @classmethod
    def from_files(cls, directory: str | Path, manifest: dict) -> ClusterRouter:
        f = Path(directory) / manifest.get("files", {}).get("weights", FILE_NAME)
        C, S, _ = read_table_file(f, FILE_KIND, ("centroids", "scores"), manifest, "cluster router")
        router = cls(k=len(C), agents=[a["name"] for a in manifest["agents"]])
        router.centroids, router.S, router.k_ = C, S, len(C)
        return router

    def fingerprint(self) -> tuple[list[bytes], list]:
        return ([np.ascontiguousarray(self.centroids, np.float32).tobytes(),
                 np.ascontiguousarray(self.S, np.float32).tobytes()], ["cluster", int(self.k_)])
