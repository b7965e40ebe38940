"""Pool kinds are asked for what they are, never tested by name: a kind registered with
`register_pool_kind` declares whether its calls are free and whether it answers recorded prompts only, and the
automation, the task pool and the pre-flight follow its attributes with no table edited but its own registration."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import httpx
import openai
import pandas as pd
import pytest
from dagster import AssetKey, asset, materialize, mem_io_manager

from assets import collection
from assets.automation import BENCHMARK, FREE_REFRESH, PROMOTION, REFRESH_SENSOR, refresh_keys
from assets.definitions import build_definitions
from assets.tasks import eligible_tasks
from pipeline.collect.replay import REPLAY_BASE_URL, replay_transport
from pipeline.core.errors import RouterLiteError
from pipeline.core.prompts import mcq_prompt
from pipeline.profile import load_profile
from resources.pool import (
    LIVE_PREFLIGHT_PROMPT,
    PoolResource,
    pool_kind,
    pool_kinds_restored,
    register_pool_kind,
)
from resources.profile import ProfileResource
from resources.storage import StorageResource

REPO = Path(__file__).resolve().parents[1]


class Audited(httpx.AsyncBaseTransport):
    """The replay transport, with every prompt it is asked kept in `asked` (the toy kind's whole point)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, asked: list[str]):
        self.inner, self.asked = inner, asked

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(json.loads(request.content)["messages"][-1]["content"])
        return await self.inner.handle_async_request(request)


def audited_replay(asked: list[str]):
    """A client factory for a third-party kind: the replay recordings, audited (free, recorded prompts only)."""
    def client(res: PoolResource, agent):
        http = httpx.AsyncClient(transport=Audited(replay_transport(res.store()), asked))
        return openai.AsyncOpenAI(api_key="none", base_url=REPLAY_BASE_URL, http_client=http, max_retries=0)

    return client


def automated(defs) -> set[str]:
    return {k.to_user_string() for a in defs.assets for k, c in a.automation_conditions_by_key.items() if c}


def with_kind(profile: str, kind: str):
    prof = load_profile(profile)
    return dataclasses.replace(prof, pool=dataclasses.replace(prof.pool, kind=kind))


def test_the_built_in_kinds_declare_what_they_are():
    replay, openrouter, compatible = pool_kind("replay"), pool_kind("openrouter"), pool_kind("openai_compatible")
    assert replay.free and replay.recorded_only and replay.key_env is None and not replay.key_required
    assert not openrouter.free and not openrouter.recorded_only
    assert openrouter.key_env == "OPENROUTER_API_KEY" and openrouter.key_required
    assert openrouter.default_base_url == "https://openrouter.ai/api/v1"
    assert not compatible.free and not compatible.key_required and compatible.default_base_url is None
    tasks = pd.DataFrame({"split": ["validation"] + ["train"] * 25, "prompt": [f"p{i}" for i in range(26)]})
    assert replay.preflight_prompts(tasks) == [f"p{i}" for i in range(1, 21)]  # the first 20 train prompts
    assert openrouter.preflight_prompts(tasks) == compatible.preflight_prompts(tasks) == [LIVE_PREFLIGHT_PROMPT]


def test_a_kind_declaring_a_required_key_gets_the_key_checks():
    with pool_kinds_restored():
        with pytest.raises(RouterLiteError, match="key_required needs key_env"):
            register_pool_kind("metered", lambda res, agent: None, key_required=True)
        with pytest.raises(RouterLiteError, match="unknown attribute.*costly"):
            register_pool_kind("metered", lambda res, agent: None, costly=True)
        register_pool_kind("metered", lambda res, agent: None, key_env="METERED_KEY", key_required=True,
                           key_host="api.metered.example", default_base_url="https://api.metered.example/v1")
        res = PoolResource(kind="metered", pool="pilot")
        with pytest.raises(RouterLiteError, match="^graded_calls needs the METERED_KEY environment variable"):
            res.require_key("graded_calls")
        keyed = PoolResource(kind="metered", pool="pilot", api_key="k")
        keyed.check()  # its own host may see the key
        assert keyed.key_allowed("https://api.metered.example/v1")
        assert not keyed.key_allowed("https://openrouter.ai/api/v1")  # not OpenRouter's: the key is not its
        with pytest.raises(RouterLiteError, match=r"base URL https://elsewhere.example/v1 is not "
                                                  r"https://api.metered.example; the METERED_KEY key"):
            PoolResource(kind="metered", pool="pilot", api_key="k", base_url="https://elsewhere.example/v1").check()


@pytest.mark.slow  # a definitions build and a Dagster materialisation of the pre-flight on the replay recordings
def test_a_registered_free_pool_kind_gets_the_benchmark_refresh_and_the_recorded_preflight(monkeypatch, tmp_path):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    src = pd.read_parquet(REPO / "data" / "sources" / "mmlu_pro" / "test.parquet").head(80)
    prompts = [mcq_prompt(q, list(o)) for q, o in zip(src.question, src.options)]
    asked: list[str] = []
    with pool_kinds_restored():
        register_pool_kind("replay_audit", audited_replay(asked), free=True, recorded_only=True,
                           description="the replay recordings, every prompt kept")
        register_pool_kind("metered", audited_replay(asked), description="a live kind: its defaults")

        # the automation: a free kind's benchmark refreshes by itself, a live one's never
        assert refresh_keys("replay_audit") == [*FREE_REFRESH, BENCHMARK, PROMOTION]  # the gate reads its evidence
        assert refresh_keys("metered") == list(FREE_REFRESH)
        free = set(FREE_REFRESH) | {BENCHMARK, PROMOTION}
        for kind, want in (("replay_audit", free), ("metered", set(FREE_REFRESH))):
            defs = build_definitions(home="/nonexistent", profile=with_kind("smoke", kind))
            assert automated(defs) == want
            sensor = defs.resolve_sensor_def(REFRESH_SENSOR)
            assert sensor.asset_selection.resolve(defs.resolve_asset_graph()) == {AssetKey(k) for k in want}

        # the task pool of a recorded-only kind keeps the recorded tasks only; a live kind's keeps them all
        store = PoolResource(kind="replay_audit", pool="mmlu_pro").store()
        agents = PoolResource(kind="replay_audit", pool="mmlu_pro").agents()
        recorded = [p for p in prompts if all(store.text_for(a.model, p) for a in agents)]
        assert len(recorded) >= 21
        tasks = pd.DataFrame({"task_id": [f"mmlu_pro/test/{i:06d}" for i in range(24)],
                              "split": ["validation"] + ["train"] * 22 + ["test"],
                              "prompt": recorded[:23] + ["What is the capital of France?"]})
        prof = with_kind("mmlu_pro", "replay_audit")
        assert eligible_tasks(tasks, prof)["prompt"].tolist() == recorded[:23]
        assert len(eligible_tasks(tasks, with_kind("mmlu_pro", "metered"))) == 24

        # the pre-flight: a recorded-only kind asks the first 20 train prompts (all answered), a live one the
        # fixed arithmetic prompt (which the recordings do not answer)
        @asset(name="task_pool")
        def given_tasks() -> pd.DataFrame:
            return tasks

        def run_preflight(kind: str) -> pd.DataFrame:
            asked.clear()
            result = materialize([given_tasks, collection.preflight], raise_on_error=False,
                                 resources={"io_manager": mem_io_manager, "profile": ProfileResource(name="smoke"),
                                            "pool": PoolResource(kind=kind, pool="mmlu_pro"),
                                            "storage": StorageResource(home=str(tmp_path / "home"))})
            return result.output_for_node("preflight") if result.success else None

        out = run_preflight("replay_audit")
        assert out["passed"].all() and (out["n_calls"] == 20).all() and set(out["pool_kind"]) == {"replay_audit"}
        assert sorted(set(asked)) == sorted(recorded[1:21]) and len(asked) == 20 * len(agents)
        assert run_preflight("metered") is None  # every agent fails: the replay has no 2 + 2
        assert set(asked) == {LIVE_PREFLIGHT_PROMPT}
