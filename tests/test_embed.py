"""Backbone + EmbeddingCache: offline MiniLM, last-token pooling on a tiny random Qwen3, cache re-use."""
from __future__ import annotations

import logging
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest

from pipeline.core.errors import RouterLiteError
from pipeline.core.prompts import mcq_prompt, prompt_hash
from pipeline.embed.backbone import Backbone, EmbeddingCache, Runtime, last_token_pool

pytestmark = pytest.mark.slow  # the backbone (make test-fast leaves it out)

PROMPTS = [
    mcq_prompt("What is the capital of France?", ["Paris", "Rome", "Berlin", "Madrid"]),
    mcq_prompt("Which gas do plants absorb during photosynthesis?", ["Oxygen", "Carbon dioxide", "Nitrogen"]),
    "Compute 17 * 23.",
    "Short.",
    "A somewhat longer prompt about the thermodynamics of black holes and Hawking radiation, "
    "entropy, and the information paradox, asking for a careful derivation.",
]


@pytest.fixture(scope="module")
def minilm():
    return Backbone(runtime=Runtime(batch_size=2))


# ------------------------------------------------------------------ MiniLM (mean pooling)
def test_minilm_loads_offline_384d_normalised_deterministic(minilm):
    assert minilm.model_id == "sentence-transformers/all-MiniLM-L6-v2"
    assert minilm.dim == 384
    a = minilm.encode(PROMPTS)
    b = minilm.encode(PROMPTS)
    assert a.shape == (len(PROMPTS), 384) and a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(a, b)
    # batching/ordering does not change a row: each prompt alone gives the same vector
    alone = np.concatenate([minilm.encode([p]) for p in PROMPTS])
    np.testing.assert_allclose(a, alone, atol=1e-5)
    # related prompts are closer than unrelated ones (the model is the real one, not random)
    sims = a @ a.T
    assert sims[0, 1] > 0.0 and np.isfinite(sims).all()
    assert minilm.encode([]).shape == (0, 384)
    np.testing.assert_allclose(minilm.encode(PROMPTS[2]), a[2:3], atol=1e-5)  # a str is one prompt


def test_minilm_key_and_progress(minilm):
    key = minilm.key
    assert key.startswith("sentence-transformers__all-MiniLM-L6-v2-mean-L256-")
    assert "/" not in key
    assert Backbone().key == key  # stable across loads
    assert Backbone(max_seq_length=128).key != key
    seen = []
    minilm.encode(PROMPTS, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(2, 5), (4, 5), (5, 5)]


def test_progress_lines_only_for_work_of_several_batches(minilm, caplog):
    """A lineage's prompts log their progress; one batch (what `serve` embeds per request) logs at debug only."""
    with caplog.at_level(logging.INFO, logger="pipeline.embed.backbone"):
        minilm.encode(PROMPTS[:2])
        assert not [r for r in caplog.records if "embedded" in r.getMessage()]
        minilm.encode(PROMPTS)
    assert [r.getMessage().split(": ")[1].split(" (")[0] for r in caplog.records if "embedded" in r.getMessage()] \
        == ["embedded 5/5 prompts"]


def test_the_cache_says_how_far_it_is_on_the_console_logger_once(minilm, caplog, tmp_path):
    """The embedding cache's rate line (what `router-lite run` prints and the step log shows) replaces the backbone's
    batch lines, which would say the same thing twice."""
    from pipeline.embed.backbone import EmbeddingCache

    with caplog.at_level(logging.INFO, logger="pipeline.embed.backbone"):
        EmbeddingCache(tmp_path).get_or_compute(PROMPTS, minilm)
    said = [r.getMessage() for r in caplog.records]
    assert [m for m in said if m.startswith("embedding (") and m.split(": ")[1].startswith("5/5 prompts")]
    assert not [m for m in said if "embedded" in m]


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(RouterLiteError, match="no-such-org/no-such-model"):
        Backbone("no-such-org/no-such-model")
    with pytest.raises(RouterLiteError, match="no-such-org/decoder"):
        Backbone("no-such-org/decoder", pooling="last_token")
    with pytest.raises(RouterLiteError, match="pooling"):
        Backbone(pooling="cls")
    with pytest.raises(RouterLiteError, match="auto"):
        Backbone(device="auto")
    with pytest.raises(RouterLiteError, match="dtype"):
        Backbone(dtype="int4")


