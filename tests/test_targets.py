"""Operating points (pipeline/route/targets.py), the held-out value (pipeline/route/value.py)
and targets through the registry."""
from __future__ import annotations

import numpy as np
import pytest
from _support import two_cluster_head

from pipeline.core.errors import RouterLiteError
from pipeline.route import registry
from pipeline.route.ood import OODGuard
from pipeline.route.targets import (
    PathRows,
    Target,
    cost_aware_pick,
    operating_path,
    parse_target,
    request_target,
    resolve,
)
from pipeline.route.value import routellm_metrics


@pytest.mark.parametrize("text, want", [
    (None, Target("max-quality", None)), ("", Target("max-quality", None)),
    ("max-quality", Target("max-quality", None)),
    (" Parity ", Target("parity", None)), ("quality>=0.98", Target("quality", 0.98)),
    ("quality >= 1", Target("quality", 1.0)), ("budget=0.5", Target("budget", 0.5)),
    ("lambda=0", Target("lambda", 0.0)),
])
def test_parse_target(text, want):
    assert parse_target(text) == want
    assert parse_target(want.name) == want


@pytest.mark.parametrize("text, msg", [
    ("cheapest", "unknown target"), ("quality>=1.5", "(0, 1]"), ("quality>=0", "(0, 1]"),
    ("quality>=abc", "not a number"), ("budget=0", "> 0"), ("budget=-1", "> 0"), ("budget=nan", "finite"),
    ("lambda=-2", ">= 0"), ("budget=", "not a number"),
])
def test_bad_targets_name_the_input(text, msg):
    with pytest.raises(RouterLiteError, match="target|lambda") as e:
        parse_target(text)
    assert msg in str(e.value)


def test_request_target_body_header_default():
    assert request_target({}, {"messages": []}, None) is None
    assert request_target({}, {"messages": []}, "parity") == "parity"
    assert request_target({"X-Router-Target": "budget=1"}, {}, "parity") == "budget=1"
    assert request_target({"X-Router-Target": "parity"}, {"router_target": "quality>=0.9"}) == "quality>=0.9"
    with pytest.raises(RouterLiteError, match="must be a string"):
        request_target({}, {"router_target": 3})
    with pytest.raises(RouterLiteError, match="unknown target"):
        request_target({"X-Router-Target": "nope"}, {})


def test_cost_aware_pick_trades_quality_for_cost():
    pred = np.array([[0.9, 0.8], [0.9, 0.2]])
    cost = np.array([1.0, 0.1])
    assert cost_aware_pick(pred, cost, 0.0).tolist() == [0, 0]
    assert cost_aware_pick(pred, cost, 0.2).tolist() == [1, 0]    # 0.1 quality < 0.18 saved; 0.7 > 0.18
    assert cost_aware_pick(pred, cost, 10.0).tolist() == [1, 1]
    assert cost_aware_pick(np.array([[0.5, 0.5]]), cost, 0.0).tolist() == [1]  # ties -> the cheaper agent


def _path():
    # 400 rows; agent 0 (expensive) right on all rows, agent 1 (cheap) right on the "easy" half
    n = 400
    easy = np.arange(n) % 2 == 0
    R = np.column_stack([np.ones(n), easy.astype(float)])
    C = np.tile([0.01, 0.001], (n, 1))
    pred = np.column_stack([np.full(n, 0.95), np.where(easy, 0.94, 0.1)])
    return operating_path(PathRows(pred, np.zeros(n, np.int64), R, C), C.mean(axis=0), 0, ["big", "small"]), R, C


def test_path_and_named_targets():
    path, _R, _C = _path()
    pts = path["points"]
    assert pts[0]["lambda"] == 0 and pts[0]["quality"] == 1.0 and pts[0]["cost_per_1k"] == pytest.approx(10.0)
    assert [p["lambda"] for p in pts] == sorted(p["lambda"] for p in pts)
    assert resolve("max-quality", path)["lambda"] == 0
    par = resolve("parity", path)                       # easy rows to the cheap agent: same quality, 55 % cost
    assert par["quality"] == 1.0 and par["cost_per_1k"] == pytest.approx(5.5)
    assert par["shares"] == {"big": 0.5, "small": 0.5}
    q = resolve("quality>=0.5", path)                   # everything to the cheap agent: 50 % of the quality
    assert q["quality"] == 0.5 and q["cost_per_1k"] == pytest.approx(1.0)
    assert resolve("budget=6", path)["cost_per_1k"] == pytest.approx(5.5)
    assert resolve("budget=100", path)["quality"] == 1.0
    low = resolve("budget=0.1", path)
    assert low["over_budget"] and low["cost_per_1k"] == pytest.approx(1.0)


def test_routellm_metrics_perfect_and_random_predictor():
    n = 1000
    rng = np.random.default_rng(0)
    strong_wins = rng.random(n) < 0.3
    R = np.column_stack([np.ones(n), (~strong_wins).astype(float)])      # strong 1.0, weak 0.7
    perfect = routellm_metrics(np.column_stack([strong_wins.astype(float), np.zeros(n)]), R, 0, 1)
    assert perfect["cpt50"] == pytest.approx(0.15, abs=0.011) and perfect["cpt80"] == pytest.approx(0.24, abs=0.011)
    assert perfect["apgr"] > 0.8
    rand = routellm_metrics(rng.random((n, 2)), R, 0, 1)
    assert 0.4 < rand["apgr"] < 0.6 and rand["cpt50"] > 0.35
    assert routellm_metrics(rng.random((n, 2)), R, 1, 0)["apgr"] is None   # "strong" worse than weak


