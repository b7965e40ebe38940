"""The embedding backbone as a Dagster resource: the one place that decides device and precision.

`device="auto"` takes CUDA when `torch.cuda.is_available()`, else the CPU; `dtype="auto"` is float16 on CUDA and
float32 on the CPU (`bfloat16` is a fast opt-in on CPUs with AMX / AVX512-BF16, see docs/backbones.md).
The loaded `pipeline.embed.Backbone` is built once per resource instance and reused.
"""
from __future__ import annotations

from typing import Any, Optional

from dagster import ConfigurableResource
from pydantic import PrivateAttr

from pipeline.embed import DEFAULT_MODEL_ID, Backbone
from pipeline.errors import RouterLiteError

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
    """Which frozen model embeds the prompts, and how (see `pipeline.embed.Backbone`)."""

    model: str = DEFAULT_MODEL_ID  # hub id or local dir; the MiniLM id maps to the bundled copy
    pooling: str = "mean"  # mean (sentence-transformers encoders) | last_token (decoders, e.g. Qwen/Qwen3-1.7B)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (fp16 on CUDA, fp32 on CPU) | float32 | float16 | bfloat16
    batch_size: int = 64
    max_seq_length: int = 256
    revision: Optional[str] = None
    log_every: int = 10  # progress log line every N batches

    _backbone: Any = PrivateAttr(default=None)

    def resolved_device(self) -> str:
        return resolve_device(self.device)

    def get_backbone(self) -> Backbone:
        if self._backbone is None:
            self._backbone = Backbone(
                self.model, pooling=self.pooling, device=self.resolved_device(), dtype=self.dtype,
                batch_size=self.batch_size, max_seq_length=self.max_seq_length, revision=self.revision,
                log_every=self.log_every)
        return self._backbone
