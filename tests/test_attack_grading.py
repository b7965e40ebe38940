"""Attacks through reply texts, which are untrusted: poisoned replies (sympy exp towers, 20,000 spaces, 20,000-deep
brackets) through collection, regrade, the agreement tensor and a served cascade, each bounded by the grading budget
(the collection and agreement ones in a child process with a wall bound, so that they fail, never hang, on a grader
without one); degenerate answers (infinity, 0/0, log 0) never accepted nor agreeing; poisoned math cascades do not
delay other formats' grading."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from attack_kit import (
    REPO,
    RowBackbone,
    agents_client,
    cascade_entry,
    cascade_server,
    chat,
    fault_server,
    graded,
    grading_workers,
    poisoned_cascade_app,
    world_files,
)


def _in_child(code: str, limit_s: float) -> str:
    """Run `code` (Python, the repo importable) in a child process; its stdout, or AssertionError past `limit_s`."""
    env_ = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=limit_s,
                              env=env_, cwd=str(REPO))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still grading after {limit_s:.0f} s") from None
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
    return done.stdout.strip() + f" ({time.perf_counter() - t:.1f} s)"


_CHILD_PRELUDE = f"""
import json, sys
sys.path.insert(0, {str(REPO)!r})
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from attack_kit import POISON_REPLIES  # tests/attack_kit.py
"""


def test_grading_poison_collection(tmp_path: Path) -> None:
    """collection + regrade: a model answering poisoned replies; every call logged, graded unparsable"""
    code = _CHILD_PRELUDE + f"""
import httpx, openai, pandas as pd
from pipeline.collect.agents import AgentSpec
from pipeline.collect.call_log import CallLog
from pipeline.collect.calls import run_collect
from pipeline.collect.regrade import regrade
from pipeline.collect.settings import CollectionSettings
texts = [t for t, _ in POISON_REPLIES]
tasks = pd.DataFrame({{"task_id": [f"t{{i}}" for i in range(len(texts))], "prompt": [f"question {{i}}" for i in
                      range(len(texts))], "gold": "42", "grader": [g for _, g in POISON_REPLIES]}})
def reply(request):
    i = int(json.loads(request.content)["messages"][-1]["content"].split()[-1])
    return httpx.Response(200, json={{"id": "x", "object": "chat.completion", "model": "m", "choices": [{{
        "index": 0, "finish_reason": "stop", "message": {{"role": "assistant", "content": texts[i]}}}}],
        "usage": {{"prompt_tokens": 1, "completion_tokens": 1}}}})
def client_for(agent):
    return openai.AsyncOpenAI(api_key="k", base_url="http://agents.test/v1", max_retries=0,
                              http_client=httpx.AsyncClient(transport=httpx.MockTransport(reply)))
agent = AgentSpec("poisoned", "m", "test", None, 1.0, 1.0)
if __name__ == "__main__":
    calls = run_collect(tasks, [agent], 0, CallLog({str(tmp_path / "calls")!r}), client_for,
                        CollectionSettings(max_retries=0))
    assert len(calls) == len(texts) and set(calls["status"]) == {{"ok"}}, calls[["status", "error_kind"]]
    assert not calls["correct"].any(), calls[["extracted", "correct"]]
    again, _ = regrade(calls, tasks)
    assert len(again) == len(texts) and not again["correct"].any()
    print(f"{{len(calls)}} calls logged and graded (none correct), regraded")
"""
    print(_in_child(code, 90))


def test_grading_poison_agreement() -> None:
    """train/agreement: 40 answers of 4,994 spaces, exp towers, (9^99)^99 in the agreement tensor"""
    code = _CHILD_PRELUDE + """
from pipeline.collect.answers import agreement
rows = [[f"{i}" + " " * 4994 + "x", f"{i}" + " " * 4994 + "y"] for i in range(1, 41)]
rows += [[r"\\exp(\\exp(\\exp(100)))", "1"], [r"\\tan(\\exp(\\exp(20)))", "0"], ["(9^{99})^{99}", "7"]]
graders = ["math_expression"] * 42 + ["integer"]
if __name__ == "__main__":
    E = agreement(rows, graders)
    assert E.shape == (43, 2, 2) and not E[:, 0, 1].any(), E[:, 0, 1]
    from pipeline.collect.bounded import counts
    print(f"43 rows compared, none agree; grading {counts()}")
