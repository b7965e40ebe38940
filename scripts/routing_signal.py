"""How much of the oracle headroom of the demo pool can a router predict from the query? (docs/training.md)

Rewards: every bundled MMLU-Pro question recorded for all five demo agents, graded by the project's grader from the
bundled replay recordings (`data/replay`), the same way `make run` grades them. With `--zips` (maintainers: the public
TIGER-Lab zips) the same table is also computed from the official `pred == answer`, to show how much of the apparent
routing gain comes from answer extraction, and an information ceiling: a router that knows how the 17 other
TIGER-Lab models did on each question. Features: the bundled MiniLM (the pipeline's Backbone and embedding cache);
`--layers` adds mean-pooled inner layers of the same frozen model, `--tfidf` a word/bigram TF-IDF of the prompt.
Every number is a held-out test mean over seeded 60/20/20 splits (choices made on validation), minus the best single
agent (best on the training rows) on the same test rows.

    .venv/bin/python scripts/routing_signal.py [--layers] [--tfidf] [--zips DIR] [--without MODEL ...] [--out FILE]

About 9 min once to embed ~11,800 prompts on 2 CPU cores (cached under ROUTER_LITE_HOME/embeddings), ~9 min more for
--layers; the evaluations take ~3 min (~10 min with --tfidf).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.collect.grading import grade  # noqa: E402
from pipeline.embed.backbone import Backbone, EmbeddingCache  # noqa: E402
from pipeline.route.fit import ship_gate  # noqa: E402
from pipeline.route.knn import KnnRouter  # noqa: E402
from pipeline.route.train import PromptRows, TrainConfig, train_head  # noqa: E402
from pipeline.tasks.sources import load_source  # noqa: E402

GATE_CONFIDENCES = (0.0, 0.9, 0.95)


def demo_models() -> list[str]:
    cfg = yaml.safe_load((ROOT / "config/agents.yaml").read_text())
    return [a["model"] for a in cfg["pools"]["mmlu_pro"]["agents"]]


def load_rewards(models: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
    """(tasks recorded for every model, R (n, K) from the project's grader on the replayed text)."""
    tasks = load_source("mmlu_pro")
    rec = pd.read_parquet(ROOT / "data/replay/mmlu_pro_outputs.parquet", columns=["model", "question_id", "text"])
    text = {(m, int(q)): t for m, q, t in zip(rec["model"], rec["question_id"], rec["text"])}
    qids = tasks["question_id"].astype(int)
    keep = np.array([all((m, q) in text for m in models) for q in qids])
    tasks = tasks[keep].reset_index(drop=True)
    R = np.array([[float(grade(text[(m, int(q))], g, gr)[1]) for m in models]
                  for q, g, gr in zip(tasks["question_id"], tasks["gold"], tasks["grader"])], dtype=np.float32)
    return tasks, R


def zip_records(path: Path) -> dict[int, dict]:
    """question_id -> record of one TIGER-Lab model_outputs_<M>_5shots.zip."""
    with zipfile.ZipFile(path) as f:
        return {int(r["question_id"]): r for r in json.loads(f.read(f.namelist()[0])) if isinstance(r, dict)}


def official_rewards(tasks: pd.DataFrame, models: list[str], zips: Path) -> np.ndarray:
    cols = []
    for m in models:
        recs = zip_records(zips / f"model_outputs_{m}_5shots.zip")
        cols.append([float(recs[int(q)]["pred"] == recs[int(q)]["answer"]) for q in tasks["question_id"]])
    return np.array(cols, dtype=np.float32).T


def layer_features(prompts: list[str], cache: Path, layers=(2, 4, 6)) -> np.ndarray:
    """Mean-pooled hidden states of inner layers of the bundled MiniLM (frozen), concatenated, each L2-normalised."""
    import hashlib

    import torch
    from transformers import AutoModel, AutoTokenizer

    from pipeline.embed.backbone import bundled_model_path

    tag = hashlib.sha256("\n\x00".join(prompts).encode()).hexdigest()[:12]
    path = cache / f"minilm-layers-{'-'.join(map(str, layers))}-{tag}.npy"
    if path.exists():
        return np.load(path)
    tok = AutoTokenizer.from_pretrained(bundled_model_path())
    model = AutoModel.from_pretrained(bundled_model_path()).eval()
    out = np.zeros((len(prompts), len(layers), model.config.hidden_size), np.float32)
    order = np.argsort([len(p) for p in prompts])  # similar lengths per batch: less padding
    with torch.inference_mode():
        for s in range(0, len(prompts), 64):
            idx = order[s:s + 64]
            b = tok([prompts[i] for i in idx], padding=True, truncation=True, max_length=256, return_tensors="pt")
            hs = model(**b, output_hidden_states=True).hidden_states
            mask = b["attention_mask"].unsqueeze(-1).float()
            for j, layer in enumerate(layers):
                out[idx, j] = ((hs[layer] * mask).sum(1) / mask.sum(1)).numpy()
    out /= np.linalg.norm(out, axis=-1, keepdims=True)
    out = out.reshape(len(prompts), -1)
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, out)
    return out


