"""What a router embeds of a conversation (`pipeline.core.prompts.routed_text`) and what a request with tools becomes
(`pipeline.serve.requests.parse_chat_request`), without a server; a cascade's stages never take a tool call for an
answer (`pipeline.serve.cascade_calls`). On the live endpoint: tests/test_serve_conversation.py."""
from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest

from pipeline.collect.agents import AgentSpec
from pipeline.core.prompts import ROUTED_WINDOW, routed_text, user_text, word_pieces
from pipeline.route.cascade import Policy, Stage
from pipeline.serve.cascade_calls import calls_tools, run_cascade, sse_of
from pipeline.serve.requests import TOOL_PARAMS, RequestError, parse_chat_request
from pipeline.serve.settings import ServeSettings
from pipeline.tasks.sources import load_source

QUESTION = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many?"
FOLLOW_UP = "and now in Python?"
TOOLS = [{"type": "function", "function": {"name": "run_python", "parameters": {
    "type": "object", "properties": {"code": {"type": "string"}}}}}]


def _parse(body: dict, settings: ServeSettings | None = None):
    return parse_chat_request(json.dumps(body).encode(), "r", settings or ServeSettings())


def _bundled_questions(every: int = 1) -> list[str]:
    out: list[str] = []
    for s in ("gsm8k", "math500", "mmlu", "mmlu_pro", "arc_challenge", "aime2025_i", "aime2025_ii", "zeroeval_crux",
              "zeroeval_gsm8k", "zeroeval_math_l5"):
        out += [user_text(p) for p in load_source(s)["prompt"].iloc[::every]]
    return [q for q in out if q]


def test_one_turn_is_exactly_its_user_text():
    """Training embeds one turn per task: serving a one-turn request embeds exactly that."""
    zeroeval = load_source("zeroeval_gsm8k")["prompt"].iloc[0]
    for text in (QUESTION, "  padded  ", zeroeval, load_source("mmlu_pro")["prompt"].iloc[0], "x " * 2000):
        assert routed_text([text]) == user_text(text)
        assert _parse({"messages": [{"role": "user", "content": text}]}).text == user_text(text)
    assert "## Question" not in routed_text([zeroeval])


def test_a_follow_up_is_embedded_with_the_user_turns_it_follows():
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi."},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]},  # no text
                {"role": "user", "content": [{"type": "text", "text": "Natalia sold clips to 48 of her friends "},
                                             {"type": "text", "text": "in April, and then she sold half as many "
                                                                      "clips in May. How many?"}]},
                {"role": "assistant", "content": "72", "name": "bot"},
                {"role": "tool", "content": "tool output", "tool_call_id": "c1"},
                {"role": "user", "content": FOLLOW_UP}]
    req = _parse({"messages": messages})
    assert req.text == f"Say hi.\n\n{QUESTION}\n\n{FOLLOW_UP}"  # user turns, latest last
    for other in ("You are terse", "Hi.", "72", "tool output"):  # system, assistant and tool turns are not
        assert other not in req.text.replace("Say hi.", "")
    assert req.upstream["messages"] == messages  # all forwarded as given


def test_earlier_turns_are_kept_only_as_far_as_they_fit_the_window():
    older, long_q = "What is the capital of France?", "word " * 300
    # the latest turn is whole, even alone over the window (the backbone cuts it, as in training)
    assert routed_text([older, long_q]) == user_text(long_q)
    # the first earlier turn that does not fit whole comes by its last words; anything older is dropped
    text = routed_text([older, long_q, QUESTION], window=64)
    head, latest = text.rsplit("\n\n", 1)
    assert latest == QUESTION and "France" not in text and set(head.split()) == {"word"}
    assert word_pieces(text) <= 64 - 2 < word_pieces(text) + word_pieces("word")
    # whole turns while they fit, newest first
    assert routed_text([older, "Say hi.", QUESTION], window=64) == f"{older}\n\nSay hi.\n\n{QUESTION}"
    assert routed_text(["", "  ", QUESTION]) == QUESTION  # empty turns are no turns
    # the window is the server's (build_app: the backbone's max_seq_length)
    body = {"messages": [{"role": "user", "content": long_q}, {"role": "user", "content": QUESTION}]}
    assert len(_parse(body).text) > len(_parse(body, ServeSettings(routed_window=64)).text) > len(QUESTION)
    assert ServeSettings().routed_window == ROUTED_WINDOW == 256
    with pytest.raises(ValueError, match="no user turn|without a user turn"):
        routed_text([])


@pytest.mark.slow  # the tokenizer
def test_word_pieces_bounds_the_tokenizers_count_and_keeps_the_latest_turn_in_the_window():
    from transformers import AutoTokenizer

    from pipeline.embed.backbone import bundled_model_path

    tok = AutoTokenizer.from_pretrained(str(bundled_model_path()))
    qs = _bundled_questions(every=10)
    real = np.array([len(ids) for ids in tok(qs, add_special_tokens=False)["input_ids"]])
    est = np.array([word_pieces(q) for q in qs])
    assert len(qs) > 3000
    assert (real > est).mean() <= 0.005 and (real / est).max() <= 1.5  # an upper estimate, but for DNA codons
    assert 1.2 <= (est / real).mean() <= 1.8  # not so loose that a window holds little
    # conversations of two bundled questions: the backbone's window holds the whole routed text, so the latest turn
    # is never cut by the turns before it
    rng = np.random.default_rng(0)
    for window in (128, ROUTED_WINDOW):
        for i, j in rng.integers(0, len(qs), (300, 2)):
            text = routed_text([qs[i], qs[j]], window)
            if text != qs[j]:  # more than the latest turn was kept
                assert text.endswith(qs[j]) and len(tok(text)["input_ids"]) <= window, (qs[i][:80], qs[j][:80])