"""
    print(_in_child(code, 90))


def test_grading_poison_serve(tmp_path: Path) -> None:
    """serve: cheap agents answer poisoned replies; /healthz < 100 ms meanwhile, 200 escalated, counted"""
    import threading

    import httpx

    from pipeline.serve.server import serve_in_thread

    poison = {"math_expression": [r"The answer is $\exp(\exp(\exp(100)))$", r"The answer is $\tan(\exp(\exp(20)))$"],
              "integer": [r"The answer is $(9^{99})^{99}$", '{"answer": "1' + " " * 20_000 + '+1"}']}

    def reply_of(agent: str, grader: str, i: int) -> str:  # the two cheap agents never give the same poison
        return "The answer is 1" if agent == "strong" else poison[grader][(i + (agent == "cheap_b")) % 2]

    health, results = [], []
    with serve_in_thread(poisoned_cascade_app(tmp_path, reply_of)) as srv:
        def ask(grader: str, i: int) -> None:
            r = httpx.post(srv.base_url + "/chat/completions", timeout=60, headers={"X-Router-Grader": grader},
                           json={"messages": [{"role": "user", "content": f"{grader} {i} row {i}"}]})
            results.append(r)

        httpx.get(srv.url + "/healthz", timeout=10)
        threads = [threading.Thread(target=ask, args=(g, i)) for g in poison for i in range(2)]
        for th in threads:
            th.start()
        with httpx.Client(timeout=30) as c:
            while any(th.is_alive() for th in threads):
                t = time.perf_counter()
                assert c.get(srv.url + "/healthz").status_code == 200
                health.append((time.perf_counter() - t) * 1000)
                time.sleep(0.02)
        for th in threads:
            th.join(60)
    assert len(results) == 4 and all(r.status_code == 200 for r in results), [r.status_code for r in results]
    agents = [r.headers["x-router-agent"] for r in results]
    assert agents == ["strong"] * 4, agents  # no answer from the cheap ones (or none they share): escalated
    overruns = [int(r.headers["x-router-grading-overruns"]) for r in results]
    assert sum(overruns) >= 2, overruns
    import numpy as np

    p90, worst = float(np.percentile(health, 90)), max(health)
    # 100 ms is the bound; a loaded 2-core machine (load average 20) adds scheduling stalls to single polls, so one
    # poll in ten may pass it, none a second (the old code held /healthz for minutes)
    assert p90 < 100 and worst < 1000, f"/healthz p90 {p90:.0f} ms, max {worst:.0f} ms while grading"
    print(f"4 poisoned cascades 200 (escalated, overruns/errors counted {overruns}); /healthz over {len(health)} "
            f"polls: median {np.median(health):.0f} ms, p90 {p90:.0f} ms, max {worst:.0f} ms")


# ----------------------------------------------------------------- degenerate answers (nan, infinity, 0/0, log 0)
DEGENERATE_REPLIES = [r"The answer is $\infty$", r"So \boxed{\frac{0}{0}}", '{"answer": "\\\\log(0)"}',
                      r"The answer is $\frac{1}{0}$."]


def test_degenerate_answer_escalates() -> None:
    r"""serve: a cheap agent answers \infty / \frac{0}{0} / \log(0) / \frac{1}{0}: escalated"""
    import httpx

    def answer(model, prompt):  # prompt "case K row K": the cheap agent gives reply K, the last one an answer
        k = int(prompt.split()[1])
        return "The answer is $13$" if model == "big-model" or k == len(DEGENERATE_REPLIES) else DEGENERATE_REPLIES[k]

    called, got = [], []
    with fault_server(answer=answer) as fs, cascade_server(fs) as srv, \
            httpx.Client(base_url=srv.base_url, timeout=30) as c:
        for k in range(len(DEGENERATE_REPLIES) + 1):
            r = graded(c, f"case {k} row {k}", headers={"X-Router-Grader": "math_expression"})
            assert r.status_code == 200, r.text[:200]
            called.append(r.headers["x-router-agents-called"])
            got.append(r.json()["choices"][0]["message"]["content"])
    assert called == ["cheap,expensive"] * len(DEGENERATE_REPLIES) + ["cheap"], called  # the control is accepted
    assert set(got) == {"The answer is $13$"}, got  # no client received a degenerate reply
    print(f"{len(DEGENERATE_REPLIES)} degenerate replies escalated, the control answered at stage 0")


def test_degenerate_answers_do_not_agree(tmp_path: Path) -> None:
    r"""serve: two cheap agents both answer \infty (identical strings): they do not agree, escalated"""
    import httpx
    import numpy as np

    from pipeline.collect.agents import AgentSpec
    from pipeline.route import registry
    from pipeline.serve.app import build_app
    from pipeline.serve.server import serve_in_thread
    from pipeline.serve.settings import ServeSettings

    names = ["strong", "cheap_a", "cheap_b"]
    reg = registry.load(cascade_entry(tmp_path, names))  # agents cheap_a and cheap_b first, k = 2, else strong
    X = np.load(world_files().parent.parent / "X.npy")
    specs = [AgentSpec(n, n, "test", None, p, p) for n, p in zip(names, (10.0, 0.1, 0.1))]
    texts = [r"\boxed{\infty}", r"\boxed{-\infty}", r"\boxed{\frac{0}{0}}", r"\boxed{1}"]  # the control: 1 and 1

    def answer(spec, prompt):
        return "The answer is 7" if spec.name == "strong" else texts[int(prompt.split()[-1])]

    app = build_app(reg, RowBackbone(X), specs, agents_client(answer), ServeSettings())
    with serve_in_thread(app) as srv, httpx.Client(base_url=srv.base_url, timeout=30) as c:
        agents = [chat(c, f"row {i}", headers={"X-Router-Grader": "math_expression"}).headers["x-router-agent"]
                  for i in range(len(texts))]
    assert agents[:-1] == ["strong"] * (len(texts) - 1) and agents[-1] in ("cheap_a", "cheap_b"), agents
    print(f"identical degenerate answers escalated ({agents})")


def test_degenerate_answer_collection(tmp_path: Path) -> None:
    r"""collection + regrade: an agent answers \boxed{\frac{0}{0}} to every task: graded wrong"""
    import pandas as pd

    from pipeline.collect.agents import AgentSpec
    from pipeline.collect.call_log import CallLog
    from pipeline.collect.calls import run_collect
    from pipeline.collect.regrade import regrade
    from pipeline.collect.settings import CollectionSettings

    golds = ["42", r"\frac{1}{2}", r"\sqrt{2}", r"3\pi", "x+1", "-7", "0", "1", r"\infty", "(1,2)", r"(-\infty, 2]",
             "10^{100}", "0.5", r"\frac{0}{0}", "13"]
    tasks = pd.DataFrame({"task_id": [f"t{i}" for i in range(len(golds))], "gold": golds, "grader": "math_expression",
                          "prompt": [f"question {i}" for i in range(len(golds))]})
    agent = AgentSpec("degenerate", "m", "test", None, 1.0, 1.0)
    calls = run_collect(tasks, [agent], 0, CallLog(str(tmp_path / "calls")),
                        agents_client(lambda spec, prompt: r"Simplifying, \boxed{\frac{0}{0}}"),
                        CollectionSettings(max_retries=0))
    assert len(calls) == len(golds) and set(calls["status"]) == {"ok"}, calls[["status", "error_kind"]]
    assert not calls["correct"].any() and calls["extracted"].isna().all(), calls[["extracted", "correct"]]
    before = calls.assign(extracted=r"\frac{0}{0}", correct=True)  # how a version before graded this log
    again, changed = regrade(before, tasks)
    assert changed == len(golds) and not again["correct"].any(), (changed, again[["extracted", "correct"]])
    print(f"{len(calls)} calls graded wrong (no answer); regrade of the old grades: {changed} changed")


def test_grading_starvation(tmp_path: Path) -> None:
    """serve: 40 math_expression cascades spinning in sympy (3 s budget); integer ones answered first"""
    import asyncio

    import httpx

    from pipeline.collect import bounded
    from pipeline.serve.server import serve_in_thread

    poison = (r"The answer is $\exp(\exp(\exp(100)))$", r"The answer is $\tan(\exp(\exp(20)))$")
    n = 40  # more than any event loop's default thread pool (32 threads at most), where grading used to queue

    def reply_of(agent: str, grader: str, i: int) -> str:
        if agent == "strong":
            return "The answer is 1"
        return "The answer is 7" if grader == "integer" else poison[agent == "cheap_b"]

    async def scenario(base_url: str):
        async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=httpx.Limits(max_connections=64)) as c:
            async def ask(grader: str, i: int) -> httpx.Response:
                return await c.post("/chat/completions", headers={"X-Router-Grader": grader},
                                    json={"messages": [{"role": "user", "content": f"{grader} {i} row {i}"}]})

            poisoned = [asyncio.ensure_future(ask("math_expression", i)) for i in range(n)]
            await asyncio.sleep(0.5)
            t = time.perf_counter()
            good = await asyncio.gather(*(ask("integer", 100 + i) for i in range(5)))
            good_s, done = time.perf_counter() - t, [p.done() for p in poisoned]
            return good, good_s, done, await asyncio.gather(*poisoned)

    bounded.warm_up(background=False)
    previous = bounded.configure(bounded.Budget(budget_ms=3000))  # a comparison spins 3 s before it is killed
    try:
        with serve_in_thread(poisoned_cascade_app(tmp_path, reply_of)) as srv:
            good, good_s, done, bad = asyncio.run(scenario(srv.base_url))
    finally:
        bounded.configure(previous)
    assert [r.status_code for r in good] == [200] * 5 and {r.headers["x-router-agent"] for r in good} == {"cheap_a"}
    # the order, not a time: every integer request was answered while no poisoned cascade had finished (the OOD
    # guard sends a few rows to strong alone: they grade nothing)
    graded = [d for d, r in zip(done, bad) if "cheap_a" in r.headers["x-router-agents-called"]]
    assert len(graded) >= n // 2 and not any(graded), \
        f"{sum(graded)} of {len(graded)} poisoned cascades finished before the 5 integer ones ({good_s:.1f} s)"
    assert all(r.status_code == 200 and r.headers["x-router-agent"] == "strong" for r in bad), \
        [(r.status_code, r.headers.get("x-router-agent")) for r in bad]
    deadline = time.monotonic() + 10
    while grading_workers() > bounded.POOL_SIZE and time.monotonic() < deadline:  # killed ones going
        time.sleep(0.1)
    left = grading_workers()
    assert left <= bounded.POOL_SIZE, f"{left} grading workers alive after"
    print(f"5 integer cascades answered in {good_s:.2f} s with {len(graded)} poisoned cascades in flight; all 200, "
            f"the poisoned escalated; {left} grading worker(s) alive after")
