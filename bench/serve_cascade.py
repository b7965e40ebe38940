"""Serving a cascade: a stage's calls go out in parallel. The registered demo cascade (`router-lite run` first) is
served in process in front of a fake upstream of fixed, known latencies per agent that answers with the real
recorded replies (so the agreement decisions are the real ones); one client sends held-out demo prompts with their
answer format. Prints, and writes into $ROUTER_LITE_HOME/bench/serve.json under `cascade`:
- `stage_wall_over_slowest`: each stage's wall (X-Router-Stage-Ms) over the slowest fixed latency among the calls
  it made (p50 and max over stages);
- `overhead_p50_ms`: the router's own time before the first call (X-Router-Overhead-Ms), new prompts and repeated.

    ROUTER_LITE_HOME=.router-lite python bench/serve_cascade.py [--n 40] [--target quality>=0.98]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cli import lineage  # noqa: E402
from pipeline.embed.backbone import Backbone  # noqa: E402
from pipeline.route import registry  # noqa: E402
from pipeline.serve.app import build_app  # noqa: E402
from pipeline.serve.server import serve_in_thread  # noqa: E402
from pipeline.serve.settings import ServeSettings  # noqa: E402
from resources.pool import PoolResource  # noqa: E402

LATENCY_S = {"frontier_a": 0.40, "frontier_b": 0.35, "frontier_c": 0.25, "open_mid": 0.10,
             "open_cheap_reasoning": 0.15}


class FixedLatencyClient:
    """An upstream that answers after a fixed latency with the agent's recorded reply to the prompt."""

    api_key = None

    def __init__(self, model: str, latency_s: float, store):
        self.model, self.latency_s, self.store = model, latency_s, store

    async def post(self, path, body=None, cast_to=None, options=None, stream=False):
        await asyncio.sleep(self.latency_s)
        prompt = body["messages"][-1]["content"]
        text = self.store.text_for(self.model, prompt) or ""
        return httpx.Response(200, json={
            "id": "fixed", "object": "chat.completion", "created": 0, "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(text) // 4}})

    async def close(self):
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--target", default="quality>=0.98")
    a = ap.parse_args(argv)
    home = Path(os.environ.get("ROUTER_LITE_HOME", ROOT / ".router-lite"))
    entry = sorted((home / "registry").glob("cascade-*"), key=lambda p: p.stat().st_mtime)[-1]
    reg = registry.load(entry)
    pool = PoolResource(kind="replay", pool="demo")
    agents, store = pool.agents(), pool.store()
    lat = {a.name: LATENCY_S.get(a.name, 0.2) for a in agents}
    tasks = lineage.load("task_pool", home=str(home))
    test = tasks[(tasks["split"] == "test") & ~tasks["ood"]].groupby("grader").head(a.n // 2)
    bb = Backbone(reg.manifest["backbone"]["id"], max_seq_length=int(reg.manifest["backbone"]["max_seq_length"]))
    app = build_app(reg, bb, agents, lambda s: FixedLatencyClient(s.model, lat[s.name], store), ServeSettings())
    names = [x["name"] for x in reg.agents]
    ratios, cold, warm, calls = [], [], [], []
    with serve_in_thread(app) as srv, httpx.Client(base_url=srv.base_url, timeout=120) as c:
        for sink in (cold, warm):  # new prompts, then the same prompts again (cached decisions)
            for t in test.itertuples():
                r = c.post("/chat/completions", json={"messages": [{"role": "user", "content": t.prompt}],
                                                      "router_grader": t.grader, "router_target": a.target})
                r.raise_for_status()
                sink.append(float(r.headers["x-router-overhead-ms"]))
                if sink is warm:
                    continue
                called = r.headers["x-router-agents-called"].split(",")
                calls.append(len(called))
                stage_ms = [float(x) for x in r.headers["x-router-stage-ms"].split(",")]
                view = reg.cascade_at(a.target, t.grader)
                stages = [s.agents for s in view.policy.stages]
                seen: set[str] = set()
                for k, wall in enumerate(stage_ms):  # the calls each stage made, in the order of the header
                    if len(stage_ms) == 1 and len(called) == 1:
                        new = called
                    else:
                        new = [names[j] for j in stages[k] if names[j] not in seen]
                    seen.update(new)
                    ratios.append(wall / (1000 * max(lat[x] for x in new)))
    out = {"stage_wall_over_slowest": {"p50": float(np.median(ratios)), "max": float(np.max(ratios)),
                                       "stages": len(ratios)},
           "overhead_p50_ms": float(np.median(cold)), "overhead_p50_ms_repeated": float(np.median(warm)),
           "calls_per_request": float(np.mean(calls)), "requests": len(cold), "target": a.target,
           "latencies_s": lat}
    print(json.dumps(out, indent=1))
    f = home / "bench" / "serve.json"
    f.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(f.read_text()) if f.exists() else {}
    doc["cascade"] = out
    f.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