def test_tool_fields_are_forwarded_unchanged_and_a_malformed_one_is_400():
    fields = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "run_python"}},
              "parallel_tool_calls": False, "response_format": {"type": "json_schema", "json_schema": {"name": "a"}},
              "functions": [TOOLS[0]["function"]], "function_call": "auto"}
    req = _parse({"messages": [{"role": "user", "content": QUESTION}], **fields})
    assert {k: req.upstream[k] for k in TOOL_PARAMS} == fields and req.tool_field == "tools"
    assert _parse({"messages": [{"role": "user", "content": QUESTION}], "response_format": {"type": "text"}}
                  ).tool_field == "response_format"
    plain = _parse({"messages": [{"role": "user", "content": QUESTION}]})
    assert plain.tool_field is None and not set(TOOL_PARAMS) & set(plain.upstream)
    for field, bad in (("tools", []), ("tools", [1]), ("tools", {"a": 1}), ("tool_choice", 3),
                       ("parallel_tool_calls", "yes"), ("response_format", "json"), ("functions", "f"),
                       ("function_call", ["auto"])):
        with pytest.raises(RequestError) as e:
            _parse({"messages": [{"role": "user", "content": QUESTION}], field: bad})
        assert (e.value.status, e.value.code, e.value.param) == (400, "invalid_value", field), (field, bad)
        assert e.value.message.startswith(f"'{field}' must be")


class _Agent:
    """An agent's client that answers every call with `message` (what `post_chat` calls)."""

    api_key = "k"

    def __init__(self, message: dict):
        self.message, self.calls = message, 0

    async def post(self, path, *, body, cast_to, options, stream):
        self.calls += 1
        finish = "tool_calls" if self.message.get("tool_calls") else "stop"
        return httpx.Response(200, json={"id": "c", "model": body["model"], "choices": [
            {"index": 0, "message": self.message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.001}})


CALL = {"id": "call_1", "type": "function", "function": {"name": "run_python", "arguments": "{\"code\": \"1\"}"}}


def test_a_cascade_takes_no_tool_call_for_an_answer():
    specs = [AgentSpec(n, n, "x", None, 1.0, 1.0) for n in ("strong", "c1", "c2")]
    says_a = {"role": "assistant", "content": "The answer is (A)."}
    calling = {"role": "assistant", "content": "The answer is (A).", "tool_calls": [CALL]}  # text beside a call

    def run(policy, clients):
        return asyncio.run(run_cascade(policy, [0, 1, 2], specs, clients, {"messages": [{"role": "user",
                                       "content": "Q"}]}, {"timeout": 10}, "mcq_letter"))

    clients = [_Agent(says_a), _Agent(calling), _Agent(says_a)]
    res = run(Policy((Stage((1, 2), 2), Stage((0,)))), clients)
    assert res.stage == 1 and res.accepted.agent == 0  # c1's call is no answer: no agreement, escalated
    assert [c.calls for c in clients] == [1, 1, 1]
    # a last stage's tool call is returned as it is, and streamed with its call
    res = run(Policy((Stage((1,)),)), [_Agent(says_a), _Agent(calling), _Agent(says_a)])
    assert res.accepted.agent == 1 and calls_tools(res.accepted.data)
    assert res.accepted.data["choices"][0]["message"]["tool_calls"] == [CALL]
    events = [json.loads(line[6:]) for line in sse_of(res.accepted.data, {"agent": "c1"}).decode().split("\n\n")
              if line.startswith("data: {")]
    assert events[0]["choices"][0]["delta"]["tool_calls"] == [{"index": 0, **CALL}]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert not calls_tools({"choices": [{"message": says_a}]})


def test_an_estimated_cost_counts_tool_definitions_and_tool_calls():
    """An agent that reports no usage: its tokens are estimated from characters, tool definitions and calls included
    (a provider bills both), so a tools reply is never priced as an empty one."""
    from pipeline.collect.client import reply_usage

    spec = AgentSpec("a", "a", "x", None, 1.0, 1.0)
    upstream = {"messages": [{"role": "user", "content": QUESTION}]}
    reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [CALL]}}]}
    bare = reply_usage(spec, upstream, reply)
    with_tools = reply_usage(spec, {**upstream, "tools": TOOLS}, reply)
    assert with_tools["prompt_tokens"] > bare["prompt_tokens"] == -(-len(QUESTION) // 4)
    assert bare["completion_tokens"] == -(-len(json.dumps([CALL])) // 4) > 0


def test_a_huge_turn_is_counted_no_further_than_the_window():
    """Serve parses on its event loop: a 1 MB turn is counted only as far as the window (`word_pieces` with a cap),
    and only the end of an earlier one is read."""
    big = "lorem ipsum dolor sit amet " * 38_000
    assert word_pieces(big, cap=100) == 101 < word_pieces(big)  # stopped just past the cap
    assert routed_text([big, QUESTION]).endswith(f"\n\n{QUESTION}")
    head = routed_text([big, QUESTION]).rsplit("\n\n", 1)[0]
    assert big.rstrip().endswith(head) and word_pieces(head) <= ROUTED_WINDOW - 2 - word_pieces(QUESTION)
    assert routed_text([QUESTION, big]) == user_text(big)  # the latest over the window: nothing before it