# ------------------------------------------------------------------ last-token pooling (tiny random Qwen3)
@pytest.fixture(scope="module")
def tiny_qwen3_dir(tmp_path_factory):
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3Model

    from pipeline.embed.backbone import bundled_model_path

    d = tmp_path_factory.mktemp("tiny-qwen3")
    tok = AutoTokenizer.from_pretrained(str(bundled_model_path()))  # reuse MiniLM's vocab, built locally
    cfg = Qwen3Config(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    Qwen3Model(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.mark.parametrize("side", ["left", "right"])
def test_last_token_pooling_matches_unpadded(tiny_qwen3_dir, side):
    import torch

    bb = Backbone(tiny_qwen3_dir, pooling="last_token", padding_side=side, runtime=Runtime(batch_size=8))
    assert bb.dim == 32 and bb.tokenizer.padding_side == side
    prompts = ["Short.", "Compute 17 * 23 please.", PROMPTS[4], "a b c d e f g h i j k l"]
    lengths = {len(bb.tokenizer(p)["input_ids"]) for p in prompts}
    assert len(lengths) == len(prompts)  # really a ragged batch: padding is exercised
    got = bb.encode(prompts)
    ref = []
    with torch.inference_mode():
        for p in prompts:  # one at a time: no padding at all
            ids = bb.tokenizer(p, return_tensors="pt")
            h = bb._model(input_ids=ids["input_ids"]).last_hidden_state[0, -1]
            ref.append(torch.nn.functional.normalize(h, dim=-1).numpy())
    np.testing.assert_allclose(got, np.stack(ref), atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert "-last_token-L256-" in bb.key


def test_last_token_pool_index_rules():
    import torch

    hidden = torch.arange(2 * 4 * 1, dtype=torch.float32).reshape(2, 4, 1)
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    assert last_token_pool(hidden, left)[:, 0].tolist() == [3.0, 7.0]
    assert last_token_pool(hidden, right)[:, 0].tolist() == [1.0, 7.0]


# ------------------------------------------------------------------ cache
class CountingBackbone:
    """Deterministic fake backbone that counts the prompts it embeds."""

    key = "fake-mean-L256-000000000000"
    dim = 8

    def __init__(self, fail_after: int | None = None):
        self.calls: list[list[str]] = []
        self.fail_after = fail_after

    def encode(self, prompts, progress=None):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise RuntimeError("simulated crash")
        self.calls.append(list(prompts))
        out = np.stack([self.vec(p) for p in prompts]) if prompts else np.empty((0, self.dim), np.float32)
        if progress is not None:
            progress(len(prompts), len(prompts))
        return out

    @classmethod
    def vec(cls, p):
        v = np.random.default_rng(int(prompt_hash(p), 16) % 2**32).standard_normal(cls.dim).astype(np.float32)
        return v / np.linalg.norm(v)

    @property
    def n_embedded(self):
        return sum(len(c) for c in self.calls)


def test_cache_embeds_only_missing_and_keeps_order(tmp_path):
    bb = CountingBackbone()
    cache = EmbeddingCache(tmp_path / "embeddings")
    first = PROMPTS[:3] + [PROMPTS[0]]  # a duplicate is embedded once
    x = cache.get_or_compute(first, bb)
    assert bb.n_embedded == 3
    np.testing.assert_array_equal(x, np.stack([bb.vec(p) for p in first]))

    x2 = EmbeddingCache(tmp_path / "embeddings").get_or_compute(first[::-1], bb)  # new instance = new process
    assert bb.n_embedded == 3
    np.testing.assert_array_equal(x2, x[::-1])

    seen = []
    x3 = cache.get_or_compute(PROMPTS, bb, progress=lambda d, t: seen.append((d, t)))
    assert bb.n_embedded == 5 and bb.calls[-1] == PROMPTS[3:]
    assert seen[-1] == (2, 2)
    np.testing.assert_array_equal(x3, np.stack([bb.vec(p) for p in PROMPTS]))
    d = tmp_path / "embeddings" / bb.key
    assert (d / "backbone.json").is_file() and not list(d.glob(".*tmp"))
    assert cache.get_or_compute([], bb).shape == (0, 8)


def test_cache_survives_a_crash_and_compacts(tmp_path):
    cache = EmbeddingCache(tmp_path, shard_size=2, compact_above=100)
    crashing = CountingBackbone(fail_after=1)  # first shard (2 prompts) is written, then it dies
    with pytest.raises(RuntimeError):
        cache.get_or_compute(PROMPTS, crashing)
    bb = CountingBackbone()
    x = cache.get_or_compute(PROMPTS, bb)
    assert bb.n_embedded == 3  # only what the crash did not finish
    d = tmp_path / bb.key
    assert len(list(d.glob("shard-*.npz"))) == 3
    cache.compact(bb, force=True)
    assert len(list(d.glob("shard-*.npz"))) == 1
    np.testing.assert_array_equal(cache.get_or_compute(PROMPTS, bb), x)
    assert bb.n_embedded == 3


def test_cache_corrupt_shard_names_the_file(tmp_path):
    bb = CountingBackbone()
    cache = EmbeddingCache(tmp_path)
    cache.get_or_compute(PROMPTS[:2], bb)
    shard = next((tmp_path / bb.key).glob("shard-*.npz"))
    shard.write_bytes(b"not an npz")
    with pytest.raises(RouterLiteError, match=shard.name):
        cache.get_or_compute(PROMPTS[:2], bb)


def test_cache_with_real_minilm_reruns_embed_nothing(tmp_path, minilm, monkeypatch):
    embedded = []
    real = minilm.encode
    monkeypatch.setattr(minilm, "encode", lambda ps, progress=None: (embedded.extend(ps), real(ps, progress))[1])
    cache = EmbeddingCache(tmp_path)
    x = cache.get_or_compute(PROMPTS, minilm)
    assert len(embedded) == len(PROMPTS)
    y = cache.get_or_compute(list(reversed(PROMPTS)), minilm)
    assert len(embedded) == len(PROMPTS)
    np.testing.assert_array_equal(y, x[::-1])
    np.testing.assert_allclose(x, real(PROMPTS), atol=1e-6)
    assert (tmp_path / minilm.cache_key).is_dir()


# ------------------------------------------------------------------ fast CPU backend (OpenVINO / ONNX Runtime)
def test_fast_backend_matches_torch_and_has_its_own_cache_key(tmp_path, minilm):
    pytest.importorskip("openvino")
    torch_bb = Backbone(runtime=Runtime(batch_size=2, backend="torch"))
    assert minilm.backend == "openvino" and torch_bb.backend == "torch" and torch_bb.precision == "float32"
    a, b = minilm.encode(PROMPTS), torch_bb.encode(PROMPTS)
    assert (a * b).sum(1).min() >= 0.999  # bf16 inference: same vectors to rounding
    assert minilm.key == torch_bb.key  # the same embedding function: a head trained on one serves on the other
    assert minilm.cache_key != torch_bb.cache_key
    assert minilm.cache_key.endswith(f"-openvino-{minilm.precision}")
    cache = EmbeddingCache(tmp_path)
    assert cache.path_for(minilm) != cache.path_for(torch_bb)
    cache.get_or_compute(PROMPTS, torch_bb)
    assert cache.load(minilm) == {}  # rows of the torch backend never serve the openvino one
    onnx_bb = Backbone(runtime=Runtime(batch_size=2, backend="onnx", export_dir=tmp_path / "exports"))
    assert onnx_bb.backend == "onnx" and (tmp_path / "exports" / onnx_bb.key / "model.onnx").is_file()
    assert onnx_bb.cache_key not in (minilm.cache_key, torch_bb.cache_key)
    np.testing.assert_allclose(onnx_bb.encode(PROMPTS), b, atol=1e-4)  # float32 graph: equal to torch


def test_fast_backend_unavailable_falls_back_to_torch_with_one_warning(tmp_path, monkeypatch, caplog):
    import logging
    import sys

    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` now raises ImportError
    with caplog.at_level(logging.WARNING, logger="pipeline.embed.backbone"):
        bb = Backbone(runtime=Runtime(batch_size=2, export_dir=tmp_path))
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "pipeline.embed.backbone"]
    assert len(warnings) == 1 and "'openvino' unavailable" in warnings[0].getMessage()
    assert bb.backend == "torch" and bb.precision == "float32"
    assert bb.cache_key.endswith("-torch-float32")
    assert not (tmp_path / bb.key).exists()  # failed before exporting anything
    torch_rows = Backbone(runtime=Runtime(backend="torch")).encode(PROMPTS)
    np.testing.assert_allclose(bb.encode(PROMPTS), torch_rows, atol=1e-6)


def test_fast_backend_export_failure_falls_back(tmp_path, monkeypatch, caplog):
    import logging

    from pipeline.embed import fast_backbone

    def broken(*a, **k):
        raise RuntimeError("exporter exploded")

    monkeypatch.setattr(fast_backbone, "export_onnx", broken)
    with caplog.at_level(logging.WARNING, logger="pipeline.embed.backbone"):
        bb = Backbone(runtime=Runtime(batch_size=2, backend="onnx", export_dir=tmp_path))
    assert bb.backend == "torch" and "exporter exploded" in caplog.text


def test_backend_choices_are_checked(tiny_qwen3_dir):
    with pytest.raises(RouterLiteError, match="backend 'tensorrt'"):
        Backbone(runtime=Runtime(backend="tensorrt"))
    with pytest.raises(RouterLiteError, match="mean-pooled encoders on the CPU"):
        Backbone(tiny_qwen3_dir, pooling="last_token", runtime=Runtime(backend="openvino"))
    assert Backbone(tiny_qwen3_dir, pooling="last_token").backend == "torch"  # auto: decoders stay on torch


# ------------------------------------------------------------------ Dagster resource
def test_backbone_resource_resolves_device_and_reuses_the_model():
    import torch

    from resources.backbone import BackboneResource, resolve_device

    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(RouterLiteError, match="tpu"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RouterLiteError, match="CUDA"):
            resolve_device("cuda")
    res = BackboneResource(batch_size=4, max_seq_length=128)
    bb = res.get_backbone()
    assert res.get_backbone() is bb
    assert bb.device == resolve_device("auto") and bb.max_seq_length == 128 and bb.batch_size == 4
    assert "-mean-L128-" in bb.key


# ------------------------------------------------------------------ hub ids through the real hub path
def _fake_hub_repo(cache, repo_id, src, commit):
    """Lay out `src` as the Hugging Face cache holds a downloaded repo (snapshots/<commit>/ + refs/main)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / commit
    for f in src.rglob("*"):
        if f.is_file():
            (snap / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            (snap / f.relative_to(src)).symlink_to(f)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)


def test_hub_ids_load_offline_from_the_hf_cache(tmp_path, monkeypatch, minilm, tiny_qwen3_dir):
    import huggingface_hub.constants

    from pipeline.embed.backbone import bundled_model_path

    cache = tmp_path / "hub"
    _fake_hub_repo(cache, "sentence-transformers/all-MiniLM-L6-v2", bundled_model_path(), "a" * 40)
    _fake_hub_repo(cache, "test-org/tiny-qwen3", tiny_qwen3_dir, "b" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))

    # not the bundled alias
    hub = Backbone("sentence-transformers/all-MiniLM-L6-v2", revision="main", runtime=Runtime(batch_size=2))
    assert hub._load_from == "sentence-transformers/all-MiniLM-L6-v2"
    assert hub.key != minilm.key and hub.key.startswith("sentence-transformers__all-MiniLM-L6-v2-mean-L256-")
    np.testing.assert_allclose(hub.encode(PROMPTS[:2]), minilm.encode(PROMPTS[:2]), atol=1e-6)

    dec = Backbone("test-org/tiny-qwen3", pooling="last_token")
    assert dec.dim == 32 and dec.key.startswith("test-org__tiny-qwen3-last_token-L256-")
    np.testing.assert_allclose(
        dec.encode(PROMPTS[:2]),
        Backbone(tiny_qwen3_dir, pooling="last_token").encode(PROMPTS[:2]), atol=1e-6)


def test_non_finite_embeddings_are_refused(minilm, monkeypatch):
    monkeypatch.setattr(minilm, "_encode_batch", lambda batch: np.full((len(batch), minilm.dim), np.nan, np.float32))
    with pytest.raises(RouterLiteError, match="bfloat16"):
        minilm.encode(PROMPTS[:2])


def test_openvino_precision_is_what_the_compiled_model_reports():
    """bf16 asked on a CPU without bf16 units: OpenVINO runs f32 and says so through the compiled model's
    INFERENCE_PRECISION_HINT; the cache key and reports take that, and the asked precision only where the runtime
    cannot say."""
    import openvino as ov

    from pipeline.embed.fast_backbone import _compiled_precision

    class Compiled:
        def __init__(self, reported):
            self.reported = reported

        def get_property(self, name):
            assert name == "INFERENCE_PRECISION_HINT"
            if self.reported is None:
                raise RuntimeError("unsupported property")
            return self.reported

    assert _compiled_precision(Compiled(ov.Type.f32), "bf16") == "f32"
    assert _compiled_precision(Compiled(ov.Type.bf16), "bf16") == "bf16"
    assert _compiled_precision(Compiled(None), "bf16") == "bf16"
    assert _compiled_precision(Compiled(ov.Type.i8), "f32") == "f32"  # not an inference precision we name
