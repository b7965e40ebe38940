"""Embedding throughput: our `pipeline.embed.Backbone` path vs a raw forward, faster CPU variants, cache re-run.

    .venv/bin/python bench/embed.py                      # ~300 MMLU-Pro prompts, all variants it can run
    .venv/bin/python bench/embed.py --n 64 --only ours,raw --repeats 1
    .venv/bin/python bench/embed.py --prompts-file my.jsonl --out reports/bench_embed.json

Prompts (first that exists): --prompts-file (JSON list / JSONL of records with question+options or prompt, a
Parquet with the same columns, or a .txt with one prompt per line), /tmp/mp/model_outputs_gemini-1.5-pro-002_5shots.json,
data/sources/mmlu_pro/*.parquet, else synthetic MCQ prompts. All MCQ prompts go through `pipeline.prompts.mcq_prompt`.

Variants (each on the same longest-first batches; skipped with a note when its package is missing):
- raw        tokenizer + transformers AutoModel forward + masked mean pool + L2 norm (the reference cost)
- ours       Backbone (sentence-transformers path), float32            -> ratio ours/raw (goal >= 0.95)
- bf16       Backbone(dtype="bfloat16"): CPU autocast (AMX / AVX512-BF16 where the CPU has them)
- int8       torch.ao.quantization.quantize_dynamic on the Linear layers
- onnx       ONNX Runtime on a local torch.onnx export of the bundled model (pip: onnxruntime onnx)
- onnx-int8  the same export, onnxruntime.quantization.quantize_dynamic (QInt8 weights)
- openvino   OpenVINO CPU on the same ONNX file, fp32 and bf16 inference precision (pip: openvino)
each at max_seq_length 256 and 128; plus the EmbeddingCache cold run and re-run. Cosine: each variant's row
vs the float32 max_seq_length 256 baseline, same prompt.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from pipeline.prompts import mcq_prompt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TMP_MMLU_PRO = Path("/tmp/mp/model_outputs_gemini-1.5-pro-002_5shots.json")
VARIANTS = ("raw", "ours", "bf16", "int8", "onnx", "onnx-int8", "openvino", "cache")


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
    words = ("energy mass velocity market price contract enzyme protein court statute integral matrix series "
             "voltage current torque entropy inflation demand cell membrane gene neuron theorem proof").split()
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
                    raise SystemExit(f"--prompts-file {prompts_file}: {type(e).__name__}: {e}")
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


class Raw:
    """The reference: tokenizer + AutoModel + masked mean + normalise, nothing else."""

    def __init__(self, model_dir: str, max_len: int):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.torch, self.max_len = torch, max_len
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModel.from_pretrained(model_dir).eval()

    def __call__(self, texts):
        torch = self.torch
        enc = self.tok(texts, padding=True, truncation=True, max_length=self.max_len, return_tensors="pt")
        with torch.inference_mode():
            h = self.model(**enc).last_hidden_state
            m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
            e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(e, dim=-1).numpy()


def export_onnx(model_dir: str, out_dir: Path) -> Path:
    """torch.onnx export (eager attention: the SDPA path exports a wrong mask) of the bundled BERT encoder."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = out_dir / "model.onnx"
    if path.exists():
        return path
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state

    enc = tok(["an example", "another longer example sentence"], padding=True, return_tensors="pt")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    torch.onnx.export(Wrap(model), tuple(enc[k] for k in names), str(path), input_names=names,
                      output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                      dynamic_axes={k: {0: "batch", 1: "seq"} for k in names + ["last_hidden_state"]})
    return path


class Ort:
    def __init__(self, onnx_path: Path, tok, max_len: int):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        self.tok, self.max_len = tok, max_len
        self.inputs = [i.name for i in self.sess.get_inputs()]

    def __call__(self, texts):
        enc = self.tok(texts, padding=True, truncation=True, max_length=self.max_len, return_tensors="np")
        h = self.sess.run(None, {k: enc[k].astype(np.int64) for k in self.inputs})[0]
        return mean_pool_np(h, enc["attention_mask"])


