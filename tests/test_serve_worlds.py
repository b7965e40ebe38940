"""Both worlds behind one endpoint (pipeline/serve/worlds.py): a verifiable router (a cascade over the demo replay
pool, trained on GSM8K and CRUXEval prompts, guessing their answer formats) and an open-ended router (a head over
the chat replay pool, trained on AlpacaEval instructions with their recorded judgments). One `serve` answers held-out
GSM8K questions through the first and held-out AlpacaEval instructions through the second, each reply naming its
router; a request may name its world; the CLI composes the same endpoint from `--open-ended-profile`."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pandas as pd
import pytest

from pipeline.core.paths import data_dir
from pipeline.core.prompts import routed_text
from pipeline.route import registry
from pipeline.route.cascade import CascadeRouter, Plan, Policy, Stage
from pipeline.route.fit import constant_head, fit_router
from pipeline.route.formats import FormatGuess
from pipeline.route.head import Head
from pipeline.route.ood import OODGuard
from pipeline.route.train import TrainConfig
from pipeline.serve.app import build_app
from pipeline.serve.server import serve_in_thread
from pipeline.serve.settings import ServeSettings
from pipeline.serve.worlds import open_ended_router, serve_both
from pipeline.tasks.sources import load_source
from resources.pool import PoolResource

pytestmark = pytest.mark.slow

N_TRAIN, N_VAL, N_HELD = 40, 12, 6  # per source (the chat router: twice as many to train and validate)


def _recorded(pool, source: str, n: int) -> pd.DataFrame:
    """The first `n` tasks of `source` that every agent of `pool` has a recorded reply to."""
    store, agents = pool.store(), pool.agents()
    tasks = load_source(source).iloc[: 3 * n]
    keep = [all(store.text_for(a.model, p) is not None for a in agents) for p in tasks["prompt"]]
    out = tasks[keep].iloc[:n].reset_index(drop=True)
    assert len(out) == n
    return out


def _backbone_fields(bb, dim: int) -> dict:
    return {"id": bb.model_id, "key": bb.key, "pooling": bb.pooling, "max_seq_length": bb.max_seq_length,
            "dim": dim}


def _verifiable(root, bb, cascade_point):
    """(registered cascade over the demo pool, its answer-format guess, held-out GSM8K tasks): trained on GSM8K
    (integer) and CRUXEval (python_literal) prompts; its OOD guard fitted on their embeddings."""
    pool = PoolResource(kind="replay", pool="demo")
    agents, names = pool.agents(), [a.name for a in pool.agents()]
    n = N_TRAIN + N_VAL + N_HELD
    gsm, crux = _recorded(pool, "zeroeval_gsm8k", n), _recorded(pool, "zeroeval_crux", n)
    train = pd.concat([gsm.iloc[:N_TRAIN], crux.iloc[:N_TRAIN]])
    val = pd.concat([gsm.iloc[N_TRAIN:N_TRAIN + N_VAL], crux.iloc[N_TRAIN:N_TRAIN + N_VAL]])
    X_train = bb.encode([routed_text([p]) for p in train["prompt"]])
    X_val = bb.encode([routed_text([p]) for p in val["prompt"]])
    strong, c1, c2 = 0, len(agents) - 2, len(agents) - 1
    single, cascade = Plan(Policy((Stage((strong,)),))), Plan(Policy((Stage((c1, c2), 2), Stage((strong,)))))
    path = {"kind": "cascade", "agents": names, "best_single": names[strong], "guard_z": 0.0,
            "best_single_validation": {"quality": 0.8, "ci_low": 0.8, "ci_high": 0.8, "cost_per_1k": 1.0},
            "n_validation": len(val),
            "points": [cascade_point(single, names, 0.8, 1.0), cascade_point(cascade, names, 0.79, 0.4)]}
    d = int(X_train.shape[1])
    head = constant_head(Head(np.zeros((d, len(names)), np.float32), np.zeros(len(names), np.float32),
                              agents=names), strong)
    order = [strong, c1, c2, *[j for j in range(len(names)) if j not in (strong, c1, c2)]]
    entry = registry.register(root / "verifiable", CascadeRouter(head, path, order, names),
                              registry.PromptFit(OODGuard().fit(X_train, X_val), strong),
                              backbone=_backbone_fields(bb, d), agents=[{"name": a.name, "model": a.model}
                                                                        for a in agents],
                              training={}, data_hashes={}, metrics={})
    formats = FormatGuess(X_train, train["grader"].tolist())
    return registry.load(entry), pool, formats, gsm.iloc[N_TRAIN + N_VAL:]


def _open_ended(root, bb):
    """(registered head over the chat pool, trained on AlpacaEval instructions with their recorded judgments;
    held-out instructions): the first 80 instructions train it, the next 24 validate, 6 more are held out."""
    pool = PoolResource(kind="replay", pool="chat")
    agents = pool.agents()
    rec = pd.read_parquet(data_dir() / "alpaca_eval" / "records.parquet")
    pref = rec.pivot(index="instruction", columns="model", values="preference")
    tasks = load_source("alpaca_eval").iloc[: 2 * (N_TRAIN + N_VAL) + N_HELD].reset_index(drop=True)
    split = pd.Series(["train"] * 2 * N_TRAIN + ["validation"] * 2 * N_VAL + ["test"] * N_HELD)
    R = np.array([[0.5 if np.isnan(pref.loc[p, a.model]) else float(pref.loc[p, a.model]) for a in agents]
                  for p in tasks["prompt"]])  # the reference's own reply: a tie
    rewards = pd.DataFrame({"task_id": tasks["task_id"], "agent_order": [[a.name for a in agents]] * len(tasks),
                            "mean_reward": list(R)})
    X = bb.encode([routed_text([p]) for p in tasks["prompt"]])
    fit = fit_router(X, rewards, split, TrainConfig(generations=3, log_every=0))
    entry = registry.register(root / "open_ended", fit.head, registry.PromptFit(fit.guard, fit.best_single),
                              backbone=_backbone_fields(bb, int(X.shape[1])),
                              agents=[{"name": a.name, "model": a.model} for a in agents],
                              training={"generations": 3}, data_hashes={}, metrics=fit.metrics)
    return registry.load(entry), pool, tasks[split == "test"]


@pytest.fixture(scope="module")
def worlds(tmp_path_factory, cascade_point):
    from pipeline.embed.backbone import Backbone

    root = tmp_path_factory.mktemp("worlds")
    bb = Backbone(None, max_seq_length=128)
    verifiable = _verifiable(root, bb, cascade_point)
    return bb, verifiable, _open_ended(root, bb)


def _app(worlds, formats=True):
    bb, (vreg, vpool, guess, _), (oreg, opool, _) = worlds
    other = open_ended_router(oreg, bb, opool.agents(), opool.client_for, ServeSettings())
    return serve_both(build_app(vreg, bb, vpool.agents(), vpool.client_for, ServeSettings(),
                                formats=guess if formats else None), other)


def _ask(srv, prompt: str, **extra):
    headers = extra.pop("headers", {})
    return httpx.post(srv.base_url + "/chat/completions", headers=headers, timeout=120,
                      json={"messages": [{"role": "user", "content": prompt}], **extra})


def _world(r) -> tuple[str, str, str]:
    """(world, router named by the header, router named in the reply's `router` key)."""
    assert r.status_code == 200, r.text
    return r.headers["x-router-world"], r.headers["x-router-name"], r.json()["router"]["head"]


def test_one_endpoint_answers_each_world_through_its_own_router(worlds):
    """Held-out GSM8K questions (the recorded prompts) go to the verifiable cascade, with the integer format guessed;
    held-out AlpacaEval instructions go to the chat router and get a chat agent's recorded reply; each reply names
    the router and the world that answered it."""
    bb, (vreg, vpool, _, gsm_held), (oreg, opool, chat_held) = worlds
    with serve_in_thread(_app(worlds)) as srv:
        models = httpx.get(srv.base_url + "/models").json()["data"]
        gsm = [_ask(srv, p) for p in gsm_held["prompt"]]
        chat = [_ask(srv, p) for p in chat_held["prompt"]]
    assert {m["id"] for m in models} == {vreg.name, oreg.name}
    assert [_world(r) for r in gsm] == [("verifiable", vreg.name, vreg.name)] * len(gsm)
    assert {r.headers["x-router-grader"] for r in gsm} == {"integer"}
    assert {r.headers["x-router-grader-source"] for r in gsm} == {"guessed"}
    assert all(r.json()["router"]["world"] == "verifiable" for r in gsm)
    assert [_world(r) for r in chat] == [("open-ended", oreg.name, oreg.name)] * len(chat)
    store, by_name = opool.store(), {a.name: a for a in opool.agents()}
    for r, prompt in zip(chat, chat_held["prompt"]):
        body = r.json()
        agent = by_name[body["router"]["agent"]]
        assert body["router"]["world"] == "open-ended" and r.headers["x-router-agent"] == agent.name
        assert body["choices"][0]["message"]["content"] == store.text_for(agent.model, prompt)
        assert body["usage"]["cost"] == float(r.headers["x-router-cost-usd"]) > 0


def test_a_request_names_its_world(worlds):
    """`router_grader: judge` or `model: <the chat router>` sends even a GSM8K question to the chat router (whose
    replay pool has no reply to it: 502, the headers still name the router); a verifiable format named keeps an
    AlpacaEval instruction with the verifiable router (its cascade's agents have no reply to it either)."""
    bb, (vreg, _, _, gsm_held), (oreg, _, chat_held) = worlds
    question, instruction = gsm_held["prompt"].iloc[0], chat_held["prompt"].iloc[0]
    with serve_in_thread(_app(worlds)) as srv:
        judged = _ask(srv, question, router_grader="judge")
        named = _ask(srv, question, model=oreg.name)
        verifiable = _ask(srv, instruction, headers={"X-Router-Grader": "integer"})
    for r in (judged, named):
        assert (r.headers["x-router-world"], r.headers["x-router-name"]) == ("open-ended", oreg.name), r.text
    assert (verifiable.headers["x-router-world"], verifiable.headers["x-router-name"]) == ("verifiable", vreg.name)
    assert verifiable.headers["x-router-grader"] == "integer" and "x-router-grader-source" not in verifiable.headers


def test_a_prompt_without_a_guessed_format_goes_to_the_open_ended_router(worlds):
    """The format guess is part of the rule: the same held-out GSM8K questions, the guard's verdict unchanged, go to
    the chat router when the nearest training prompts disagree on the format (labels alternated here), and stay
    with the verifiable router when it guesses no formats at all (a prompt router: its guard alone decides)."""
    bb, (vreg, vpool, guess, gsm_held), (oreg, opool, _) = worlds
    mixed = FormatGuess(guess.X, ["integer", "python_literal"] * (len(guess.X) // 2))
    other = open_ended_router(oreg, bb, opool.agents(), opool.client_for, ServeSettings())
    app = serve_both(build_app(vreg, bb, vpool.agents(), vpool.client_for, ServeSettings(), formats=mixed), other)
    with serve_in_thread(app) as srv:
        undecided = [_ask(srv, p) for p in gsm_held["prompt"].iloc[:3]]
    with serve_in_thread(_app(worlds, formats=False)) as srv:
        guard_only = [_ask(srv, p) for p in gsm_held["prompt"].iloc[:3]]
    assert {r.headers["x-router-world"] for r in undecided} == {"open-ended"}
    assert {(r.headers["x-router-world"], r.headers["x-router-ood"]) for r in guard_only} == {("verifiable", "false")}


def test_a_keyed_request_is_metered_on_the_router_that_answered(worlds, tmp_path):
    """With client keys: a streamed reply of the chat router is priced with its own agent (the meter reads the router
    that answered, not the one the request was parsed on) and recorded in the key's spend."""
    import hashlib

    import yaml

    from pipeline.serve.auth import guard_clients
    from pipeline.serve.keys import load_keys
    from resources.ledger import SpendLedger

    _, _, (oreg, _, chat_held) = worlds
    key = "sk-worlds-test"
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"name": "team", "sha256": hashlib.sha256(key.encode()).hexdigest()}]}))
    ledger = tmp_path / "ledger.sqlite"
    app = guard_clients(_app(worlds), load_keys(str(keys)), SpendLedger(ledger))
    with serve_in_thread(app) as srv:
        r = _ask(srv, chat_held["prompt"].iloc[1], stream=True, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200 and r.headers["x-router-name"] == oreg.name, r.text
    assert r.headers["x-router-world"] == "open-ended" and "data: [DONE]" in r.text
    spent = SpendLedger(ledger).totals()["team"]
    assert spent["requests"] == 1 and spent["usd"] > 0


def test_serve_composes_both_worlds_from_the_open_ended_profile(worlds, tmp_path, monkeypatch):
    """`router-lite serve --head V --open-ended-profile chat --open-ended-head O`: the CLI's own set-up builds the
    endpoint (the chat profile's pool and settings for O, one backbone for both: they were trained on the same);
    its startup lines name both routers; --open-ended-head alone is one clear error."""
    import logging

    from cli.main import _check_serve_args, _serve_app, _serve_setup, build_parser
    from pipeline.core.errors import RouterLiteError

    _, (vreg, _, _, gsm_held), (oreg, _, chat_held) = worlds
    monkeypatch.setenv("ROUTER_LITE_HOME", str(tmp_path / "home"))
    argv = ["serve", "--profile", "demo", "--head", str(vreg.path), "--target", "max-quality", "--workers", "1",
            "--port", "0",
            "--access-log", str(tmp_path / "access.log")]
    alone = build_parser().parse_args([*argv, "--open-ended-head", str(oreg.path)])
    _check_serve_args(alone)
    with pytest.raises(RouterLiteError, match="--open-ended-head .* pass --open-ended-profile"):
        _serve_setup(alone)
    args = build_parser().parse_args([*argv, "--open-ended-profile", "chat", "--open-ended-head", str(oreg.path)])
    _check_serve_args(args)
    access = logging.getLogger("router_lite.access")
    handlers = list(access.handlers)
    try:
        app, lines = _serve_app(args, _serve_setup(args), 0)
        assert app.state.open_ended.backbone is app.state.served.backbone  # one backbone loaded for both
        with serve_in_thread(app) as srv:
            replies = [_ask(srv, gsm_held["prompt"].iloc[0]), _ask(srv, chat_held["prompt"].iloc[0])]
    finally:
        for h in set(access.handlers) - set(handlers):
            access.removeHandler(h)
            h.close()
    assert [_world(r) for r in replies] == [("verifiable", vreg.name, vreg.name),
                                            ("open-ended", oreg.name, oreg.name)]
    assert f"{oreg.name}" in lines[-1] and "agents of pool 'chat'" in lines[-1]
    logged = [line for line in (tmp_path / "access.log").read_text().splitlines() if line.strip()]
    assert [json.loads(line)["router"] for line in logged] == [vreg.name, oreg.name]
