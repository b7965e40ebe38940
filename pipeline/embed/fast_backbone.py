"""The CPU fast path for mean-pooled encoders: the model exported once to ONNX, run by OpenVINO or ONNX Runtime.

Chosen by measurement (`bench/embed.py`, docs/backbones.md): on this project's 2-core CPU, OpenVINO with bf16
inference precision runs all-MiniLM-L6-v2 several times faster than the float32 torch forward at cosine 0.99997,
because it uses the CPU's AVX512-BF16 / AMX units; where the CPU has no bf16 it runs float32 (still faster than
torch). ONNX Runtime float32 is the second option. Dynamic int8 is *not* offered: it misses cosine 0.995.

The export runs offline from the loaded weights (torch.onnx, eager attention: the SDPA path exports a wrong mask),
is written atomically to ``<export_dir>/<model key>/model.onnx`` and reused by every later load.
Plain Python: the caller (``pipeline.embed.backbone.Backbone``) decides when to use it and falls back to torch on
failure.
"""
from __future__ import annotations

import logging
import os
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.core.errors import RouterLiteError

log = logging.getLogger(__name__)

FAST_BACKENDS = ("openvino", "onnx")
BACKENDS = ("auto", "torch") + FAST_BACKENDS
# dtype name (pipeline.embed.backbone.DTYPES) -> OpenVINO inference precision; "auto" = bf16 where the CPU has it
_OV_PRECISION = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def export_onnx(model_dir: str, out_dir: Path, input_names: Sequence[str]) -> Path:
    """``out_dir/model.onnx`` (last_hidden_state, dynamic batch and sequence axes); exported once, then reused."""
    path = Path(out_dir) / "model.onnx"
    if path.is_file():
        return path
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    names = list(input_names)

    class LastHidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *args):
            return self.m(**dict(zip(names, args))).last_hidden_state

    example = {k: torch.ones((2, 8), dtype=torch.long) for k in names}
    if "token_type_ids" in example:
        example["token_type_ids"] = torch.zeros((2, 8), dtype=torch.long)
    example["attention_mask"][1, 5:] = 0  # a padded row, so the mask path is traced
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".model.{uuid.uuid4().hex[:8]}.onnx"
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer notes about python-side shape checks: known, harmless here
            torch.onnx.export(LastHidden(model), tuple(example[k] for k in names), str(tmp), input_names=names,
                              output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                              dynamic_axes={k: {0: "batch", 1: "seq"} for k in names + ["last_hidden_state"]})
        os.replace(tmp, path)  # concurrent exporters: the last rename wins, every reader sees a whole file
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def _cpu_has_bf16(core) -> bool:
    try:
        return "BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    except Exception:  # noqa: BLE001 - an old runtime without the property: assume not
        return False


def _compiled_precision(compiled, asked: str) -> str:
    """The inference precision the compiled model reports (bf16 asked on a CPU without bf16 units runs f32), so
    cache keys and reports name what really ran; the precision asked for where the runtime cannot say."""
    try:
        got = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    except Exception:  # noqa: BLE001 - an old runtime without the property
        return asked
    return got if got in _OV_PRECISION.values() else asked


class OpenVinoEncoder:
    """``(inputs) -> last_hidden_state`` on OpenVINO CPU; ``precision`` is what it really runs (bf16 | f32 | f16)."""

    def __init__(self, onnx_path: Path, dtype: str = "auto", threads: int | None = None):
        import openvino as ov

        core = ov.Core()
        if dtype == "auto":
            precision = "bf16" if _cpu_has_bf16(core) else "f32"
        elif dtype in _OV_PRECISION:
            precision = _OV_PRECISION[dtype]
        else:
            raise RouterLiteError(f"backend 'openvino' has no dtype {dtype!r}")
        config = {"INFERENCE_PRECISION_HINT": precision,
                  "CACHE_DIR": str(Path(onnx_path).parent / "openvino-cache")}  # compiled blob: fast reloads
        if threads:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        self._compiled = core.compile_model(core.read_model(str(onnx_path)), "CPU", config)
        self.input_names = [i.get_any_name() for i in self._compiled.inputs]
        self.precision = _compiled_precision(self._compiled, precision)
        self.version = ov.__version__.split("-")[0]

    def __call__(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        request = self._compiled.create_infer_request()  # one per call: safe from several threads
        return np.asarray(request.infer({k: inputs[k] for k in self.input_names})[0])


class OrtEncoder:
    """``(inputs) -> last_hidden_state`` on ONNX Runtime CPU, float32, every graph optimisation on."""

    def __init__(self, onnx_path: Path, dtype: str = "auto", threads: int | None = None):
        import onnxruntime as ort

        if dtype not in ("auto", "float32"):
            raise RouterLiteError(f"backend 'onnx' runs float32 only, not dtype {dtype!r}")
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            so.intra_op_num_threads = int(threads)
        self._sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self._sess.get_inputs()]
        self.precision = "f32"
        self.version = ort.__version__

    def __call__(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self._sess.run(None, {k: inputs[k] for k in self.input_names})[0]


def load_encoder(backend: str, model_dir: str, out_dir: Path, input_names: Sequence[str], dtype: str = "auto",
                 threads: int | None = None):
    """Export (once) and compile ``model_dir`` for ``backend``; raises ImportError / any runtime error on failure."""
    if backend not in FAST_BACKENDS:
        raise RouterLiteError(f"backend {backend!r} is not one of {', '.join(FAST_BACKENDS)}")
    if backend == "openvino":
        import openvino  # noqa: F401 - fail before exporting when the runtime is missing
    else:
        import onnxruntime  # noqa: F401
    path = export_onnx(model_dir, out_dir, input_names)
    cls = OpenVinoEncoder if backend == "openvino" else OrtEncoder
    return cls(path, dtype=dtype, threads=threads)


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Masked mean over tokens, L2-normalised rows, float32 (sentence-transformers' Pooling + Normalize)."""
    m = mask[..., None].astype(np.float32)
    e = (hidden.astype(np.float32) * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
