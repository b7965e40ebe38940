"""Embedding backends side by side: speed vs the float32 torch forward, cosine, routing decisions, router quality.

    python bench/embed.py                         # 256 demo prompts, 3 rounds, every backend it can run
    python bench/embed.py --n 64 --rounds 1 --only openvino-bf16
    python bench/embed.py --prompts-file my.jsonl --no-quality

Variants (all through `pipeline.embed.backbone.Backbone`, the same longest-first batches of --batch-size prompts):
- torch-fp32     backend="torch", float32: the reference every ratio and cosine is taken against
- torch-bf16     backend="torch", dtype="bfloat16" (CPU autocast)
- onnx-fp32      backend="onnx": ONNX Runtime, float32, all graph optimisations
- onnx-int8      the same export, onnxruntime quantize_dynamic (per-channel QInt8; FFN down-projections kept float)
- openvino-fp32  backend="openvino", dtype="float32"
- openvino-bf16  backend="openvino", dtype="bfloat16" (bf16 inference precision: AVX512-BF16 / AMX)
- static         Backbone("static"): Model2Vec distilled from the bundled MiniLM (256-d; built once, cached)
Speed: round-robin rounds, each round timed on the same prompts; the ratio to torch-fp32 is taken per round (same
machine state) and the median reported, wall clock and process CPU time.

Routing (unless --no-quality): the demo task pool and reward matrix under $ROUTER_LITE_HOME (materialised with
`router-lite run --upto reward_matrix` when missing). A head is trained on float32-torch embeddings of the
train/validation rows (cached in $ROUTER_LITE_HOME/embeddings); each variant embeds the held-out test prompts and
the same head routes them: decision agreement with the float32 picks, held-out reward, and whether it lies in the
95 % bootstrap interval of the float32 head's reward (plus the paired interval of the difference).

The static backbone embeds into another space (256-d), so the float32 head cannot read its rows: it gets its own
head, trained the same way on its own embeddings of the same train/validation rows; its agreement is with the float32
head's picks and its held-out reward is set against the float32 head's 95 % CI (goal: inside it; and >= 30x the
prompts/s of OpenVINO bf16).

Criteria for the default CPU backend: speed >= 3x, cosine min >= 0.995, agreement >= 0.99, quality in the CI.
Writes $ROUTER_LITE_HOME/bench/embed.json {backend, speedup_vs_torch_fp32, cosine_min, decision_agreement, ...,
static: {prompts_per_s, speedup_vs_torch_fp32, speedup_vs_openvino_bf16, decision_agreement, test_quality,
test_quality_fp32, ci_low, ci_high, quality_in_fp32_ci}}.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from pipeline.core.prompts import mcq_prompt

ROOT = Path(__file__).resolve().parents[1]
TMP_MMLU_PRO = Path("/tmp/mp/model_outputs_gemini-1.5-pro-002_5shots.json")
VARIANTS = ("torch-fp32", "torch-bf16", "onnx-fp32", "onnx-int8", "openvino-fp32", "openvino-bf16", "static")


# ------------------------------------------------------------------ prompts
def _records_to_prompts(records) -> list[str]:
    out = []
    for r in records:
        if isinstance(r, str):
            out.append(r)
        elif r.get("prompt"):
            out.append(str(r["prompt"]))
        elif r.get("question") is not None and r.get("options") is not None and len(r["options"]) > 0:
            out.append(mcq_prompt(str(r["question"]), [str(o) for o in r["options"]]))
    return out


def _read_file(path: Path) -> list[str]:
    if path.suffix == ".parquet":
        import pandas as pd

        return _records_to_prompts(pd.read_parquet(path).to_dict("records"))
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".txt":
        return [line for line in text.splitlines() if line.strip()]
    if path.suffix == ".jsonl":
        return _records_to_prompts(json.loads(line) for line in text.splitlines() if line.strip())
    data = json.loads(text)
    return _records_to_prompts(data if isinstance(data, list) else data.get("records", []))


def synthetic_prompts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["energy", "mass", "velocity", "market", "price", "contract", "enzyme", "protein", "court", "statute",
             "integral", "matrix", "series", "voltage", "current", "torque", "entropy", "inflation", "demand", "cell",
             "membrane", "gene", "neuron", "theorem", "proof"]
    out = []
    for i in range(n):
        q = " ".join(rng.choice(words) for _ in range(rng.randint(15, 120))).capitalize() + "?"
        opts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 8))) for _ in range(10)]
        out.append(mcq_prompt(f"Question {i}: {q}", opts))
    return out


def load_prompts(n: int, prompts_file: str | None, seed: int = 0) -> tuple[list[str], str]:
    candidates = [Path(prompts_file)] if prompts_file else []
    candidates += [TMP_MMLU_PRO] + [Path(p) for p in sorted(glob.glob(str(ROOT / "data/sources/mmlu_pro/*.parquet")))]
    for path in candidates:
        if path.is_file():
            try:
                prompts = list(dict.fromkeys(_read_file(path)))  # distinct, first occurrence order
            except Exception as e:  # noqa: BLE001 - e.g. no pandas/pyarrow for a parquet: try the next source
                if prompts_file and path == Path(prompts_file):
                    raise SystemExit(f"--prompts-file {prompts_file}: {type(e).__name__}: {e}") from e
                print(f"# prompts from {path} skipped: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            if prompts:
                random.Random(seed).shuffle(prompts)  # mix categories / lengths
                return prompts[:n], str(path)
        elif prompts_file and path == Path(prompts_file):
            raise SystemExit(f"--prompts-file {prompts_file} does not exist")
    return synthetic_prompts(n, seed), "synthetic"


# ------------------------------------------------------------------ helpers
def batches(prompts: list[str], batch_size: int) -> list[list[int]]:
    """Longest-first index batches: the same grouping as Backbone.encode."""
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def mean_pool_np(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(np.float32)
    e = (hidden.astype(np.float32) * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


class Clock:
    """Wall and process CPU seconds (all threads) of a block: CPU time stays meaningful on a shared machine."""

    def __enter__(self):
        self.w0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.w0, time.process_time() - self.c0


def run_batched(fn, prompts, batch_size) -> tuple[np.ndarray, Clock]:
    """fn(list[str]) -> (b, d) rows; returns embeddings in input order and the clock."""
    out = None
    with Clock() as clock:
        for idx in batches(prompts, batch_size):
            e = np.asarray(fn([prompts[i] for i in idx]), dtype=np.float32)
            if out is None:
                out = np.empty((len(prompts), e.shape[1]), np.float32)
            out[idx] = e
    return out, clock




def cosine(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    c = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(c.mean()), float(c.min())


def quantize_int8(onnx_path: Path, out: Path) -> Path:
    """Dynamic int8 (per-channel weights); the FFN down-projections stay float: quantising them too costs the most
    cosine (their inputs are GELU outputs with a long tail, per-tensor activation scales lose them)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if not out.is_file():
        names = [n.name for n in onnx.load(str(onnx_path)).graph.node if n.op_type == "MatMul"]
        keep = [n for n in names if n.endswith("/output/dense/MatMul") and "attention" not in n]
        quantize_dynamic(str(onnx_path), str(out), weight_type=QuantType.QInt8, per_channel=True,
                         nodes_to_exclude=keep, extra_options={"MatMulConstBOnly": True})
    return out


