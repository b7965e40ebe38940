"""Replay pool: answers OpenAI chat-completions requests with real recorded model outputs.

The recordings map (model, prompt_hash) -> the text that model produced: `data/replay/mmlu_pro_outputs.parquet`
(built by `data/build/build_replay.py` from the official TIGER-Lab MMLU-Pro outputs) and
`data/replay/zeroeval_outputs.parquet` (built by `data/build/build_zeroeval.py` from ZeroEval's GSM8K / MATH level-5 /
CRUXEval replies); the default store holds both (their model names do not overlap). The replay speaks the OpenAI
protocol, so the collection code cannot tell it from a live provider:

- `POST .../chat/completions`: the last user message is hashed with `prompts.prompt_hash`; the recorded text comes
  back as a `chat.completion` (or as SSE `chat.completion.chunk`s with `stream=true`). `temperature`/`top_p` are
  ignored: a recording has one answer per prompt.
- `GET .../models` (and `.../models/{id}`): the recorded models.
- Unknown model or unrecorded prompt: HTTP 404 with an OpenAI-style error body (`{"error": {"message", "type",
  "param", "code"}}`), so the client records an error, never a wrong answer. Malformed requests: HTTP 400.

Token counts are a deterministic approximation (no tokenizer download): `approx_tokens(text) = ceil(len(text) / 4)`
(Unicode characters; OpenAI's "1 token ~ 4 characters of English" rule of thumb), 0 for empty text. `prompt_tokens`
sums it over the content of every request message; `usage.token_count_method` says so, and the collection records
such calls with `usage_source` "provider_estimate", so every cost derived from them is reported as estimated.
When the recorded text is longer than `max_tokens` (or `max_completion_tokens`), it is cut to its first `4 * max_tokens`
characters and `finish_reason` is "length", as a provider stops generating at the limit.

Three front ends share one request handler: `replay_transport(store)` (an `httpx.AsyncBaseTransport`, no socket),
`replay_sync_transport(store)` (`httpx.BaseTransport`) and `serve(store)` (starlette + uvicorn on a loopback port, in a
background thread).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from pipeline.core.errors import RouterLiteError
from pipeline.core.http_server import LoopbackServer
from pipeline.core.paths import data_dir
from pipeline.core.prompts import prompt_hash

CHARS_PER_TOKEN = 4
TOKEN_COUNT_METHOD = "ceil(characters/4)"  # stated in every replayed `usage` (an extra key): the counts are estimates
STREAM_CHUNK_CHARS = 64
RECORDINGS = "replay/mmlu_pro_outputs.parquet"
RECORDING_FILES = (RECORDINGS, "replay/zeroeval_outputs.parquet")  # what the default store loads
JUDGED_RECORDINGS = "alpaca_eval/records.parquet"  # replies and their recorded judgments (loaded when present)
RECORDED_JUDGE = "weighted_alpaca_eval_gpt4_turbo"  # the judge model id the replay answers with those judgments
MIN_LOGPROB = -9999.0  # a recorded probability of 0 as a log-probability (exp() of it is 0.0)


def default_recordings_path() -> Path:
    return data_dir() / RECORDINGS


def default_recordings_paths() -> list[Path]:
    """Every bundled recordings file (the first one must exist; the others are loaded when present)."""
    paths = [data_dir() / f for f in RECORDING_FILES]
    return paths[:1] + [p for p in paths[1:] if p.exists()]


def approx_tokens(text: str | None) -> int:
    """Deterministic token estimate: ceil(characters / 4); 0 for None or ''."""
    if not text:
        return 0
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def truncate_to_tokens(text: str, max_tokens: int) -> str:
    """The prefix of `text` that `approx_tokens` counts as `max_tokens` tokens."""
    return text[: max(0, int(max_tokens)) * CHARS_PER_TOKEN]


class ReplayStore:
    """Recorded outputs: (model, prompt_hash) -> text; and recorded judgments: (prompt_hash(instruction),
    prompt_hash(reply)) -> the recorded probability that the reply beats the reference's, served as the judge
    models `judge_models` (pipeline/collect/judge.py)."""

    def __init__(self, records: dict[tuple[str, str], str], source: str = "<memory>",
                 judgments: dict[tuple[str, str], float] | None = None, judge_models: tuple[str, ...] = ()):
        self._texts = dict(records)
        self.judgments = dict(judgments or {})
        self.judge_models = set(judge_models) if self.judgments else set()
        self._model_set = {m for m, _ in self._texts} | self.judge_models
        self._models = sorted(self._model_set)
        self.source = source

    @classmethod
    def load(cls, path: str | Path | None = None) -> ReplayStore:
        """Load one recordings Parquet, or (no path) every bundled one under `data_dir()` (`RECORDING_FILES`)."""
        if path is None:
            stores = [cls._load_one(p) for p in default_recordings_paths()]
            judged = data_dir() / JUDGED_RECORDINGS
            if judged.exists():
                stores.append(cls.load_judged(judged))
            records = {k: v for s in stores for k, v in s._texts.items()}
            judgments = {k: v for s in stores for k, v in s.judgments.items()}
            return cls(records, source=", ".join(s.source for s in stores), judgments=judgments,
                       judge_models=(RECORDED_JUDGE,))
        return cls._load_one(Path(path))

    @classmethod
    def load_judged(cls, path: str | Path) -> ReplayStore:
        """AlpacaEval's recordings (data/alpaca_eval/records.parquet): each model's reply to each instruction (keyed
        by the instruction as the user wrote it) and the recorded judgment of each reply against the reference's.
        Two models that gave one instruction the same reply share one judgment (the judge saw the same input): the
        first model's in name order is kept (upstream judged such a pair twice once, 0.020 and 0.011: instruction
        473, data/alpaca_eval/SOURCE.md)."""
        import pyarrow.parquet as pq

        path = Path(path)
        try:
            cols = pq.read_table(path, columns=["model", "instruction", "output", "preference"]).to_pydict()
        except Exception as exc:  # corrupt file, missing column
            raise RouterLiteError(f"cannot read judged recordings {path}: {exc}") from exc
        records: dict[tuple[str, str], str] = {}
        judgments: dict[tuple[str, str], float] = {}
        rows = list(zip(cols["model"], cols["instruction"], cols["output"], cols["preference"]))
        # the reference's replies (never judged: preference NaN); a reply identical to one is a tie the grader
        # scores without a call, so its recorded 0.5 is not served (it would make the reference look judged)
        references = {(prompt_hash(i), prompt_hash(o)) for _, i, o, p in rows if p is None or not math.isfinite(p)}
        for model, instruction, output, pref in rows:
            hi = prompt_hash(instruction)
            records.setdefault((model, hi), output)
            key = (hi, prompt_hash(output))
            if pref is not None and math.isfinite(pref) and key not in references:
                judgments.setdefault(key, float(pref))
        return cls(records, source=str(path), judgments=judgments, judge_models=(RECORDED_JUDGE,))

    @classmethod
    def _load_one(cls, path: Path) -> ReplayStore:
        import pyarrow.parquet as pq

        if not path.exists():
            raise RouterLiteError(
                f"replay recordings not found: {path} (build them with `python data/build/build_replay.py`, "
                "or point ROUTER_LITE_DATA at a data directory that holds replay/mmlu_pro_outputs.parquet)"
            )
        try:
            table = pq.read_table(path, columns=["model", "prompt_hash", "text"])
        except Exception as exc:  # corrupt file, missing column
            raise RouterLiteError(f"cannot read replay recordings {path}: {exc}") from exc
        cols = table.to_pydict()
        records: dict[tuple[str, str], str] = {}
        for model, h, text in zip(cols["model"], cols["prompt_hash"], cols["text"]):
            if model is None or h is None or text is None:
                continue
            records.setdefault((model, h), text)
        return cls(records, source=str(path))

    @classmethod
    def from_frame(cls, df) -> ReplayStore:
        """From a DataFrame with columns model, prompt_hash, text (tests, other recordings)."""
        missing = {"model", "prompt_hash", "text"} - set(df.columns)
        if missing:
            raise RouterLiteError(f"replay frame lacks columns {sorted(missing)}")
        records: dict[tuple[str, str], str] = {}
        for model, h, text in zip(df["model"], df["prompt_hash"], df["text"]):
            records.setdefault((str(model), str(h)), str(text))
        return cls(records)

    def models(self) -> list[str]:
        return list(self._models)

    def has_model(self, model: str) -> bool:
        return model in self._model_set

    def lookup(self, model: str, prompt_hash_: str) -> str | None:
        return self._texts.get((model, prompt_hash_))

    def text_for(self, model: str, prompt: str) -> str | None:
        return self.lookup(model, prompt_hash(prompt))

    def hashes(self, model: str) -> set[str]:
        return {h for m, h in self._texts if m == model}

    def __len__(self) -> int:
        return len(self._texts)

    def __repr__(self) -> str:
        return f"ReplayStore({len(self)} recordings, {len(self._models)} models, source={self.source!r})"


# ----------------------------------------------------------------------------------------------- request handling
@dataclass
class ReplayResponse:
    status: int
    headers: dict[str, str]
    chunks: list[bytes]  # one element for JSON bodies; SSE events for streams

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


def _error(status: int, message: str, type_: str, code: str, param: str | None = None) -> ReplayResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return ReplayResponse(status, {"content-type": "application/json"}, [json.dumps(body).encode()])


def _json(obj: Any) -> ReplayResponse:
    return ReplayResponse(200, {"content-type": "application/json"}, [json.dumps(obj, ensure_ascii=False).encode()])


def _content_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(parts) if parts else None
    return None


def _model_obj(model: str) -> dict:
    return {"id": model, "object": "model", "created": 0, "owned_by": "replay"}


def handle_request(store: ReplayStore, method: str, path: str, body: bytes) -> ReplayResponse:
    """The whole replay API as a pure function of the request (shared by the transports and the server)."""
    path = path.rstrip("/")
    if method == "GET":
        routed = _models_route(store, path)
        if routed is not None:
            return routed
    if not path.endswith("/chat/completions"):
        return _error(404, f"no route {method} {path} in the replay API", "invalid_request_error", "unknown_url")
    if method != "POST":
        return _error(405, f"{method} not allowed on {path}", "invalid_request_error", "method_not_allowed")
    parsed = _parse_chat(body)
    if isinstance(parsed, ReplayResponse):
        return parsed
    req, model, user_text, prompt_tokens, max_tokens = parsed
    if model in store.judge_models:
        return _judge_reply(store, model, user_text, prompt_tokens)
    if not store.has_model(model):
        return _error(404, f"The model `{model}` has no replay recordings", "invalid_request_error",
                      "model_not_found", "model")
    h = prompt_hash(user_text)
    text = store.lookup(model, h)
    if text is None:
        return _error(404, f"no recorded response of model `{model}` for prompt {h}", "invalid_request_error",
                      "prompt_not_recorded", "messages")
    finish = "stop"
    if max_tokens is not None and approx_tokens(text) > max_tokens:
        text, finish = truncate_to_tokens(text, max_tokens), "length"
    completion_tokens = approx_tokens(text)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens, "token_count_method": TOKEN_COUNT_METHOD}
    cid = "chatcmpl-replay-" + hashlib.sha256(f"{model}\n{h}".encode()).hexdigest()[:24]
    created = int(time.time())
    if not req.get("stream"):
        return _json({
            "id": cid, "object": "chat.completion", "created": created, "model": model,
            "system_fingerprint": "replay",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": finish}],
            "usage": usage,
        })
    include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
    return _stream(cid, created, model, text, finish, usage, include_usage)


def recorded_verdict(store: ReplayStore, prompt: str) -> tuple[str, list[dict]] | str:
    """The recorded judgment of the reply in a judge prompt (pipeline/collect/judge.py), as a live judge gives it:
    (the verdict character, "A" or "B", the likelier; the first token's top log-probabilities (log P, log (1 - P))
    for both positions, likelier first). The reply judged is the one with a recorded judgment; the other must be the
    reference. Else why not: a string (not a judge prompt, or no recorded judgment of this pair)."""
    from pipeline.collect.judge import parse_judge_prompt

    parsed = parse_judge_prompt(prompt)
    if parsed is None:
        return "not a judge prompt (pipeline/collect/judge.py)"
    instruction, a, b = parsed
    hi = prompt_hash(instruction)
    pa, pb = store.judgments.get((hi, prompt_hash(a))), store.judgments.get((hi, prompt_hash(b)))
    if (pa is None) == (pb is None):
        return f"no recorded judgment for this pair of replies to instruction {hi}"
    p_a = pa if pa is not None else 1.0 - pb

    def lp(p: float) -> float:
        return math.log(p) if p > 0 else MIN_LOGPROB

    tops = sorted([{"token": "A", "logprob": lp(p_a)}, {"token": "B", "logprob": lp(1.0 - p_a)}],
                  key=lambda t: -t["logprob"])
    return tops[0]["token"], tops


def _judge_reply(store: ReplayStore, model: str, prompt: str, prompt_tokens: int) -> ReplayResponse:
    """The recorded judgment of the reply in a judge prompt (`recorded_verdict`): the verdict character and its
    first-token log-probabilities; 404 for another prompt or a pair without a recorded judgment."""
    verdict = recorded_verdict(store, prompt)
    if isinstance(verdict, str):
        why = f"`{model}` is a replayed judge: it answers only judge prompts (pipeline/collect/judge.py)" \
            if verdict.startswith("not a judge") else f"{verdict} (`{model}`)"
        return _error(404, why, "invalid_request_error", "prompt_not_recorded", "messages")
    verdict, tops = verdict
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": prompt_tokens + 1,
             "token_count_method": TOKEN_COUNT_METHOD}
    cid = "chatcmpl-replay-" + hashlib.sha256(f"{model}\n{prompt_hash(prompt)}".encode()).hexdigest()[:24]
    return _json({
        "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "system_fingerprint": "replay",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": verdict},
                     "logprobs": {"content": [{"token": verdict, "logprob": tops[0]["logprob"],
                                               "top_logprobs": tops}]},
                     "finish_reason": "stop"}],
        "usage": usage,
    })


def _models_route(store: ReplayStore, path: str) -> ReplayResponse | None:
    """GET .../models and .../models/{id}; None for any other path."""
    if path.endswith("/models"):
        return _json({"object": "list", "data": [_model_obj(m) for m in store.models()]})
    if "/models/" in path:
        model = path.split("/models/", 1)[1]
        if not store.has_model(model):
            return _error(404, f"The model `{model}` has no replay recordings", "invalid_request_error",
                          "model_not_found", "model")
        return _json(_model_obj(model))
    return None


def _parse_chat(body: bytes):
    """(request, model, last user text, prompt tokens, max_tokens) of a chat request, or the 400 to answer."""
    try:
        req = json.loads(body or b"{}")
    except ValueError:
        return _error(400, "request body is not valid JSON", "invalid_request_error", "invalid_json")
    if not isinstance(req, dict):
        return _error(400, "request body must be a JSON object", "invalid_request_error", "invalid_json")
    model = req.get("model")
    messages = req.get("messages")
    if not isinstance(model, str) or not model:
        return _error(400, "missing required parameter: 'model'", "invalid_request_error", "missing_model", "model")
    if not isinstance(messages, list) or not messages:
        return _error(400, "missing required parameter: 'messages'", "invalid_request_error", "missing_messages",
                      "messages")
    user_text = None
    prompt_tokens = 0
    for msg in messages:
        if isinstance(msg, dict):
            text = _content_text(msg.get("content"))
            prompt_tokens += approx_tokens(text)
            if msg.get("role") == "user" and text is not None:
                user_text = text
    if user_text is None:
        return _error(400, "no user message with text content", "invalid_request_error", "missing_user_message",
                      "messages")
    max_tokens = req.get("max_completion_tokens", req.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        return _error(400, f"max_tokens must be a positive integer, got {max_tokens!r}", "invalid_request_error",
                      "invalid_max_tokens", "max_tokens")
    return req, model, user_text, prompt_tokens, max_tokens


def _stream(cid: str, created: int, model: str, text: str, finish: str, usage: dict,
            include_usage: bool) -> ReplayResponse:
    """The reply as an SSE stream: a role chunk, the text in pieces, the finish chunk, [usage], [DONE]."""
    def event(delta: dict, finish_reason: str | None = None, with_usage: bool = False) -> bytes:
        chunk = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                 "system_fingerprint": "replay",
                 "choices": [] if with_usage else [{"index": 0, "delta": delta, "logprobs": None,
                                                    "finish_reason": finish_reason}]}
        if with_usage:
            chunk["usage"] = usage
        elif include_usage:
            chunk["usage"] = None
        return b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"

    chunks = [event({"role": "assistant", "content": ""})]
    chunks += [event({"content": text[i:i + STREAM_CHUNK_CHARS]}) for i in range(0, len(text), STREAM_CHUNK_CHARS)]
    chunks.append(event({}, finish))
    if include_usage:
        chunks.append(event({}, with_usage=True))
    chunks.append(b"data: [DONE]\n\n")
    return ReplayResponse(200, {"content-type": "text/event-stream", "cache-control": "no-cache"}, chunks)


# ------------------------------------------------------------------------------------------------------ transports
class ReplayAsyncTransport(httpx.AsyncBaseTransport):
    """httpx async transport answering from a ReplayStore in-process (optional fixed latency per request)."""

    def __init__(self, store: ReplayStore, latency_s: float = 0.0):
        self.store = store
        self.latency_s = float(latency_s)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        r = handle_request(self.store, request.method, request.url.path, body)
        return httpx.Response(r.status, headers=r.headers, content=r.body, request=request)


class ReplaySyncTransport(httpx.BaseTransport):
    """Blocking twin of ReplayAsyncTransport (for `openai.OpenAI` / `httpx.Client`)."""

    def __init__(self, store: ReplayStore, latency_s: float = 0.0):
        self.store = store
        self.latency_s = float(latency_s)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        r = handle_request(self.store, request.method, request.url.path, body)
        return httpx.Response(r.status, headers=r.headers, content=r.body, request=request)


def replay_transport(store: ReplayStore, latency_s: float = 0.0) -> httpx.AsyncBaseTransport:
    return ReplayAsyncTransport(store, latency_s)


def replay_sync_transport(store: ReplayStore, latency_s: float = 0.0) -> httpx.BaseTransport:
    return ReplaySyncTransport(store, latency_s)


REPLAY_BASE_URL = "http://replay.invalid/v1"  # never resolved: the transport answers in-process


# ---------------------------------------------------------------------------------------------- loopback server
def replay_app(store: ReplayStore, latency_s: float = 0.0):
    """The replay API as a Starlette ASGI app (SSE streamed chunk by chunk)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    async def endpoint(request: Request):
        body = await request.body()
        if latency_s > 0:
            await asyncio.sleep(latency_s)
        r = handle_request(store, request.method, request.url.path, body)
        if r.headers.get("content-type") == "text/event-stream":
            async def gen() -> Any:
                for c in r.chunks:
                    yield c
            return StreamingResponse(gen(), status_code=r.status, headers=r.headers)
        return Response(r.body, status_code=r.status, headers=r.headers)

    return Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST", "PUT", "DELETE"])])


class ReplayServer(LoopbackServer):
    """The replay API on a loopback uvicorn server in a daemon thread; `.base_url` ends in /v1."""

    def __init__(self, app, host: str, port: int, start_timeout_s: float = 15.0):
        super().__init__(app, host, port, lifespan="off", name="replay-server", start_timeout_s=start_timeout_s)


def serve(store: ReplayStore, host: str = "127.0.0.1", port: int = 0, latency_s: float = 0.0) -> ReplayServer:
    """Serve the replay API over HTTP on (host, port); port 0 picks a free one. Returns the running server."""
    return ReplayServer(replay_app(store, latency_s), host, port)