def splits(n: int, seeds: list[int], size: int | None):
    for seed in seeds:
        perm = np.random.default_rng(seed).permutation(n)[:size]
        a, b = int(0.6 * len(perm)), int(0.8 * len(perm))
        yield perm[:a], perm[a:b], perm[b:]


def reward(R: np.ndarray, picks: np.ndarray) -> float:
    return float(R[np.arange(len(picks)), picks].mean())


def logistic_picks(F, R: np.ndarray, tr, va, te) -> np.ndarray:
    """Per-agent logistic regressions of correctness on features F (C on validation) -> test picks (argmax)."""
    from sklearn.linear_model import LogisticRegression

    best = None
    for C in (0.01, 0.1, 0.3, 1.0, 3.0):
        P = np.stack([LogisticRegression(C=C, max_iter=500).fit(F[tr], R[tr, j]).predict_proba(F[np.r_[va, te]])[:, 1]
                      for j in range(R.shape[1])], axis=1)
        v = reward(R[va], P[:len(va)].argmax(1))
        if best is None or v > best[0]:
            best = (v, P[len(va):].argmax(1))
    return best[1]


def tfidf_logistic(prompts: list[str], R: np.ndarray, tr, va, te) -> np.ndarray:
    """Logistic router on a word+bigram TF-IDF of the prompt, the vocabulary fitted on the training rows."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vec = TfidfVectorizer(min_df=3, ngram_range=(1, 2), sublinear_tf=True, max_features=50000)
    vec.fit([prompts[i] for i in tr])
    return logistic_picks(vec.transform(prompts), R, tr, va, te)


def other_models_correctness(tasks: pd.DataFrame, exclude: list[str], zips: Path) -> np.ndarray:
    """(n, M) official correctness of every other TIGER-Lab model on each question (0.5 where it has no record).

    Not a router feature (it is not known for a new query): an information ceiling. If even knowing how 17 other
    LLMs did on a question does not tell which demo agent to pick, no embedding of the question will.
    """
    cols = []
    for z in sorted(zips.glob("model_outputs_*_5shots.zip")):
        if z.name[len("model_outputs_"):-len("_5shots.zip")] in exclude:
            continue
        recs = zip_records(z)
        cols.append([float(recs[q]["pred"] == recs[q]["answer"]) if q in recs else 0.5
                     for q in tasks["question_id"].astype(int)])
    return np.array(cols, dtype=np.float32).T


def evaluate(R: np.ndarray, feats: dict[str, np.ndarray], cats: np.ndarray, prompts: list[str] | None,
             seeds: list[int], size: int | None, ceiling: np.ndarray | None = None) -> dict[str, list[float]]:
    res: dict[str, list[float]] = {}
    for tr, va, te in splits(len(R), seeds, size):
        bs = int(R[tr].mean(0).argmax())
        base = R[te, bs].mean()
        row = {"best single (absolute)": base, "oracle − best single": R[te].max(1).mean() - base}
        cat_best = {c: int(R[tr][cats[tr] == c].mean(0).argmax()) for c in np.unique(cats)}
        row["per-category best agent (category label given)"] = reward(
            R[te], np.array([cat_best[c] for c in cats[te]])) - base
        for name, X in feats.items():
            knn = KnnRouter().fit(X[tr], R[tr], X_val=X[va], R_val=R[va])
            row[f"kNN on {name}"] = reward(R[te], knn.pick(X[te])) - base
            head, _ = train_head(PromptRows(X[tr], R[tr]), PromptRows(X[va], R[va]), TrainConfig(log_every=0))
            row[f"sep-CMA-ES head on {name}"] = reward(R[te], head.pick(X[te])) - base
            if name == next(iter(feats)):  # the ship gate's confidence: does it keep real gains, drop noise?
                for conf in GATE_CONFIDENCES:
                    gate = ship_gate(head, bs, X[va], R[va], None, confidence=conf)
                    row[f"  … behind the ship gate, confidence {conf}"] = (
                        row[f"sep-CMA-ES head on {name}"] if gate["shipped"] == "head" else 0.0)
        if prompts is not None:
            row["logistic on TF-IDF"] = reward(R[te], tfidf_logistic(prompts, R, tr, va, te)) - base
        if ceiling is not None:
            row[f"ceiling: logistic on {ceiling.shape[1]} other models' correctness"] = reward(
                R[te], logistic_picks(ceiling, R, tr, va, te)) - base
        for k, v in row.items():
            res.setdefault(k, []).append(float(v))
    return res


def table(res: dict[str, list[float]], title: str) -> str:
    lines = [f"#### {title}", "", "| method | test − best single (mean ± sd) | splits above best single |",
             "|---|---|---|"]
    for k, v in res.items():
        a = np.array(v)
        above = "-" if "absolute" in k or "oracle" in k else f"{int((a > 0).sum())}/{len(a)}"
        lines.append(f"| {k} | {a.mean():+.4f} ± {a.std():.4f} | {above} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", action="store_true", help="add inner-layer MiniLM features (layers 2+4+6)")
    ap.add_argument("--tfidf", action="store_true", help="add a TF-IDF logistic router")
    ap.add_argument("--zips", type=Path, help="folder of the TIGER-Lab model_outputs_*_5shots.zip (official preds)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--sizes", type=int, nargs="+", default=[0, 3000], help="0 = all questions")
    ap.add_argument("--without", nargs="+", default=[], metavar="MODEL",
                    help="drop these demo models from the pool "
                         "(e.g. gemini-1.5-pro-002: a pool without its best agent)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/routing_signal.md"))
    a = ap.parse_args(argv)
    models = [m for m in demo_models() if m not in a.without]
    if unknown := sorted(set(a.without) - set(demo_models())):
        raise SystemExit(f"--without {unknown}: not in the demo pool {demo_models()}")
    tasks, R = load_rewards(models)
    prompts = tasks["prompt"].tolist()
    home = Path(os.environ.get("ROUTER_LITE_HOME", ROOT / ".router-lite"))
    bb = Backbone(max_seq_length=256)
    feats = {"MiniLM (pipeline)": EmbeddingCache(home / "embeddings").get_or_compute(prompts, bb)}
    if a.layers:
        feats["MiniLM layers 2+4+6"] = layer_features(prompts, home / "embeddings")
    cats = tasks["category"].to_numpy()
    out = [f"{len(R)} questions; agents {models}; accuracy (project grading) {R.mean(0).round(4).tolist()}; "
           f"oracle {R.max(1).mean():.4f}\n"]
    rewards = {"project grading (replayed text)": R}
    ceiling = other_models_correctness(tasks, demo_models(), a.zips) if a.zips else None
    if a.zips:
        O = official_rewards(tasks, models, a.zips)
        out.append(f"official pred accuracy {O.mean(0).round(4).tolist()}; oracle {O.max(1).mean():.4f}; "
                   f"cells that differ {(O != R).mean():.2%}\n")
        rewards["official pred == answer"] = O
    for rname, M in rewards.items():
        for size in a.sizes:
            n = len(M) if size == 0 else size
            use_tfidf = a.tfidf and rname.startswith("project")
            res = evaluate(M, feats, cats, prompts if use_tfidf else None, a.seeds, size or None, ceiling)
            out.append(table(res, f"{rname}, {n} questions, seeds {a.seeds}"))
            print(out[-1], flush=True)
    a.out.write_text("\n".join(out))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