def build_variants(want, bs: int, export_dir: Path, log=print) -> dict:
    """{name: Backbone}: variants whose backend could not be used (it fell back to torch) are left out."""
    import logging

    from pipeline.embed.backbone import Backbone, Runtime
    from pipeline.embed.fast_backbone import OrtEncoder

    logging.getLogger("pipeline.embed.backbone").setLevel(logging.ERROR)  # the bench reports skips itself
    specs = {"torch-fp32": ("torch", "float32"), "torch-bf16": ("torch", "bfloat16"), "onnx-fp32": ("onnx", "auto"),
             "onnx-int8": ("onnx", "auto"), "openvino-fp32": ("openvino", "float32"),
             "openvino-bf16": ("openvino", "bfloat16"), "static": ("static", "auto")}
    out = {}
    for name, (backend, dtype) in specs.items():
        if name not in want:
            continue
        if name == "static":  # distilled from the bundled MiniLM on first use (~2 min), then read from the cache
            try:
                out[name] = Backbone("static", runtime=Runtime(batch_size=bs, export_dir=export_dir, log_every=10**9))
            except Exception as e:  # noqa: BLE001 - model2vec missing: the rest of the table still runs
                log(f"# static skipped ({type(e).__name__}: {e})")
            continue
        bb = Backbone(dtype=dtype, runtime=Runtime(batch_size=bs, backend=backend, export_dir=export_dir,
                                                   log_every=10**9))
        if bb.backend != backend:
            log(f"# {name} skipped: backend {backend!r} unavailable here (pip install onnx onnxruntime openvino)")
            continue
        if name == "onnx-int8":
            try:
                bb._fast = OrtEncoder(quantize_int8(export_dir / bb.key / "model.onnx",
                                                    export_dir / bb.key / "model.int8.onnx"))
                bb.precision = "int8"
            except Exception as e:  # noqa: BLE001
                log(f"# onnx-int8 skipped ({type(e).__name__}: {e})")
                continue
        out[name] = bb
    return out


