"""The embedding backbone as a Dagster resource: the one place that decides device and precision.

`device="auto"` takes CUDA when `torch.cuda.is_available()`, else the CPU. `backend="auto"` keeps float16 torch on
CUDA and on the CPU runs mean-pooled encoders through OpenVINO, bf16 where the CPU has it (`dtype="auto"`), chosen by
`bench/embed.py` (table in docs/backbones.md and `CPU_BACKEND_CHOICE` below); a backend that cannot be used falls
back to torch float32 with one warning line.
The loaded `pipeline.embed.backbone.Backbone` is built once per resource instance and reused.
"""
from __future__ import annotations

from typing import Any

from dagster import ConfigurableResource
from pydantic import PrivateAttr

from pipeline.core.errors import RouterLiteError
from pipeline.embed.backbone import DEFAULT_MODEL_ID, Backbone, Runtime

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(device: str = "auto") -> str:
    """`auto` -> `cuda` when a CUDA device is usable, else `cpu`; an explicit `cuda` without one is an error."""
    d = str(device).strip().lower()
    if d != "auto" and d != "cpu" and not d.startswith("cuda"):
        raise RouterLiteError(f"backbone device {device!r} is not one of {', '.join(DEVICES)} (or cuda:N)")
    if d == "cpu":
        return d
    import torch

    available = torch.cuda.is_available()
    if d == "auto":
        return "cuda" if available else "cpu"
    if not available:
        raise RouterLiteError(f"backbone device {device!r} asked for, but torch sees no CUDA device "
                              f"(torch {torch.__version__}); use device='auto' or 'cpu'")
    return d


class BackboneResource(ConfigurableResource):
    """Which frozen model embeds the prompts, and how (see `pipeline.embed.backbone.Backbone`)."""

    model: str = DEFAULT_MODEL_ID  # hub id or local dir; the MiniLM id maps to the bundled copy
    pooling: str = "mean"  # mean (sentence-transformers encoders) | last_token (decoders, e.g. Qwen/Qwen3-1.7B)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (fp16 on CUDA, fp32 on CPU) | float32 | float16 | bfloat16
    batch_size: int = 64
    max_seq_length: int = 256
    revision: str | None = None
    log_every: int = 10  # progress log line every N batches
    backend: str = "auto"  # auto (openvino on CPU for mean pooling, torch on CUDA) | torch | openvino | onnx
    export_dir: str | None = None  # ONNX export + compiled blobs; default $ROUTER_LITE_HOME/backbones

    _backbone: Any = PrivateAttr(default=None)

    def resolved_device(self) -> str:
        return resolve_device(self.device)

    def get_backbone(self) -> Backbone:
        if self._backbone is None:
            self._backbone = Backbone(
                self.model, pooling=self.pooling, device=self.resolved_device(), dtype=self.dtype,
                max_seq_length=self.max_seq_length, revision=self.revision,
                runtime=Runtime(self.batch_size, self.backend, self.export_dir, log_every=self.log_every))
        return self._backbone


# What `bench/embed.py` measured when the default CPU backend was chosen (docs/backbones.md has the full table):
# speed vs the float32 torch forward on the same batches, cosine to the float32 rows, routing decisions of a head
# trained on float32 embeddings. Shown as metadata of `prompt_embeddings`.
CPU_BACKEND_CHOICE = {
    "chosen": "openvino (bf16 where the CPU has AVX512-BF16 / AMX, else f32)",
    "measured_by": "bench/embed.py --n 256 --rounds 3 (demo MMLU-Pro prompts, 2-core AMD EPYC with AVX512-BF16)",
    "fp32_head_quality_ci95": [0.6873, 0.7519],  # held-out reward of the head trained on float32 embeddings, n=774
    "rows": [
        {"backend": "torch-fp32", "x_fp32_wall": 1.0, "x_fp32_cpu": 1.0, "cosine_min": 1.0,
         "decision_agreement": 1.0, "quality": 0.7196, "quality_in_fp32_ci": True},
        {"backend": "torch-bf16", "x_fp32_wall": 1.853, "x_fp32_cpu": 1.957, "cosine_min": 0.999967,
         "decision_agreement": 1.0, "quality": 0.7196, "quality_in_fp32_ci": True},
        {"backend": "onnx-fp32", "x_fp32_wall": 1.49, "x_fp32_cpu": 1.622, "cosine_min": 1.0,
         "decision_agreement": 1.0, "quality": 0.7196, "quality_in_fp32_ci": True},
        {"backend": "onnx-int8", "x_fp32_wall": 2.195, "x_fp32_cpu": 2.513, "cosine_min": 0.992676,
         "decision_agreement": 0.9935, "quality": 0.7196, "quality_in_fp32_ci": True},
        {"backend": "openvino-fp32", "x_fp32_wall": 2.3, "x_fp32_cpu": 2.454, "cosine_min": 1.0,
         "decision_agreement": 1.0, "quality": 0.7196, "quality_in_fp32_ci": True},
        {"backend": "openvino-bf16", "x_fp32_wall": 4.15, "x_fp32_cpu": 4.238, "cosine_min": 0.999963,
         "decision_agreement": 1.0, "quality": 0.7196, "quality_in_fp32_ci": True},
    ],
}
