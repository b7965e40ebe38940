"""Held-out figures are what `serve` decides: every held-out test row of the smoke lineage is sent, as the agents'
prompt (a user pasting the benchmark's template), to a real endpoint serving each registered router at the serving
target, and what the endpoint decided (the OOD guard, the agent whose reply came back, the calls it made) must equal
the `served_decisions` table the reports are computed from, row by row."""
from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served_world(smoke_home):
    from cli import lineage
    from pipeline.embed.backbone import Backbone
    from pipeline.route import registry
    from pipeline.route.fit import training_split
    from pipeline.route.formats import format_guess
    from resources.pool import PoolResource

    home = str(smoke_home[0])
    defs = lineage.definitions("smoke", home)
    load = lambda name: lineage.load(name, defs=defs)  # noqa: E731
    decisions, pool_tasks, rewards = load("served_decisions"), load("task_pool"), load("reward_matrix")
    head, cascade = load("registered_head"), load("registered_cascade")
    regs = {"head": registry.load(smoke_home[0] / "registry" / head["name"])}
    for variant, v in cascade["variants"].items():
        regs[f"cascade:{variant}"] = registry.load(smoke_home[0] / "registry" / v["name"])
    split = training_split(rewards, pool_tasks)
    test_ids = rewards["task_id"][(split == "test").to_numpy()].tolist()
    prompts = pool_tasks.set_index("task_id").loc[test_ids, "prompt"].tolist()
    m = regs["head"].manifest["backbone"]
    bb = Backbone(None, pooling=m.get("pooling", "mean"), max_seq_length=int(m.get("max_seq_length", 256)))
    return decisions, regs, test_ids, prompts, bb, format_guess(pool_tasks, load("prompt_embeddings")), \
        PoolResource(kind="replay", pool="mmlu_pro")


async def _ask_all(base_url: str, prompts: list[str]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        sem = asyncio.Semaphore(8)

        async def one(p):
            async with sem:
                return await client.post("/chat/completions", json={"messages": [{"role": "user", "content": p}]})

        return await asyncio.gather(*(one(p) for p in prompts))


def test_held_out_decisions_equal_what_serve_decides_on_every_test_row(served_world):
    from pipeline.serve.app import build_app
    from pipeline.serve.server import serve_in_thread
    from pipeline.serve.settings import ServeSettings

    decisions, regs, test_ids, prompts, bb, formats, pool = served_world
    target = "quality>=0.98"  # the profile's serving target
    checked = 0
    for name, reg in regs.items():
        rows = decisions[(decisions["router"] == name) & (decisions["target"] == target)]
        assert rows["task_id"].tolist() == test_ids, f"{name}: the table holds the held-out rows in order"
        agents = [a["name"] for a in reg.agents]
        app = build_app(reg, bb, pool.agents(), pool.client_for, ServeSettings(default_target=target),
                        formats=formats)
        with serve_in_thread(app) as srv:
            replies = asyncio.run(_ask_all(srv.base_url, prompts))
        for (_, row), r in zip(rows.iterrows(), replies, strict=True):
            assert r.status_code == 200, (name, row["task_id"], r.text[:200])
            where = f"{name} at {target}, {row['task_id']}"
            assert (r.headers["x-router-ood"] == "true") == bool(row["ood"]), where
            assert r.headers["x-router-agent"] == agents[int(row["answered_by"])], where
            called = (r.headers.get("x-router-agents-called") or r.headers["x-router-agent"]).split(",")
            assert len(called) == int(row["calls"]), where
            cost = float(r.headers["x-router-cost-usd"])
            assert np.isclose(cost, row["cost_usd"], rtol=1e-6, atol=1e-12), (where, cost, row["cost_usd"])
            checked += 1
    assert checked == len(regs) * len(test_ids) > 0