def speed(variants: dict, prompts: list[str], rounds: int) -> dict:
    """Round-robin passes; per variant the fastest pass and the per-round ratio to torch-fp32 (median)."""
    for bb in variants.values():
        bb.encode(prompts[:8])  # warm-up: first-call allocations, compiled kernels
    clocks: dict[str, list[Clock]] = {k: [] for k in variants}
    embs = {}
    for r in range(max(1, rounds)):
        for name, bb in variants.items():
            with Clock() as c:
                embs[name] = bb.encode(prompts)
            clocks[name].append(c)
        print(f"# speed round {r + 1}/{rounds} done", flush=True)
    base, n = clocks["torch-fp32"], len(prompts)
    res = {}
    ov = clocks.get("openvino-bf16")
    for name in variants:
        cs = clocks[name]
        same_space = embs[name].shape == embs["torch-fp32"].shape  # the static backbone has its own space
        cm, cmin = cosine(embs[name], embs["torch-fp32"]) if same_space else (None, None)
        res[name] = {"prompts_per_s": round(n / min(c.wall for c in cs), 2),
                     "prompts_per_cpu_s": round(n / min(c.cpu for c in cs), 2),
                     "speedup_wall": round(float(np.median([b.wall / c.wall for b, c in zip(base, cs)])), 3),
                     "speedup_cpu": round(float(np.median([b.cpu / c.cpu for b, c in zip(base, cs)])), 3),
                     "per_round_wall": [round(b.wall / c.wall, 3) for b, c in zip(base, cs)],
                     "cosine_mean": None if cm is None else round(cm, 6),
                     "cosine_min": None if cmin is None else round(cmin, 6)}
        if ov is not None:  # the same per-round ratio against the default CPU backend
            res[name]["speedup_vs_openvino_bf16"] = round(float(np.median([o.wall / c.wall
                                                                          for o, c in zip(ov, cs)])), 3)
    return res


def demo_data(home: Path):
    """(tasks, rewards) of the demo pool from the materialised assets (read through Dagster: cli/lineage.py);
    materialises them when missing."""
    import subprocess

    from cli import lineage
    from pipeline.core.errors import RouterLiteError

    try:
        return lineage.load("task_pool", home=str(home)), lineage.load("reward_matrix", home=str(home))
    except RouterLiteError:
        print("# task_pool / reward_matrix not materialised: `router-lite run --upto reward_matrix`", flush=True)
        subprocess.run([sys.executable, "-c", "from cli.main import main; raise SystemExit(main())", "run",
                        "--upto", "reward_matrix"], cwd=ROOT, check=True)
    return lineage.load("task_pool", home=str(home)), lineage.load("reward_matrix", home=str(home))


