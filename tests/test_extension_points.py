"""The "How to add ..." recipes of docs/architecture.md, followed through the public registries.

Each test adds a toy extension (a grader, a router type, a staged router kind, an agent pool kind, a task source)
inside the table's `*_restored()` context, uses it where the real ones are used, and leaves the table as it found it.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import httpx
import numpy as np
import openai
import pandas as pd
import pytest

from pipeline.collect.agents import AgentSpec
from pipeline.collect.grading import GRADER_SPECS, GraderSpec, grade, graders_restored, register_grader
from pipeline.core.errors import RouterLiteError
from pipeline.profile import AgentPoolSettings, Profile, from_yaml
from pipeline.report.frontier import baseline_policies, policy_table, router_policies
from pipeline.route import registry
from pipeline.route.kinds import router_class, routers_restored
from pipeline.route.knn import KnnRouter
from pipeline.route.ood import OODGuard
from pipeline.route.routers import ROUTER_TYPES, register_router
from pipeline.serve.app import build_app
from pipeline.serve.server import serve_in_thread
from pipeline.serve.settings import ServeSettings
from pipeline.tasks.sources import (
    SOURCES,
    TASK_COLUMNS,
    SourceSpec,
    TaskRow,
    load_source,
    register_source,
    sources_restored,
)
from resources.pool import POOL_KINDS, PoolResource, pool_kinds_restored, register_pool_kind

AGENTS = ["a", "b", "c"]


# ------------------------------------------------------------------------------------------------ a grader
def exact_ci_spec() -> GraderSpec:
    """Case-insensitive exact match of the stated answer (the recipe's toy grader)."""
    return GraderSpec("exact_ci", parse=lambda c: c.strip().rstrip(".").strip() or None,
                      equal=lambda pred, gold: pred.casefold() == gold.strip().casefold(),
                      description="case-insensitive exact match",
                      fallback=lambda text: text.strip().splitlines()[-1].strip() or None)


def test_a_registered_grader_grades_and_is_gone_afterwards():
    before = dict(GRADER_SPECS)
    with graders_restored():
        register_grader(exact_ci_spec())
        assert grade("Let me think. The answer is: PARIS.", "paris", "exact_ci") == ("PARIS", True)
        assert grade('{"answer": "Lyon"}', "Paris", "exact_ci") == ("Lyon", False)
        assert grade("no label here\nparis", "Paris", "exact_ci") == ("paris", True)  # the fallback: last line
        assert grade("", "Paris", "exact_ci") == (None, False)
        with pytest.raises(RouterLiteError, match="already registered"):
            register_grader(exact_ci_spec())
        # the collection checks see it too: a task naming it is accepted
        from pipeline.collect.calls import _check_tasks
        _check_tasks(pd.DataFrame({"task_id": ["t/1"], "prompt": ["Capital of France?"], "gold": ["Paris"],
                                   "grader": ["exact_ci"]}))
    assert GRADER_SPECS == before
    with pytest.raises(RouterLiteError,
                       match=r"unknown grader 'exact_ci'; known graders: integer, judge, math_expression, mcq_letter"):
        grade("Paris", "Paris", "exact_ci")


# ------------------------------------------------------------------------------------------------ a router type
class BestMeanRouter:
    """Always the agent with the best mean training reward (the recipe's toy router type)."""

    def __init__(self, means, d: int, agents: list[str] | None = None):
        self.means, self._d, self.agents = np.asarray(means, np.float64), int(d), agents

    @classmethod
    def fit(cls, X, R, agents=None) -> BestMeanRouter:
        return cls(np.asarray(R, np.float64).mean(axis=0), np.asarray(X).shape[1], agents)

    @property
    def d(self) -> int:
        return self._d

    @property
    def K(self) -> int:
        return len(self.means)

    def scores(self, X):
        return np.tile(self.means, (len(X), 1))

    def pick(self, X):
        return self.scores(X).argmax(axis=1)

    def save_files(self, directory) -> dict:
        (Path(directory) / "best_mean.json").write_text(json.dumps({"means": self.means.tolist(), "d": self._d}))
        return {"files": {"weights": "best_mean.json"}}

    @classmethod
    def from_files(cls, directory, manifest) -> BestMeanRouter:
        data = json.loads((Path(directory) / manifest["files"]["weights"]).read_text())
        return cls(data["means"], data["d"], [a["name"] for a in manifest["agents"]])

    def fingerprint(self):
        return [self.means.tobytes()], [self._d]


def _data(n=120, d=8, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    R = (rng.random((n, len(AGENTS))) < [0.3, 0.7, 0.5]).astype(np.float32)  # agent b is best on average
    C = np.tile([0.001, 0.01, 0.003], (n, 1))
    return X, R, C


def _register(root, router, X):
    guard = OODGuard(k=5).fit(X[:80], X[80:100])
    return registry.register(root, router, registry.PromptFit(guard, 1),
                             backbone={"id": "toy/hash-embedder", "dim": X.shape[1]},
                             agents=[{"name": n, "model": f"m-{n}"} for n in AGENTS], training={"toy": True},
                             data_hashes={"rewards": "toy"}, metrics={})


def test_router_types_are_looked_up_by_name():
    assert router_class("head").__name__ == "Head" and router_class("knn") is KnnRouter
    with pytest.raises(RouterLiteError,
                       match=r"unknown router kind 'forest'; known router kinds: cascade, cluster, head, knn"):
        router_class("forest")


def test_a_registered_router_type_in_the_frontier_and_the_registry(tmp_path):
    X, R, C = _data()
    before = dict(ROUTER_TYPES)
    with routers_restored():
        register_router("best-mean")(BestMeanRouter)
        toy = BestMeanRouter.fit(X[:100], R[:100], AGENTS)
        knn = KnnRouter(k=10, agents=AGENTS).fit(X[:100], R[:100])
        # the frontier: any router is a score policy
        policies = baseline_policies(R[100:], C[100:], R[:100], AGENTS)
        policies.update(router_policies({"best mean": toy, "kNN": knn}, X[100:]))
        table = policy_table(policies, R[100:], C[100:]).set_index("policy")
        assert table.loc["best mean", "quality"] == pytest.approx(R[100:, 1].mean())  # always agent b
        assert table.loc["best mean", "cost_per_example"] == pytest.approx(0.01)
        # the registry: saved, named by kind, loaded back through the table, routed with the guard
        path = _register(tmp_path, toy, X)
        assert path.name.startswith("best-mean-hash-embedder-") and _register(tmp_path, toy, X) == path
        reg = registry.load(path)
        assert reg.kind == "best-mean" and isinstance(reg.router, BestMeanRouter)
        assert not (path / "reference.py").exists()  # the reference code applies head weights only
        picks, fired = reg.route(X)
        assert (picks[~fired] == 1).all() and (picks[fired] == 1).all()
        # kNN registers and loads the same way, with identical picks
        kpath = _register(tmp_path, knn, X)
        kreg = registry.load(kpath)
        assert kreg.kind == "knn" and kpath.name.startswith("knn-")
        assert np.array_equal(kreg.router.scores(X), knn.scores(X))
    assert ROUTER_TYPES == before
    with pytest.raises(RouterLiteError,
                       match=r"unknown router kind 'best-mean'; known router kinds: cascade, cluster, head, knn"):
        registry.load(path)  # the type is gone: one clear error naming the manifest and the known kinds


def test_an_unregistered_class_is_refused_and_old_manifests_load_as_heads(tmp_path):
    X, R, _ = _data()
    with pytest.raises(RouterLiteError, match="not a registered router type"):
        _register(tmp_path, BestMeanRouter.fit(X, R, AGENTS), X)
    from pipeline.route.head import Head

    rng = np.random.default_rng(1)
    path = _register(tmp_path, Head(rng.normal(size=(8, 3)), rng.normal(size=3), agents=AGENTS), X)
    m = json.loads((path / "manifest.json").read_text())
    assert m["router_kind"] == "head"
    del m["router_kind"]  # a manifest written before router kinds
    (path / "manifest.json").write_text(json.dumps(m))
    assert registry.load(path).kind == "head" and isinstance(registry.load(path).router, Head)


class HashBackbone:
    """A stand-in embedder for the toy router (it ignores the embedding anyway): 8 dims from a SHA-256."""

    dim, key, model_id = 8, "toy/hash-embedder", "toy/hash-embedder"

    def encode(self, texts):
        X = np.array([np.frombuffer(hashlib.sha256(t.encode()).digest()[:8], np.uint8) for t in texts], np.float32)
        return X / np.linalg.norm(X, axis=1, keepdims=True)


def _echo_client(agent: AgentSpec) -> openai.AsyncOpenAI:
    """An OpenAI client whose endpoint answers with the model it was asked for (no network)."""
    def answer(request: httpx.Request) -> httpx.Response:
        model = json.loads(request.content)["model"]
        return httpx.Response(200, json={"id": "x", "object": "chat.completion", "created": 0, "model": model,
                                         "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                             "role": "assistant", "content": f"reply from {model}"}}]})

    http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    return openai.AsyncOpenAI(api_key="none", base_url="http://toy.invalid/v1", http_client=http, max_retries=0)


@pytest.mark.slow
def test_the_server_routes_a_registered_toy_router(tmp_path):
    X, R, _ = _data()
    with routers_restored():
        register_router("best-mean")(BestMeanRouter)
        reg = registry.load(_register(tmp_path, BestMeanRouter.fit(X[:100], R[:100], AGENTS), X))
        agents = [AgentSpec(n, f"m-{n}", "toy", None, 0.0, 0.0) for n in AGENTS]
        with serve_in_thread(build_app(reg, HashBackbone(), agents, _echo_client, ServeSettings())) as srv:
            r = httpx.post(f"{srv.base_url}/chat/completions",
                           json={"messages": [{"role": "user", "content": "What is 2 + 2?"}]}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert r.headers["X-Router-Agent"] == "b" and body["router"]["agent"] == "b"
    assert body["choices"][0]["message"]["content"] == "reply from m-b" and body["model"] == "m-b"


# ------------------------------------------------------------------------------------------------ a staged kind
def _staged_kind():
    """A staged router kind (the recipe's "a staged kind"): the cascade's files and stages under another name, so
    that only its capabilities (`needs_answers`, `needs_grader`, `view`) can make it staged, never its kind's name."""
    from pipeline.route.cascade import CascadeRouter

    class TwoStep(CascadeRouter):
        pass

    return register_router("two-step")(TwoStep)


def _register_staged(tmp_path, cls, X):
    from pipeline.route.cascade import Plan, Policy, Stage
    from pipeline.route.cascade_fit import Rows, cascade_path
    from pipeline.route.head import Head

    rng = np.random.default_rng(0)
    n = 200
    R = (rng.random((n, 3)) < [0.6, 0.9, 0.5]).astype(float)
    C = np.tile([0.02, 1.0, 0.03], (n, 1))
    E = np.zeros((n, 3, 3), dtype=bool)
    E[:, [0, 1, 2], [0, 1, 2]] = True
    E[:, 0, 2] = E[:, 2, 0] = R[:, 0] == R[:, 2]
    plans = [Plan(Policy((Stage((1,)),))), Plan(Policy((Stage((0, 2), 2), Stage((1,)))))]
    path = cascade_path(plans, Rows(R, C, E, None, np.array(["integer"] * n, dtype=object)), np.array([1, 0, 2]), 1,
                        AGENTS)
    head = Head(np.zeros((8, 3), np.float32), np.array([0, 1, 0], np.float32), agents=AGENTS)
    return registry.register(tmp_path, cls(head, path, [1, 0, 2], AGENTS), registry.PromptFit(OODGuard().fit(X, X), 1),
                             backbone={"id": "toy/hash-embedder", "key": "toy/hash-embedder", "dim": 8},
                             agents=[{"name": a, "model": f"m-{a}"} for a in AGENTS], training={}, data_hashes={},
                             metrics={})


def test_a_staged_router_kind_is_known_by_its_capabilities(tmp_path):
    from types import SimpleNamespace

    from pipeline.route.routers import capability
    from pipeline.serve.app import _request_grader

    X, _, _ = _data()
    before = dict(ROUTER_TYPES)
    with routers_restored():
        cls = _staged_kind()
        assert capability(cls, "needs_answers") and capability(cls, "needs_grader")
        path = _register_staged(tmp_path, cls, X)
        reg = registry.load(path)
        assert reg.kind == "two-step" and type(reg.router) is cls and reg.needs_grader
        assert (path / "reference.py").exists()  # it declares reference_code (the cascade's plans)
        view = reg.cascade_at("max-quality", "integer")  # the registry asks the kind for its view
        picks, fired = view.route(X)
        assert view.grader == "integer" and picks.shape == (len(X),) and set(picks[~fired]) <= {-1, 1}
        state = SimpleNamespace(registered=reg, settings=ServeSettings())
        assert _request_grader(state, {}, {"router_grader": "integer"}) == "integer"  # the server: stages
    assert ROUTER_TYPES == before


@pytest.mark.slow
def test_the_server_runs_the_stages_of_a_registered_staged_kind(tmp_path):
    X, _, _ = _data()
    with routers_restored():
        reg = registry.load(_register_staged(tmp_path, _staged_kind(), X))
        agents = [AgentSpec(n, f"m-{n}", "toy", None, 0.0, 0.0) for n in AGENTS]
        with serve_in_thread(build_app(reg, HashBackbone(), agents, _echo_client, ServeSettings())) as srv:
            r = httpx.post(f"{srv.base_url}/chat/completions", timeout=30,
                           json={"messages": [{"role": "user", "content": "What is 2 + 2?"}],
                                 "router_grader": "integer"})
    assert r.status_code == 200, r.text
    assert r.headers["X-Router-Grader"] == "integer" and r.json()["router"]["grader"] == "integer"
    assert r.headers["X-Router-Agents-Called"].split(",")[-1] == r.headers["X-Router-Agent"]


# ------------------------------------------------------------------------------------------------ a pool kind
def test_a_registered_pool_kind_makes_the_clients():
    before = dict(POOL_KINDS)
    with pool_kinds_restored():
        checked = []
        register_pool_kind("echo", lambda res, agent: _echo_client(agent),
                           check=lambda res, agents: checked.append(res.pool), description="answers its model name")
        res = PoolResource(kind="echo", pool="demo")
        res.check()
        agent = res.agents()[0]
        client = res.client_for(agent)

        async def ask():
            try:
                out = await client.chat.completions.create(model=agent.model, messages=[{"role": "user",
                                                                                          "content": "hi"}])
                return out.choices[0].message.content
            finally:
                await client.close()

        assert asyncio.run(ask()) == f"reply from {agent.model}"
        assert checked == ["demo", "demo"]  # check() and client_for() both ran the kind's check
        # a profile may now name the kind (typed config checks pool.kind against the live list)
        assert from_yaml(AgentPoolSettings, {"kind": "echo", "name": "demo"}, "pool").kind == "echo"
        with pytest.raises(RouterLiteError, match="already registered"):
            register_pool_kind("echo", lambda res, agent: None)
    assert POOL_KINDS == before
    with pytest.raises(RouterLiteError, match=r"pool.kind: str 'echo' is not one of replay, openrouter"):
        from_yaml(AgentPoolSettings, {"kind": "echo"}, "pool")
    with pytest.raises(RouterLiteError,
                       match=r"unknown pool kind 'echo'; known pool kinds: openai_compatible, openrouter, replay"):
        PoolResource(kind="echo").check()


# ------------------------------------------------------------------------------------------------ a task source
def norm_capitals(rows, where: str) -> list[dict]:
    return [TaskRow("capitals", "test", i, f"What is the capital of {r['country']}?", r["capital"], "exact_ci",
                  "knowledge", "easy", i).row() for i, r in enumerate(rows)]


def test_a_registered_task_source_loads_and_its_tasks_grade(tmp_path):
    f = tmp_path / "capitals.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [{"country": "France", "capital": "Paris"},
                                                    {"country": "Japan", "capital": "Tokyo"}]) + "\n")
    before = dict(SOURCES)
    with sources_restored(), graders_restored():
        register_grader(exact_ci_spec())
        register_source(SourceSpec("capitals", "knowledge", norm_capitals, bundled=None))
        tasks = load_source("capitals", path=str(f))
        assert list(tasks.columns) == list(TASK_COLUMNS) and len(tasks) == 2
        assert tasks["task_id"].tolist() == ["capitals/test/000000", "capitals/test/000001"]
        assert [grade(f"The answer is {g.upper()}", g, gr)[1] for g, gr in zip(tasks["gold"], tasks["grader"])] == \
            [True, True]
        with pytest.raises(RouterLiteError, match="has no bundled copy"):
            load_source("capitals")
        # a profile may now list the source (typed config reads the live source table)
        prof = from_yaml(Profile, {"sources": {"capitals": {"path": str(f)}}})
        assert prof.sources["capitals"].path == str(f)
    assert SOURCES == before
    with pytest.raises(RouterLiteError, match="unknown source 'capitals'"):
        load_source("capitals", path=str(f))


# ------------------------------------------------------------------------------------------------ the table itself
def test_one_table_class_serves_the_four_registries():
    from pipeline.core.tables import Table
    from resources.pool import POOL_KINDS as pool_kinds

    assert all(isinstance(t, Table) for t in (GRADER_SPECS, SOURCES, ROUTER_TYPES, pool_kinds))
    loads = []

    def builtins():  # as pipeline/route/routers.py: built-in entries that register themselves on import
        loads.append(1)
        widgets.register("b", "built-in b")

    widgets = Table("widget", {"a": "A"}, builtins=builtins)
    assert not loads and list(widgets) == ["a", "b"] and loads == [1]  # loaded once, before the first read
    assert widgets["b"] == "built-in b" and widgets.lookup("a") == "A" and "c" not in widgets and loads == [1]
    with pytest.raises(RouterLiteError, match=r"^unknown widget 'c'; known widgets: a, b$"):
        widgets.lookup("c")
    with pytest.raises(RouterLiteError, match=r"^unknown widget \['a'\]; known widgets: a, b$"):
        widgets.lookup(["a"])
    for bad in ("", " a", "x/y", None):
        with pytest.raises(RouterLiteError, match="a widget name must be a non-empty string without '/'"):
            widgets.register(bad, "X")
    with pytest.raises(RouterLiteError, match=r"^widget 'a' is already registered \(replace=True to change it\)$"):
        widgets.register("a", "other A")
    assert widgets.register("a", "A") == "A"  # the same entry again: nothing changes
    with widgets.restored():
        widgets.register("a", "new A", replace=True)
        widgets.register("c", "C")
        assert dict(widgets) == {"a": "new A", "b": "built-in b", "c": "C"}
    assert dict(widgets) == {"a": "A", "b": "built-in b"} and loads == [1]
