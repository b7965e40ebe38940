"""The kNN and cluster routers' files (pipeline/route/router_file.py): written and read back exactly; a missing file,
corrupt bytes, another kind's file, a bad k and a file that does not fit the manifest each get one error naming it."""
import numpy as np
import pytest

from pipeline.core.errors import RouterLiteError
from pipeline.route.cluster import ClusterRouter
from pipeline.route.knn import KnnRouter
from pipeline.route.router_file import read_table_file, write_table_file

AGENTS = ["a", "b", "c"]


def _manifest(dim=4, agents=AGENTS):
    return {"dim": dim, "agents": [{"name": a} for a in agents]}


def _fitted(kind):
    rng = np.random.default_rng(0)
    X, R = rng.normal(size=(60, 4)).astype(np.float32), (rng.random((60, 3)) > 0.5).astype(np.float32)
    if kind == "knn":
        return KnnRouter(k=5, agents=AGENTS).fit(X, R), X
    return ClusterRouter(k=3, agents=AGENTS).fit(X[:40], R[:40], X[40:], R[40:]), X


@pytest.mark.parametrize("kind", ["knn", "cluster"])
def test_a_router_file_round_trips_and_refuses_what_does_not_fit(kind, tmp_path):
    router, X = _fitted(kind)
    fields = router.save_files(tmp_path)
    back = type(router).from_files(tmp_path, {**_manifest(), **fields})
    assert np.array_equal(back.pick(X), router.pick(X)) and back.k_ == router.k_
    with pytest.raises(RouterLiteError, match="does not fit the manifest"):
        type(router).from_files(tmp_path, {**_manifest(agents=["a", "b", "x"]), **fields})
    with pytest.raises(RouterLiteError, match="does not fit the manifest"):
        type(router).from_files(tmp_path, {**_manifest(dim=5), **fields})
    other = "cluster.safetensors" if kind == "knn" else "knn.safetensors"  # another kind's file under this name
    (tmp_path / fields["files"]["weights"]).rename(tmp_path / other)
    with pytest.raises(RouterLiteError, match="does not exist"):
        type(router).from_files(tmp_path, {**_manifest(), **fields})
    (tmp_path / fields["files"]["weights"]).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(RouterLiteError, match=r"is corrupt: .*safetensors|is corrupt"):
        type(router).from_files(tmp_path, {**_manifest(), **fields})


def test_another_kinds_file_and_bad_values_are_refused(tmp_path):
    f = tmp_path / "t.safetensors"
    write_table_file(f, "router-lite-cluster", {"X": np.zeros((2, 4)), "R": np.zeros((2, 3))}, AGENTS, k=2)
    with pytest.raises(RouterLiteError, match="is corrupt: ValueError: not a router-lite-knn file"):
        read_table_file(f, "router-lite-knn", ("X", "R"), _manifest(), "kNN router")
    write_table_file(f, "router-lite-knn", {"X": np.full((2, 4), np.nan), "R": np.zeros((2, 3))}, AGENTS, k=2)
    with pytest.raises(RouterLiteError, match=r"is invalid: X \(2, 4\), R \(2, 3\)"):
        read_table_file(f, "router-lite-knn", ("X", "R"), _manifest(), "kNN router")
    write_table_file(f, "router-lite-knn", {"X": np.zeros((2, 4)), "R": np.zeros((2, 3))}, AGENTS, k=0)
    with pytest.raises(RouterLiteError, match="kNN router file .* is invalid: k='0'"):
        KnnRouter.from_files(tmp_path, {**_manifest(), "files": {"weights": "t.safetensors"}})