def routing(variants: dict, home: Path, boot: int = 2000) -> dict:
    """Head trained on float32 embeddings; each variant's test embeddings routed by it (see the module doc)."""
    from pipeline.collect.rewards import effective_rewards, to_arrays
    from pipeline.embed.backbone import EmbeddingCache
    from pipeline.profile import load_profile
    from pipeline.route.fit import split_masks
    from pipeline.route.train import PromptRows, train_head

    tasks, rewards = demo_data(home)
    joined = rewards[["task_id"]].merge(tasks[["task_id", "prompt", "split"]], on="task_id", how="left")
    agents, R, B, _ = to_arrays(rewards)
    m = split_masks(joined["split"].reset_index(drop=True), "test", joined["task_id"].astype(str).tolist())
    tr, va, te = m["train"], m["validation"], m["held_out"]
    prompts = joined["prompt"].tolist()
    fp32 = variants["torch-fp32"]
    print(f"# routing check: {int(tr.sum())} train / {int(va.sum())} validation rows embedded by torch-fp32 "
          f"(cached), {int(te.sum())} test rows by every variant", flush=True)
    X = EmbeddingCache(home / "embeddings").get_or_compute(prompts, fp32)
    head, _ = train_head(PromptRows(X[tr], R[tr], B[tr]), PromptRows(X[va], R[va], B[va]), load_profile("demo").train,
                         agents)
    U = effective_rewards(R[te], B[te])
    rows = np.arange(len(U))
    test_prompts = [p for p, t in zip(prompts, te) if t]
    ref = head.pick(X[te])
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(U), size=(boot, len(U)))
    ref_r = U[rows, ref]
    q_ref = float(ref_r.mean())
    ci = np.percentile(ref_r[idx].mean(1), [2.5, 97.5])
    out = {"n_test": len(U), "head_picks_distinct": len(set(ref.tolist())),
           "fp32_quality": round(q_ref, 4), "fp32_quality_ci95": [round(float(c), 4) for c in ci]}
    for name, bb in variants.items():
        if bb.dim != fp32.dim or getattr(bb, "is_static", False):  # its own space: its own head, trained alike
            Xs = EmbeddingCache(home / "embeddings").get_or_compute(prompts, bb)
            own, _ = train_head(PromptRows(Xs[tr], R[tr], B[tr]), PromptRows(Xs[va], R[va], B[va]),
                                load_profile("demo").train, agents)
            picks = own.pick(Xs[te])
        else:
            picks = head.pick(X[te] if name == "torch-fp32" else bb.encode(test_prompts))
        r = U[rows, picks]
        diff = (r - ref_r)[idx].mean(1)
        q = float(r.mean())
        out[name] = {"decision_agreement": round(float((picks == ref).mean()), 4), "quality": round(q, 4),
                     "quality_diff_ci95": [round(float(c), 4) for c in np.percentile(diff, [2.5, 97.5])],
                     "quality_in_fp32_ci": bool(ci[0] <= q <= ci[1])}
    return out