def _matrix_world(tmp_path):
    """Two clusters of queries (`two_cluster_head`): max-quality must pick the expensive agent on A (it is best
    single), and a cost target must send cluster B to the cheap agent."""
    fit, path, X, cluster = two_cluster_head(tmp_path, 600)
    return fit, registry.load(path), X, cluster


def test_the_chosen_agent_changes_with_the_target(tmp_path):
    fit, reg, X, cluster = _matrix_world(tmp_path)
    b = np.flatnonzero(~cluster)[:20]
    a = np.flatnonzero(cluster)[:20]
    picks0, _ = reg.route(X[b])
    assert (picks0 == 0).all()                           # max-quality: the best single agent
    picks, _ = reg.route(X[b], "parity")
    assert (picks == 1).mean() > 0.9                     # same quality for 1/20 of the cost on cluster B
    assert (reg.route(X[a], "parity")[0] == 0).mean() > 0.9   # ... but not where the cheap agent is wrong
    picks, fired = reg.route(X, "budget=0.5")            # below every mix: the cheapest point
    assert (picks[~fired] == 1).all() and (picks[fired] == 0).all()   # the OOD guard still sends to best single
    assert reg.resolve_target("parity")["lambda"] > 0
    v = fit.value
    assert v["targets"]["parity"]["quality"] == pytest.approx(1.0)
    assert v["targets"]["parity"]["cost_ratio"] < 0.6
    assert v["label_router"]["quality"] == pytest.approx(1.0)
    with pytest.raises(RouterLiteError, match="unknown target"):
        reg.route(X[:2], "cheapest")


def test_head_without_operating_points_serves_only_max_quality(tmp_path):
    from pipeline.route.head import Head

    head = Head(np.zeros((4, 2), np.float32), np.array([1.0, 0.0], np.float32), agents=["a", "b"])
    guard = OODGuard().fit(np.random.default_rng(0).normal(size=(30, 4)), np.random.default_rng(1).normal(size=(10, 4)))
    p = registry.register(tmp_path, head, registry.PromptFit(guard, 0), backbone={"id": "x", "key": "x", "dim": 4},
                          agents=[{"name": "a", "model": "a"}, {"name": "b", "model": "b"}], training={},
                          data_hashes={}, metrics={})
    reg = registry.load(p)
    assert reg.route(np.zeros((1, 4), np.float32), "max-quality")[0].tolist() == [0]
    with pytest.raises(RouterLiteError, match="no operating points"):
        reg.route(np.zeros((1, 4), np.float32), "parity")


class _Backbone:
    """Embeds a prompt as the synthetic row named in it ("row 12" -> X[12])."""

    def __init__(self, X):
        self.X, self.dim, self.key, self.model_id, self.device = X, X.shape[1], "synthetic", "synthetic", "cpu"

    def encode(self, texts):
        return np.stack([self.X[int(t.split()[-1])] for t in texts])


@pytest.mark.slow
def test_serve_honours_the_target_per_request(tmp_path):
    import httpx
    import openai

    from pipeline.collect.agents import AgentSpec
    from pipeline.serve.app import build_app
    from pipeline.serve.server import serve_in_thread
    from pipeline.serve.settings import ServeSettings

    _fit, reg, X, cluster = _matrix_world(tmp_path)
    fired = reg.guard.fires(X)
    row = int(np.flatnonzero(~cluster & ~fired)[0])          # a cluster-B query: both agents right
    specs = [AgentSpec("expensive", "big-model", "test", None, 10.0, 30.0),
             AgentSpec("cheap", "small-model", "test", None, 0.1, 0.3)]

    def client_for(agent):
        def reply(request):
            return httpx.Response(200, json={"id": "x", "object": "chat.completion", "model": agent.model,
                                             "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                                 "role": "assistant", "content": f"from {agent.model}"}}]})
        return openai.AsyncOpenAI(api_key="k", base_url="http://agents.test/v1", max_retries=0,
                                  http_client=httpx.AsyncClient(transport=httpx.MockTransport(reply)))

    app = build_app(reg, _Backbone(X), specs, client_for, ServeSettings())
    msg = [{"role": "user", "content": f"row {row}"}]
    with serve_in_thread(app) as srv, httpx.Client(base_url=srv.base_url, timeout=30) as c:
        r = c.post("/chat/completions", json={"messages": msg})
        assert r.status_code == 200 and r.headers["x-router-agent"] == "expensive"
        assert r.headers["x-router-target"] == "max-quality" and r.json()["router"]["lambda"] == 0
        r = c.post("/chat/completions", json={"messages": msg}, headers={"X-Router-Target": "parity"})
        assert r.headers["x-router-agent"] == "cheap" and r.json()["choices"][0]["message"]["content"] == \
            "from small-model"
        assert r.json()["router"]["target"] == "parity" and r.json()["router"]["lambda"] > 0
        r = c.post("/chat/completions", json={"messages": msg, "router_target": "max-quality"},
                   headers={"X-Router-Target": "parity"})            # the body field wins
        assert r.headers["x-router-agent"] == "expensive"
        r = c.post("/chat/completions", json={"messages": msg, "router_target": "cheapest"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_target"
        assert "cheapest" in r.json()["error"]["message"]
    app2 = build_app(reg, _Backbone(X), specs, client_for, ServeSettings(default_target="parity"))
    with serve_in_thread(app2) as srv, httpx.Client(base_url=srv.base_url, timeout=30) as c:
        r = c.post("/chat/completions", json={"messages": msg})
        assert r.headers["x-router-agent"] == "cheap" and r.headers["x-router-target"] == "parity"
