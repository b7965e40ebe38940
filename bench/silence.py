"""Benchmark: the longest silences of a `router-lite` command's console, and, for `run`, its stage times.

    .venv/bin/python bench/silence.py [--fresh DIR] [--top 8] -- run            # the whole lineage
    .venv/bin/python bench/silence.py -- train --rewards R --tasks T --backbone static

Runs the command as a user does (this checkout's CLI, stderr and stdout together), stamps every line with its
arrival time, and prints the longest gaps between two lines with the lines around them, then `reports/stage_times.json`
(the lineage's own step statistics) when the command wrote one. `--fresh DIR`: a new ROUTER_LITE_HOME and
DAGSTER_HOME under DIR (from scratch: every call replayed, every prompt embedded); default: the environment's.
The promise it checks (docs/operations.md): no gap over 10 s. Quote the load (`uptime`, printed before and after).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def stamped(cmd: list[str], env: dict) -> list[tuple[float, str]]:
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t0, lines = time.monotonic(), [(0.0, "(start)")]
    for line in proc.stdout:
        lines.append((time.monotonic() - t0, line.rstrip()))
    lines.append((time.monotonic() - t0, f"(exit {proc.wait()})"))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fresh", type=Path, help="run on a new home and Dagster instance under this folder")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("args", nargs="+", help="the router-lite command and its options, after --")
    a = ap.parse_args()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    if a.fresh:
        env["ROUTER_LITE_HOME"], env["DAGSTER_HOME"] = str(a.fresh / "home"), str(a.fresh / "dagster")
        Path(env["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
        (Path(env["DAGSTER_HOME"]) / "dagster.yaml").write_text(  # the repository's logging, no telemetry banner
            "telemetry:\n  enabled: false\npython_logs:\n  managed_python_loggers: [pipeline]\n"
            "  python_log_level: INFO\n")
    print("load before:", os.getloadavg())
    lines = stamped([str(REPO / ".venv/bin/router-lite"), *a.args], env)
    print("load after: ", os.getloadavg())
    gaps = sorted(((b[0] - p[0], p, b) for p, b in zip(lines, lines[1:]) if b[1].strip()), reverse=True)
    print(f"{len(lines) - 2} lines in {lines[-1][0]:.1f} s; longest silences:")
    for gap, p, b in gaps[:a.top]:
        print(f"  {gap:6.1f} s after {p[0]:7.1f} s: {p[1][-110:]}\n{'':>28}then: {b[1][-110:]}")
    times = Path(env.get("ROUTER_LITE_HOME", REPO / ".router-lite")) / "reports" / "stage_times.json"
    if a.args[0] == "run" and times.is_file():
        t = json.loads(times.read_text())
        print(f"stages (s, total {t['total_s']}):", ", ".join(f"{k} {v}" for k, v in t["stages"].items()))
    sys.exit(0 if lines[-1][1] == "(exit 0)" else 1)


if __name__ == "__main__":
    main()