class OpenVino:
    def __init__(self, onnx_path: Path, tok, max_len: int, precision: str):
        import openvino as ov

        core = ov.Core()
        self.compiled = core.compile_model(core.read_model(str(onnx_path)), "CPU",
                                           {"INFERENCE_PRECISION_HINT": precision})
        self.tok, self.max_len = tok, max_len
        self.inputs = [i.get_any_name() for i in self.compiled.inputs]

    def __call__(self, texts):
        enc = self.tok(texts, padding=True, truncation=True, max_length=self.max_len, return_tensors="np")
        h = self.compiled({k: enc[k].astype(np.int64) for k in self.inputs})[0]
        return mean_pool_np(np.asarray(h), enc["attention_mask"])


# ------------------------------------------------------------------ main
def build_variants(want, seqs, model_dir, bs, tmpdir, log=print):
    """[(name, seq, note, fn)]: fn(prompts) -> embeddings in input order; skipped variants are logged."""
    import warnings

    import torch

    from pipeline.embed import Backbone

    out = []

    def backbone(seq, **kw):
        return Backbone(model_dir, batch_size=bs, max_seq_length=seq, log_every=10**9, **kw)

    def batched(fn):
        return lambda ps: run_batched(fn, ps, bs)[0]

    for seq in seqs:
        if "ours" in want:
            out.append(("ours", seq, "Backbone float32", backbone(seq).encode))
        if "raw" in want and seq == seqs[0]:
            out.append(("raw", seq, "AutoModel + masked mean", batched(Raw(model_dir, seq))))
        if "bf16" in want:
            out.append(("bf16", seq, "Backbone dtype=bfloat16 (CPU autocast)", backbone(seq, dtype="bfloat16").encode))
        if "int8" in want:
            b = backbone(seq)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                b._st = torch.ao.quantization.quantize_dynamic(b._st, {torch.nn.Linear}, dtype=torch.qint8)
            out.append(("int8", seq, "torch quantize_dynamic(Linear, qint8)", b.encode))
    onnx_path = None
    if want & {"onnx", "onnx-int8", "openvino"}:
        try:
            import onnx  # noqa: F401

            onnx_path = export_onnx(model_dir, tmpdir)
        except Exception as e:  # noqa: BLE001
            log(f"# onnx export skipped ({type(e).__name__}: {e}); pip install onnx")
    tok = Backbone(model_dir).tokenizer if onnx_path else None
    if onnx_path and want & {"onnx", "onnx-int8"}:
        try:
            import onnxruntime  # noqa: F401

            q_path = None
            if "onnx-int8" in want:
                from onnxruntime.quantization import QuantType, quantize_dynamic

                q_path = tmpdir / "model.int8.onnx"
                quantize_dynamic(str(onnx_path), str(q_path), weight_type=QuantType.QInt8)
            for seq in seqs:
                if "onnx" in want:
                    out.append(("onnx", seq, "onnxruntime CPU float32", batched(Ort(onnx_path, tok, seq))))
                if q_path:
                    out.append(("onnx-int8", seq, "onnxruntime quantize_dynamic QInt8", batched(Ort(q_path, tok, seq))))
        except ImportError as e:
            log(f"# onnx skipped ({e}); pip install onnxruntime onnx")
    if onnx_path and "openvino" in want:
        try:
            import openvino  # noqa: F401

            for precision in ("f32", "bf16"):
                for seq in seqs:
                    out.append((f"openvino-{precision}", seq, "OpenVINO CPU, INFERENCE_PRECISION_HINT",
                                batched(OpenVino(onnx_path, tok, seq, precision))))
        except ImportError as e:
            log(f"# openvino skipped ({e}); pip install openvino")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300, help="prompts (default 300)")
    ap.add_argument("--prompts-file", default=None)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2,
                    help="round-robin passes over all variants; each keeps its fastest pass (default 2)")
    ap.add_argument("--only", default="", help=f"comma list of {','.join(VARIANTS)} (default: all)")
    ap.add_argument("--seq", default="256,128", help="max_seq_length values (first = the baseline)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    want = set(args.only.split(",")) if args.only else set(VARIANTS)
    want.add("ours")  # the baseline every cosine is taken against
    seqs = [int(s) for s in args.seq.split(",")]

    import torch

    from pipeline.embed import EmbeddingCache, bundled_model_path

    prompts, source = load_prompts(args.n, args.prompts_file)
    n = len(prompts)
    model_dir = str(bundled_model_path())
    bs = args.batch_size
    print(f"# {n} prompts from {source}; batch {bs}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} cores; {args.rounds} round-robin rounds, fastest pass kept", flush=True)
    tmpdir = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    variants = build_variants(want, seqs, model_dir, bs, tmpdir, log=lambda m: print(m, flush=True))

    warm = prompts[:8]
    for _, _, _, fn in variants:
        fn(warm)
    clocks: dict[tuple[str, int], list[Clock]] = {}
    embs: dict[tuple[str, int], np.ndarray] = {}
    for r in range(max(1, args.rounds)):
        for name, seq, _, fn in variants:
            with Clock() as c:
                embs[(name, seq)] = fn(prompts)
            clocks.setdefault((name, seq), []).append(c)
        print(f"# round {r + 1} done", flush=True)

    base = embs[("ours", seqs[0])]
    rows: list[dict] = []
    print(f"{'variant':<14} {'seq':>4} {'prompts/s':>10} {'per cpu-s':>10} {'cos mean':>9} {'cos min':>9}  note")
    for name, seq, note, _ in variants:
        cs = clocks[(name, seq)]
        wall, cpu = min(c.wall for c in cs), min(c.cpu for c in cs)
        cm, cmin = cosine(embs[(name, seq)], base)
        rows.append({"variant": name, "max_seq_length": seq, "prompts_per_s": round(n / wall, 2),
                     "prompts_per_cpu_s": round(n / cpu, 2), "cos_mean": round(cm, 6), "cos_min": round(cmin, 6),
                     "note": note})
        print(f"{name:<14} {seq:>4} {n / wall:>10.2f} {n / cpu:>10.2f} {cm:>9.6f} {cmin:>9.6f}  {note}")

    ratio = None
    if ("raw", seqs[0]) in clocks:
        o, w = clocks[("ours", seqs[0])], clocks[("raw", seqs[0])]
        per_round = [(b.wall / a.wall, b.cpu / a.cpu) for a, b in zip(o, w)]  # raw time / ours time
        ratio = {"wall_median": round(float(np.median([x for x, _ in per_round])), 3),
                 "cpu_median": round(float(np.median([y for _, y in per_round])), 3),
                 "per_round_wall": [round(x, 3) for x, _ in per_round],
                 "per_round_cpu": [round(y, 3) for _, y in per_round]}
        print(f"ratio ours/raw prompts/s: median over rounds wall {ratio['wall_median']:.3f}, "
              f"cpu-time {ratio['cpu_median']:.3f} (per round wall {ratio['per_round_wall']}, "
              f"cpu {ratio['per_round_cpu']}); goal >= 0.95")

    cache_times = None
    if "cache" in want:
        ours = next(fn.__self__ for name, seq, _, fn in variants if name == "ours" and seq == seqs[0])
        cache = EmbeddingCache(tmpdir / "embeddings")
        with Clock() as c1:
            e1 = cache.get_or_compute(prompts, ours)
        with Clock() as c2:
            e2 = cache.get_or_compute(prompts, ours)
        assert np.array_equal(e1, e2) and np.allclose(e1, base, atol=1e-6)
        cache_times = {"cold_s": round(c1.wall, 3), "cold_prompts_per_cpu_s": round(n / c1.cpu, 2),
                       "rerun_s": round(c2.wall, 4), "rerun_prompts_per_s": round(n / c2.wall, 1)}
        print(f"cache: cold {c1.wall:.2f}s ({n / c1.cpu:.2f} prompts/cpu-s), re-run {c2.wall * 1000:.1f} ms "
              f"({n / c2.wall:.0f} prompts/s), identical rows, nothing re-embedded", flush=True)

    result = {"n_prompts": n, "source": source, "batch_size": bs, "torch": torch.__version__,
              "threads": torch.get_num_threads(), "rounds": args.rounds, "ratio_ours_over_raw": ratio,
              "cache": cache_times, "rows": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"# wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
