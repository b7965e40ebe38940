"""Head shapes, parameter vector round trip, save/load (safetensors + npz), corrupt/mismatched files."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.errors import RouterLiteError
from pipeline.route.head import Head, n_params


def test_parameter_count_linear_2048x5():
    assert n_params(2048, 5) == 10_245
    h = Head.from_vector(np.zeros(10_245), 2048, 5)
    assert h.n_params == 10_245 and h.d == 2048 and h.K == 5 and h.hidden_dim == 0
    assert h.scores(np.zeros((3, 2048))).shape == (3, 5)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_hidden_layer_shapes_and_vector_round_trip(activation):
    d, K, H = 7, 3, 4
    n = n_params(d, K, H)
    assert n == (d + 1) * H + (H + 1) * K
    theta = np.random.default_rng(0).standard_normal(n)
    h = Head.from_vector(theta, d, K, H, activation=activation)
    assert (h.W1.shape, h.b1.shape, h.W2.shape, h.b2.shape) == ((d, H), (H,), (H, K), (K,))
    np.testing.assert_allclose(h.to_vector(), theta, rtol=1e-6, atol=1e-6)
    X = np.random.default_rng(1).standard_normal((5, d))
    S = h.scores(X)
    A = X @ h.W1 + h.b1
    A = np.tanh(A) if activation == "tanh" else np.maximum(A, 0)
    np.testing.assert_allclose(S, A @ h.W2 + h.b2, rtol=1e-5, atol=1e-5)
    assert (h.pick(X) == S.argmax(1)).all()


def test_linear_layout_and_standardisation():
    d, K = 3, 2
    theta = np.arange((d + 1) * K, dtype=float)      # rows: features 0..d-1, then bias
    h = Head.from_vector(theta, d, K, mean=np.ones(d), std=2 * np.ones(d))
    np.testing.assert_array_equal(h.b1, [6, 7])
    X = np.array([[3.0, 1.0, 1.0]])                  # standardised -> [1, 0, 0]
    np.testing.assert_allclose(h.scores(X), [[0 + 6, 1 + 7]])


def test_bad_vector_length_and_bad_input_dim():
    with pytest.raises(RouterLiteError, match="needs 8"):
        Head.from_vector(np.zeros(7), 3, 2)
    h = Head.from_vector(np.zeros(8), 3, 2)
    with pytest.raises(RouterLiteError, match="input dim 3"):
        h.scores(np.zeros((2, 4)))


@pytest.mark.parametrize("target", ["dir", "x.safetensors", "x.npz"])
def test_save_load_round_trip(tmp_path, target):
    rng = np.random.default_rng(0)
    d, K, H = 6, 3, 4
    h = Head.from_vector(rng.standard_normal(n_params(d, K, H)), d, K, H, activation="relu",
                         mean=rng.standard_normal(d), std=rng.random(d) + 0.5, agents=["a", "b", "c"])
    path = tmp_path / target
    f = h.save(path)
    assert f.exists() and not list(tmp_path.glob(".*.tmp"))
    g = Head.load(path, d=d, K=K, agents=["a", "b", "c"])
    assert g.activation == "relu" and g.agents == ["a", "b", "c"]
    np.testing.assert_array_equal(g.to_vector(), h.to_vector())
    np.testing.assert_array_equal(g.mean, h.mean)
    X = rng.standard_normal((4, d))
    np.testing.assert_array_equal(g.scores(X), h.scores(X))


def test_load_mismatch_names_the_file(tmp_path):
    h = Head.from_vector(np.zeros(8), 3, 2)
    f = h.save(tmp_path / "h")
    with pytest.raises(RouterLiteError, match=str(f)) as e:
        Head.load(tmp_path / "h", d=4)
    assert "3-dim" in str(e.value)
    with pytest.raises(RouterLiteError, match="routes over 2 agents"):
        Head.load(f, K=5)


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_corrupt_file_is_one_clear_error(tmp_path, suffix):
    f = tmp_path / f"h{suffix}"
    Head.from_vector(np.ones(8), 3, 2).save(f)
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])            # truncated
    with pytest.raises(RouterLiteError, match="corrupt") as e:
        Head.load(f)
    assert str(f) in str(e.value)
    f.write_bytes(b"\x00garbage")
    with pytest.raises(RouterLiteError, match=str(f)):
        Head.load(f)
    with pytest.raises(RouterLiteError, match="does not exist"):
        Head.load(tmp_path / "missing.safetensors")


def test_npz_with_wrong_shapes_is_rejected(tmp_path):
    f = tmp_path / "bad.npz"
    np.savez(f, W1=np.zeros((3, 2), np.float32), b1=np.zeros(5, np.float32),
             __meta__=np.array('{"kind": "router-lite-head", "d": "3", "K": "2", "hidden_dim": "0"}'))
    with pytest.raises(RouterLiteError, match="bad.npz"):
        Head.load(f)