def verdict(sp: dict, rt: dict | None) -> dict:
    if sp["cosine_min"] is None:  # the static backbone: its own goals (module docstring)
        ok = {"speed_30x_openvino_bf16": (sp.get("speedup_vs_openvino_bf16") or 0) >= 30.0}
        if rt:
            ok["quality_in_ci"] = rt["quality_in_fp32_ci"]
        return ok
    ok = {"speed_3x": sp["speedup_wall"] >= 3.0, "cosine_min_0.995": sp["cosine_min"] >= 0.995}
    if rt:
        ok["agreement_0.99"] = rt["decision_agreement"] >= 0.99
        ok["quality_in_ci"] = rt["quality_in_fp32_ci"]
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=256, help="prompts for the speed and cosine pass (default 256)")
    ap.add_argument("--prompts-file", default=None, help="speed/cosine prompts from this file instead of the demo")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="round-robin speed passes (default 3)")
    ap.add_argument("--only", default="", help=f"comma list of {','.join(VARIANTS)} (default: all)")
    ap.add_argument("--no-quality", action="store_true", help="skip the routing check (needs the demo assets)")
    ap.add_argument("--out", default=None, help="JSON path (default $ROUTER_LITE_HOME/bench/embed.json)")
    args = ap.parse_args(argv)
    want = (set(args.only.split(",")) if args.only else set(VARIANTS)) | {"torch-fp32"}
    bad = want - set(VARIANTS)
    if bad:
        raise SystemExit(f"--only: unknown variant(s) {sorted(bad)}; known: {', '.join(VARIANTS)}")

    import torch

    from pipeline.embed.backbone import Backbone, Runtime

    home = Path(os.environ.get("ROUTER_LITE_HOME", ROOT / ".router-lite")).resolve()
    default = Backbone(runtime=Runtime(log_every=10**9))  # what a run uses on this machine (auto backend)
    chosen = {"torch": "torch-fp32", "onnx": "onnx-fp32"}.get(default.backend) or (
        "openvino-bf16" if default.precision == "bfloat16" else "openvino-fp32")
    pool = None
    if args.prompts_file is None:
        from cli import lineage
        from pipeline.core.errors import RouterLiteError

        with contextlib.suppress(RouterLiteError):  # not materialised: the bundled prompts below
            pool = lineage.load("task_pool", home=str(home))
    if pool is not None:
        prompts = pool["prompt"].sample(frac=1.0, random_state=0).tolist()[:args.n]
        source = f"{home}: task_pool (the demo prompts)"
    else:
        prompts, source = load_prompts(args.n, args.prompts_file)
    print(f"# {len(prompts)} prompts from {source}; batch {args.batch_size}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {os.cpu_count()} cores; default CPU backend here: {default.backend} "
          f"{default.precision}", flush=True)
    variants = build_variants(want | {chosen}, args.batch_size, home / "backbones", log=lambda m: print(m, flush=True))
    sp = speed(variants, prompts, args.rounds)
    rt = None
    if not args.no_quality:
        rt = routing(variants, home)

    print(f"\n{'backend':<14} {'prompts/s':>9} {'x fp32 wall':>11} {'x cpu':>6} {'cos min':>8} {'agree':>6} "
          f"{'quality':>7} {'diff CI95':>17}  criteria")
    for name in variants:
        s, r = sp[name], (rt or {}).get(name)
        ok = verdict(s, r)
        q = ((f"{r['decision_agreement']:>6.3f} {r['quality']:>7.4f} "
              f"[{r['quality_diff_ci95'][0]:+.4f},{r['quality_diff_ci95'][1]:+.4f}]") if r
             else f"{'-':>6} {'-':>7} {'-':>17}")
        mark = "*" if name == chosen else " "
        cos = f"{s['cosine_min']:>8.5f}" if s["cosine_min"] is not None else f"{'-':>8}"
        print(f"{name + mark:<14} {s['prompts_per_s']:>9.1f} {s['speedup_wall']:>11.2f} {s['speedup_cpu']:>6.2f} "
              f"{cos} {q}  "
              f"{'all met' if all(ok.values()) else 'missing ' + ','.join(k for k, v in ok.items() if not v)}")
    if rt:
        print(f"fp32 head held-out reward {rt['fp32_quality']:.4f}, 95 % CI {rt['fp32_quality_ci95']} "
              f"(n={rt['n_test']}, {rt['head_picks_distinct']} distinct agents picked); * = default CPU backend")
    s, r = sp[chosen], (rt or {}).get(chosen, {})
    result = {"backend": chosen, "speedup_vs_torch_fp32": s["speedup_wall"], "speedup_cpu_time": s["speedup_cpu"],
              "cosine_min": s["cosine_min"], "decision_agreement": r.get("decision_agreement"),
              "quality_in_fp32_ci": r.get("quality_in_fp32_ci"), "criteria": verdict(s, r or None),
              "n_prompts": len(prompts), "source": source, "batch_size": args.batch_size, "rounds": args.rounds,
              "cores": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2), "speed": sp, "routing": rt}
    if "static" in sp:
        st, rs = sp["static"], (rt or {}).get("static", {})
        ci = (rt or {}).get("fp32_quality_ci95") or [None, None]
        result["static"] = {"prompts_per_s": st["prompts_per_s"], "speedup_vs_torch_fp32": st["speedup_wall"],
                            "speedup_vs_openvino_bf16": st.get("speedup_vs_openvino_bf16"),
                            "openvino_bf16_prompts_per_s": sp.get("openvino-bf16", {}).get("prompts_per_s"),
                            "decision_agreement": rs.get("decision_agreement"), "test_quality": rs.get("quality"),
                            "test_quality_fp32": (rt or {}).get("fp32_quality"), "ci_low": ci[0], "ci_high": ci[1],
                            "quality_diff_ci95": rs.get("quality_diff_ci95"),
                            "quality_in_fp32_ci": rs.get("quality_in_fp32_ci"),
                            "criteria": verdict(st, rs or None)}
    out = Path(args.out) if args.out else home / "bench" / "embed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"# wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
