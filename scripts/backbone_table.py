"""The measured backbone tables of docs/backbones.md, generated from the bench JSON (never typed by hand).

Reads $ROUTER_LITE_HOME/bench/embed.json (bench/embed.py) and serve.json (bench/serve.py), and the routers' value
(`reports/router_value.json`) of a `router-lite run` with the default backbone in $ROUTER_LITE_HOME and, when
present, of one with the static backbone (`--static-home`, default $ROUTER_LITE_HOME/static-home: made by
`ROUTER_LITE_HOME=$ROUTER_LITE_HOME/static-home router-lite run --backbone static`).

    python scripts/backbone_table.py            # print the tables
    python scripts/backbone_table.py --write    # replace the block between the markers in docs/backbones.md
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "backbones.md"
START, END = "<!-- backbone-table:start (scripts/backbone_table.py) -->", "<!-- backbone-table:end -->"


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _f(v, fmt: str = ".4f", none: str = "-") -> str:
    return none if v is None else format(v, fmt)


def embed_table(embed: dict) -> list[str]:
    sp, rt = embed.get("speed", {}), embed.get("routing") or {}
    ci = rt.get("fp32_quality_ci95") or [None, None]
    lines = [f"Embedding ({embed.get('n_prompts')} demo prompts, batch {embed.get('batch_size')}, "
             f"{embed.get('rounds')} round-robin rounds, {embed.get('cores')} cores, load average "
             f"{embed.get('load_avg_1m', '?')} at the end; routing: {rt.get('n_test', '?')} held-out demo rows, "
             "float32-MiniLM head reward "
             f"{_f(rt.get('fp32_quality'))}, 95 % CI [{_f(ci[0])}, {_f(ci[1])}]):", "",
             "| backbone | prompts/s | x torch fp32 (wall) | x OpenVINO bf16 | cosine min to fp32 | decisions = fp32 "
             "head | held-out reward | in the fp32 CI |", "|---|---|---|---|---|---|---|---|"]
    for name in ("torch-fp32", "torch-bf16", "onnx-fp32", "onnx-int8", "openvino-fp32", "openvino-bf16", "static"):
        if name not in sp:
            continue
        s, r = sp[name], rt.get(name, {})
        lines.append(f"| {name}{' (own head)' if name == 'static' else ''} | {s['prompts_per_s']:.1f} | "
                     f"{s['speedup_wall']:.2f} | {_f(s.get('speedup_vs_openvino_bf16'), '.2f')} | "
                     f"{_f(s.get('cosine_min'), '.5f')} | {_f(r.get('decision_agreement'), '.3f')} | "
                     f"{_f(r.get('quality'))} | {'yes' if r.get('quality_in_fp32_ci') else 'no' if r else '-'} |")
    return lines


def value_table(values: dict[str, dict]) -> list[str]:
    if not values:
        return []
    lines = ["", "The routers' value, each from a whole `router-lite run` of the demo profile with that backbone "
                 "(held-out test split; `reports/router_value.json`):", "",
             "| backbone | max-quality reward [95 % CI] | parity: reward, cost ratio | best single | AIQ head | "
             "AIQ kNN | AIQ prior | oracle |", "|---|---|---|---|---|---|---|---|"]
    for name, v in values.items():
        mq, par = v["targets"]["max-quality"], v["targets"].get("parity", {})
        lines.append(f"| {name} | {mq['quality']:.4f} [{mq['ci_low']:.4f}, {mq['ci_high']:.4f}] | "
                     f"{_f(par.get('quality'))}, {_f(par.get('cost_ratio'), '.2f')} | "
                     f"{v['best_single']['quality']:.4f} ({v['best_single']['agent']}) | {_f(v['aiq'].get('head'))} | "
                     f"{_f(v['aiq'].get('knn'))} | {_f(v['aiq'].get('prior'))} | {_f(v.get('oracle'))} |")
    return lines


def serve_table(serve: dict) -> list[str]:
    lines = []
    st = serve.get("static")
    if st:
        lines += ["", f"Endpoint with a head on the static backbone (`router-lite serve`, {st.get('workers', 1)} "
                      "process, cold prompts; p50/p99 = server-side router overhead, goal 16 clients p50 <= 20 ms, "
                      "64 clients p50 <= 60 ms):", "",
                  "| clients | overhead p50 | overhead p99 | end-to-end p50 | req/s | server CPU/req |",
                  "|---|---|---|---|---|---|"]
        for c, r in st["clients"].items():
            lines.append(f"| {c} | {r['p50_ms']:.1f} ms | {r['p99_ms']:.1f} ms | {r['e2e_p50_ms']:.1f} ms | "
                         f"{r['req_per_s']:.0f} | {r['server_cpu_ms_per_req']:.1f} ms |")
    wk = serve.get("workers")
    if wk:
        limit = serve.get("backbone_batch_prompts_per_s")
        lines += ["", f"Default backbone, cold prompts, {serve.get('workers_clients', 16)} clients: one process with "
                      "the batcher vs N worker processes behind one port (mean of alternating rounds); the backbone's "
                      f"batch throughput in the same run: {_f(limit, '.1f')} prompts/s:", "",
                  "| processes | req/s | x batch throughput | overhead p50 | overhead p99 | e2e p99 | server CPU/req |",
                  "|---|---|---|---|---|---|---|"]
        for w, r in wk.items():
            lines.append(f"| {w} | {r['req_per_s']:.1f} | {_f(r['req_per_s'] / limit if limit else None, '.2f')} | "
                         f"{r['overhead_p50_ms']:.0f} ms | {r['overhead_p99_ms']:.0f} ms | {r['e2e_p99_ms']:.0f} ms | "
                         f"{r['server_cpu_ms_per_req']:.1f} ms |")
    return lines


def build(home: Path, static_home: Path) -> str:
    embed, serve = _read(home / "bench" / "embed.json"), _read(home / "bench" / "serve.json")
    values = {}
    for name, h in (("MiniLM (default)", home), ("static", static_home)):
        v = _read(h / "reports" / "router_value.json")
        if v:
            values[name] = v
    lines = []
    if embed:
        lines += embed_table(embed)
    lines += value_table(values)
    if serve:
        lines += serve_table(serve)
    if not lines:
        raise SystemExit(f"no bench JSON under {home / 'bench'}: run `make bench` first")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", default=os.environ.get("ROUTER_LITE_HOME", str(ROOT / ".router-lite")))
    ap.add_argument("--static-home", default=None)
    ap.add_argument("--write", action="store_true", help=f"replace the generated block in {DOC.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    home = Path(args.home)
    text = build(home, Path(args.static_home) if args.static_home else home / "static-home")
    if not args.write:
        print(text)
        return 0
    doc = DOC.read_text(encoding="utf-8")
    if START not in doc or END not in doc:
        print(f"{DOC}: markers {START!r} / {END!r} missing", file=sys.stderr)
        return 1
    head, rest = doc.split(START, 1)
    DOC.write_text(head + START + "\n" + text + END + rest.split(END, 1)[1], encoding="utf-8")
    print(f"wrote the tables into {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
