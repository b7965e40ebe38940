"""The agent pool and response collection (no network of its own: it is handed `openai.AsyncOpenAI` clients).

- `AgentSpec`, `load_agents(path, pool_name)`: agents of a pool in `config/agents.yaml`, priced from
  `config/prices.yaml`.
- `CollectionSettings`: generation + transport settings; `.hash()` covers only what changes an answer.
- `call_once(client, agent, prompt, settings)`: one logical call with retries; never raises for provider or
  transport failures (they become `status="error"` fields with an `error_kind`).
- `collect(...)`: the calls of (tasks x agents x repetition) missing from a `CallLog`, bounded concurrency per
  provider, each finished call appended (group-committed, fsync'ed) at once, graded rows returned; a progress
  line with rate and ETA every 10 s.
- `preflight(...)`: 20 calls per agent checking the agent is usable before a paid collection.

Secrets: the client's `api_key` is scrubbed from every error message this module records or logs.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import email.utils
import hashlib
import json
import logging
import random
import re
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from pipeline.calls import CallLog, call_key
from pipeline.errors import RouterLiteError
from pipeline.grading import GRADERS, grade, is_empty
from pipeline.progress import RateLog
from pipeline.replay import approx_tokens
from pipeline.secrets import mask

log = logging.getLogger(__name__)

# error kinds recorded in the call log
RETRYABLE_KINDS = {"rate_limit", "server_error", "timeout", "connection", "bad_response"}
ERROR_KINDS = RETRYABLE_KINDS | {"not_found", "auth", "payment", "bad_request", "client_error"}


# ------------------------------------------------------------------------------------------------------- agents
@dataclasses.dataclass(frozen=True)
class AgentSpec:
    name: str
    model: str
    provider: str
    base_url: str | None
    price_in_per_mtok: float
    price_out_per_mtok: float
    role: str = ""

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.price_in_per_mtok + completion_tokens * self.price_out_per_mtok) / 1e6


def _read_yaml(path: Path, what: str) -> dict:
    if not path.exists():
        raise RouterLiteError(f"{what} file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise RouterLiteError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise RouterLiteError(f"{path}: expected a mapping at the top level")
    return raw


def load_prices(path: str | Path) -> dict[str, dict]:
    """`models:` of a prices file: model id -> {input, output, ...} (USD per million tokens)."""
    path = Path(path)
    models = _read_yaml(path, "prices").get("models")
    if not isinstance(models, dict):
        raise RouterLiteError(f"{path}: needs a `models:` mapping of model id -> {{input, output}}")
    return models


def load_agents(path: str | Path, pool_name: str, prices_path: str | Path | None = None,
                only: Iterable[str] | None = None) -> list[AgentSpec]:
    """Agents of pool `pool_name` in the agents file `path` (config/agents.yaml).

    A pool is `{provider, base_url, extends?, agents: [{name, model, role, provider?, base_url?, price_in_per_mtok?,
    price_out_per_mtok?}]}`; `extends: other_pool` prepends that pool's agents. Prices not given on the agent come
    from the prices file (`prices:` in the agents file, relative to it; default prices.yaml beside it).
    `only` keeps the named agents (in pool order). Unknown pool/agent, empty pool, duplicate names, missing prices
    raise RouterLiteError naming them.
    """
    path = Path(path)
    raw = _read_yaml(path, "agents")
    pools = raw.get("pools")
    if not isinstance(pools, dict) or not pools:
        raise RouterLiteError(f"{path}: needs a non-empty `pools:` mapping")
    if prices_path is None:
        prices_path = path.parent / str(raw.get("prices", "prices.yaml"))
    prices: dict[str, dict] | None = None

    def resolve(name: str, chain: tuple[str, ...]) -> list[AgentSpec]:
        nonlocal prices
        if name not in pools:
            raise RouterLiteError(f"unknown pool {name!r} in {path}; known pools: {', '.join(sorted(pools))}")
        if name in chain:
            raise RouterLiteError(f"{path}: pool {name!r} extends itself ({' -> '.join(chain + (name,))})")
        pool = pools[name] or {}
        if not isinstance(pool, dict):
            raise RouterLiteError(f"{path}: pool {name!r} must be a mapping")
        out = resolve(pool["extends"], chain + (name,)) if pool.get("extends") else []
        entries = pool.get("agents") or []
        if not isinstance(entries, list):
            raise RouterLiteError(f"{path}: pool {name!r}: `agents` must be a list")
        for i, a in enumerate(entries):
            if not isinstance(a, dict) or not a.get("name") or not a.get("model"):
                raise RouterLiteError(f"{path}: pool {name!r} agent #{i} needs `name` and `model`: {a!r}")
            provider = a.get("provider", pool.get("provider"))
            if not provider:
                raise RouterLiteError(f"{path}: pool {name!r} agent {a['name']!r} has no provider")
            p_in, p_out = a.get("price_in_per_mtok"), a.get("price_out_per_mtok")
            if p_in is None or p_out is None:
                if prices is None:
                    prices = load_prices(prices_path)
                entry = prices.get(a["model"])
                if not isinstance(entry, dict) or entry.get("input") is None or entry.get("output") is None:
                    raise RouterLiteError(f"no price for model {a['model']!r} (pool {name!r}, agent {a['name']!r}) "
                                          f"in {prices_path}")
                p_in = entry["input"] if p_in is None else p_in
                p_out = entry["output"] if p_out is None else p_out
            try:
                p_in, p_out = float(p_in), float(p_out)
            except (TypeError, ValueError):
                raise RouterLiteError(f"{path}: agent {a['name']!r}: prices must be numbers") from None
            out.append(AgentSpec(name=str(a["name"]), model=str(a["model"]), provider=str(provider),
                                 base_url=a.get("base_url", pool.get("base_url")), price_in_per_mtok=p_in,
                                 price_out_per_mtok=p_out, role=str(a.get("role", ""))))
        return out

    agents = resolve(pool_name, ())
    if not agents:
        raise RouterLiteError(f"pool {pool_name!r} in {path} has no agents")
    dup = sorted(n for n, c in collections.Counter(a.name for a in agents).items() if c > 1)
    if dup:
        raise RouterLiteError(f"pool {pool_name!r} in {path}: duplicate agent name(s) {dup}")
    if only is not None:
        agents = select_agents(agents, only, pool_name)
    return agents


def select_agents(agents: list[AgentSpec], names: Iterable[str], pool_name: str = "") -> list[AgentSpec]:
    names = list(names)
    known = {a.name for a in agents}
    unknown = [n for n in names if n not in known]
    if unknown:
        where = f" in pool {pool_name!r}" if pool_name else ""
        raise RouterLiteError(f"unknown agent(s) {unknown}{where}; known agents: {', '.join(sorted(known))}")
    if not names:
        raise RouterLiteError(f"empty agent selection{' for pool ' + repr(pool_name) if pool_name else ''}")
    return [a for a in agents if a.name in set(names)]


# ----------------------------------------------------------------------------------------------------- settings
@dataclasses.dataclass(frozen=True)
class CollectionSettings:
    """How one call is made (the call settings of a profile's `collection:` section; pycma style: option = default,
    meaning). Only the answer-changing ones (``ANSWER_FIELDS``) enter the settings hash of every call key, so
    timeouts, retries and concurrency can change without invalidating a call log.

    max_tokens = 4096
        Completion token cap sent with every call (answer-changing).
    temperature = 0.1
        Sampling temperature (answer-changing).
    top_p = 1.0
        Nucleus sampling mass (answer-changing).
    reasoning_effort = "minimal"
        Sent as ``extra_body={"reasoning": {"effort": ...}}`` (OpenRouter); None sends nothing (answer-changing).
    timeout_s = 180.0
        Seconds one attempt may take.
    max_retries = 3
        Retries after the first attempt of a failed call, with jittered exponential backoff.
    concurrency = 16
        Calls in flight per provider.
    backoff_base_s = 1.0
        Attempt k waits ``backoff_base_s * 2**k`` seconds (jittered), capped at ``backoff_max_s``.
    backoff_max_s = 60.0
        The longest backoff between attempts.
    max_retry_after_s = 120.0
        A longer Retry-After is not waited for: the call is recorded as ``rate_limit``.
    """

    max_tokens: int = 4096
    temperature: float = 0.1
    top_p: float = 1.0
    reasoning_effort: str | None = "minimal"  # sent as extra_body={"reasoning": {"effort": ...}} (OpenRouter)
    timeout_s: float = 180.0
    max_retries: int = 3  # retries after the first attempt
    concurrency: int = 16  # in-flight calls per provider
    backoff_base_s: float = 1.0  # attempt k waits backoff_base_s * 2**k (jittered), capped at backoff_max_s
    backoff_max_s: float = 60.0
    max_retry_after_s: float = 120.0  # a longer Retry-After is not waited for: the call is recorded as rate_limit

    # fields that change what a model answers: the settings hash in every call key
    ANSWER_FIELDS = ("max_tokens", "temperature", "top_p", "reasoning_effort")

    def __post_init__(self) -> None:
        if int(self.max_tokens) < 1:
            raise RouterLiteError(f"collection setting max_tokens={self.max_tokens!r} must be >= 1")
        if int(self.concurrency) < 1:
            raise RouterLiteError(f"collection setting concurrency={self.concurrency!r} must be >= 1")
        if int(self.max_retries) < 0:
            raise RouterLiteError(f"collection setting max_retries={self.max_retries!r} must be >= 0")
        if float(self.timeout_s) <= 0:
            raise RouterLiteError(f"collection setting timeout_s={self.timeout_s!r} must be > 0")

    def hash(self) -> str:
        """12 hex of the answer-changing fields (timeouts, retries, concurrency do not invalidate the log)."""
        payload = {f: getattr(self, f) for f in self.ANSWER_FIELDS}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]

    @classmethod
    def from_dict(cls, d: dict | None) -> CollectionSettings:
        """From a profile's `collection:` section (`repetitions` is ignored: it is not a call setting)."""
        d = {k: v for k, v in (d or {}).items() if k != "repetitions"}
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise RouterLiteError(f"unknown collection setting(s) {unknown}; known: {', '.join(sorted(fields))}")
        return cls(**d)


# ------------------------------------------------------------------------------------------------- one call
def scrub(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Remove secrets (and any bearer token) from a message that will be recorded or logged."""
    text = mask(text, secrets)  # any case, and any run of 8+ characters of the key (pipeline/secrets.py)
    return re.sub(r"(?i)(bearer\s+)[^\s'\"]+", r"\1***", text)


def _retry_after_s(headers: Any) -> float | None:
    """Seconds from `retry-after-ms`, or `Retry-After` as seconds or an HTTP date; None if absent/invalid."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000.0)
    except (TypeError, ValueError):
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    value = str(value).strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _classify(exc: BaseException) -> tuple[str, float | None]:
    """(error_kind, retry_after_s) of an exception raised by the openai client."""
    import httpx
    import openai

    if isinstance(exc, (asyncio.TimeoutError, openai.APITimeoutError, httpx.TimeoutException)):
        return "timeout", None
    if isinstance(exc, (openai.APIConnectionError, httpx.TransportError)):
        return "connection", None
    if isinstance(exc, openai.APIStatusError):
        code = exc.status_code
        ra = _retry_after_s(getattr(exc.response, "headers", None))
        if code == 429:
            return "rate_limit", ra
        if code >= 500 or code in (408, 409, 425):
            return ("timeout" if code == 408 else "server_error"), ra
        if code in (401, 403):
            return "auth", None
        if code == 402:
            return "payment", None
        if code == 404:
            return "not_found", None
        if code in (400, 413, 422):
            return "bad_request", None
        return "client_error", None
    return "bad_response", None  # APIResponseValidationError, undecodable JSON, unexpected shapes


def _usage_int(usage: dict, name: str) -> int | None:
    v = usage.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        return None
    return int(v)


def _usage_cost(usage: dict) -> float | None:
    v = usage.get("cost")
    if v is None or isinstance(v, bool):
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if v >= 0 else None


def _parse_completion(data: Any) -> dict:
    """Fields of a chat.completion JSON body; raises ValueError when it is not a usable completion
    (no choices - e.g. OpenRouter's 200 with an `error` object -, no message, non-text content)."""
    if not isinstance(data, dict):
        raise ValueError(f"completion body is {type(data).__name__}, not an object")
    choices = data.get("choices")
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        err = data.get("error")
        raise ValueError(f"completion without choices{': ' + str(err)[:200] if err else ''}")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ValueError("completion choice without message")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise ValueError(f"message content is {type(content).__name__}, not text")
    usage = data.get("usage")
    return {"text": content, "finish_reason": choice.get("finish_reason"),
            "usage": usage if isinstance(usage, dict) else {}}


def _backoff(settings: CollectionSettings, attempt: int) -> float:
    base = min(settings.backoff_max_s, settings.backoff_base_s * (2 ** attempt))
    return base * (0.5 + random.random() / 2)  # jitter against synchronised retries


async def call_once(client: Any, agent: AgentSpec, prompt: str, settings: CollectionSettings) -> dict:
    """One logical call (first attempt + up to `settings.max_retries` retries).

    Retries on rate_limit, server_error, timeout, connection and bad_response, waiting Retry-After when the
    provider sends one (seconds or HTTP date; more than `max_retry_after_s` is not waited: the call ends as
    rate_limit), else exponential backoff with jitter. Returns the call fields:
    status (ok | empty | error), error_kind, error_message (secrets scrubbed), response_text, finish_reason,
    prompt_tokens, completion_tokens, usage_source ("provider" | "provider_estimate" = the provider's counts made by a
    stated estimate, e.g. the replay's ceil(characters/4) | "estimated" = approx_tokens of the texts here),
    cost_usd (the provider's `usage.cost` when given, e.g. OpenRouter; else agent prices x tokens),
    latency_ms (of the last attempt), attempts, model. Tokens and cost are None for errors.
    """
    import httpx

    secrets = [getattr(client, "api_key", None)]
    body = _request_body(agent, prompt, settings)
    # max_retries=0 per request: our loop owns retries.
    options = {"timeout": settings.timeout_s, "max_retries": 0}
    attempts = 0
    latency_ms = 0.0
    kind, message = "bad_response", ""
    while True:
        attempts += 1
        t0 = time.perf_counter()
        retry_after: float | None = None
        try:
            async with asyncio.timeout(settings.timeout_s + 5.0):  # belt and braces over the SDK timeout
                resp = await client.post("/chat/completions", body=body, cast_to=httpx.Response, options=options)
                try:
                    raw = await resp.aread()
                finally:
                    await resp.aclose()
            latency_ms = (time.perf_counter() - t0) * 1000.0
            fields = _parse_completion(json.loads(raw))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every provider/transport failure becomes an error row
            latency_ms = (time.perf_counter() - t0) * 1000.0
            kind, retry_after = _classify(exc)
            message = scrub(f"{type(exc).__name__}: {exc}", secrets)[:500]
        else:
            return _answered_row(agent, prompt, fields, latency_ms, attempts)
        retryable = kind in RETRYABLE_KINDS and attempts <= settings.max_retries
        if retryable and retry_after is not None and retry_after > settings.max_retry_after_s:
            message += f" (Retry-After {retry_after:.0f}s > {settings.max_retry_after_s:.0f}s: not waited)"
            retryable = False
        if not retryable:
            return _error_row(agent, kind, message, latency_ms, attempts)
        delay = retry_after if retry_after is not None else _backoff(settings, attempts - 1)
        log.debug("agent %s: %s on attempt %d, retrying in %.2fs", agent.name, kind, attempts, delay)
        await asyncio.sleep(delay)


def _request_body(agent: AgentSpec, prompt: str, settings: CollectionSettings) -> dict[str, Any]:
    """The body `client.chat.completions.create(..., extra_body={"reasoning": {"effort": ...}})` would send.

    call_once posts it through the client's documented low-level `post` (same auth, headers, base_url,
    status-error mapping) and reads the reply as JSON: this skips the SDK's per-call TypedDict transform and model
    construction (~25 % of the client CPU per call) and lets odd bodies (200 + `error`, missing usage, extra
    `usage.cost`) be judged as data."""
    body: dict[str, Any] = {
        "model": agent.model, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": int(settings.max_tokens), "temperature": settings.temperature, "top_p": settings.top_p,
    }
    if settings.reasoning_effort:
        body["reasoning"] = {"effort": settings.reasoning_effort}
    return body


def _answered_row(agent: AgentSpec, prompt: str, fields: dict, latency_ms: float, attempts: int) -> dict:
    """The call fields of an answered call: tokens from the provider's usage (else estimated), cost from
    `usage.cost` (else the agent's prices)."""
    text = fields["text"]
    usage = fields["usage"]
    pt, ct = _usage_int(usage, "prompt_tokens"), _usage_int(usage, "completion_tokens")
    source = "provider_estimate" if usage.get("token_count_method") else "provider"  # replay: estimates
    if pt is None or ct is None:
        source = "estimated"
        pt = approx_tokens(prompt) if pt is None else pt
        ct = approx_tokens(text) if ct is None else ct
    cost = _usage_cost(usage)
    if cost is None:
        cost = agent.cost(pt, ct)
    return {
        "model": agent.model, "status": "empty" if is_empty(text) else "ok", "error_kind": "",
        "error_message": "", "response_text": text or "", "finish_reason": fields["finish_reason"] or "",
        "prompt_tokens": pt, "completion_tokens": ct, "usage_source": source, "cost_usd": float(cost),
        "latency_ms": round(latency_ms, 1), "attempts": attempts,
    }


def _error_row(agent: AgentSpec, kind: str, message: str, latency_ms: float, attempts: int) -> dict:
    return {
        "model": agent.model, "status": "error", "error_kind": kind, "error_message": message,
        "response_text": None, "finish_reason": "", "prompt_tokens": None, "completion_tokens": None,
        "usage_source": "", "cost_usd": None, "latency_ms": round(latency_ms, 1), "attempts": attempts,
    }


# ------------------------------------------------------------------------------------------------- collection
GradeFn = Callable[[Any, str, str], tuple]
TASK_COLUMNS = ("task_id", "prompt", "gold", "grader")


def _check_tasks(tasks_df: pd.DataFrame) -> None:
    missing = [c for c in TASK_COLUMNS if c not in tasks_df.columns]
    if missing:
        raise RouterLiteError(f"tasks frame lacks column(s) {missing} (has {list(tasks_df.columns)})")
    dup = tasks_df["task_id"][tasks_df["task_id"].duplicated()].unique().tolist()
    if dup:
        raise RouterLiteError(f"duplicate task_id(s) in tasks frame: {dup[:5]}")
    bad = [t for t, p in zip(tasks_df["task_id"], tasks_df["prompt"]) if not isinstance(p, str) or not p.strip()]
    if bad:
        raise RouterLiteError(f"task(s) without a prompt: {bad[:5]}")
    graders = set(tasks_df["grader"]) - set(GRADERS)
    if graders:
        raise RouterLiteError(f"unknown grader(s) {sorted(map(str, graders))} in tasks frame; known: {', '.join(GRADERS)}")


def _check_agents(agents: list[AgentSpec]) -> None:
    if not agents:
        raise RouterLiteError("empty agent pool: nothing to collect")
    dup = sorted(n for n, c in collections.Counter(a.name for a in agents).items() if c > 1)
    if dup:
        raise RouterLiteError(f"duplicate agent name(s) {dup}")


class _GroupCommit:
    """Appends rows to a CallLog from a background task: all rows waiting are written with one fsync per file;
    `write(row)` returns once its row is on disk."""

    def __init__(self, call_log: CallLog):
        self.call_log = call_log
        self.pending: list[tuple[dict, asyncio.Future]] = []
        self.wake = asyncio.Event()
        self.closed = False

    async def write(self, row: dict) -> None:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((row, fut))
        self.wake.set()
        await fut

    def close(self) -> None:
        self.closed = True
        self.wake.set()

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            batch, self.pending = self.pending, []
            if batch:
                try:
                    await asyncio.to_thread(self.call_log.append_many, [r for r, _ in batch])
                except BaseException as exc:  # noqa: BLE001 - hand the failure to every waiting writer
                    for _, f in batch:
                        if not f.done():
                            f.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                for _, f in batch:
                    if not f.done():
                        f.set_result(None)
            elif self.closed:
                return


async def _close_clients(clients: dict) -> None:
    for c in {id(c): c for c in clients.values()}.values():
        close = getattr(c, "close", None)
        if close is not None:
            try:
                res = close()
                if asyncio.iscoroutine(res):
                    await res
            except Exception:  # noqa: BLE001 - closing is best effort
                pass


async def collect(tasks_df: pd.DataFrame, agents: list[AgentSpec], repetition: int, call_log: CallLog,
                  client_for: Callable[[AgentSpec], Any], settings: CollectionSettings | None = None,
                  grade_fn: GradeFn | None = None) -> pd.DataFrame:
    """Make the calls of (tasks x agents x `repetition`) missing from `call_log`; return all of them, graded.

    `tasks_df` needs task_id, prompt, gold, grader. Done = a row with status ok or empty in the log; error rows are
    logged but retried by the next collection. At most `settings.concurrency` calls are in flight per provider.
    Each finished call is graded (`grade_fn(text, gold, grader) -> (extracted, correct)`, default
    `pipeline.grading.grade`; errors are not graded: correct None) and appended to the log before the next call of
    that worker starts. `client_for(agent)` is called once per agent before any call (so a missing key fails first);
    the clients are closed at the end. Returns one row per call key (CALL_FIELDS columns), in task x agent order.
    """
    settings = settings or CollectionSettings()
    grade_fn = grade_fn or grade
    _check_tasks(tasks_df)
    _check_agents(agents)
    sh = settings.hash()
    clients = {a.name: client_for(a) for a in agents}
    done = call_log.keys()
    tasks = tasks_df[list(TASK_COLUMNS)].to_dict("records")
    wanted, queues = _call_queues(tasks, agents, repetition, sh, done)
    n_todo = sum(len(q) for q in queues.values())
    log.info("collect: %d calls wanted, %d already done, %d to make", len(wanted), len(wanted) - n_todo, n_todo)
    counts: collections.Counter = collections.Counter()
    committer = _GroupCommit(call_log)
    progress = RateLog("collect", "calls", log.info, every_s=10.0)  # rate + ETA, in the Dagster step log too

    async def worker(queue: collections.deque) -> None:
        while queue:
            k, a, t = queue.popleft()
            fields = await call_once(clients[a.name], a, t["prompt"], settings)
            await committer.write(_graded_row(k, a, t, repetition, sh, fields, grade_fn))
            counts[fields["status"]] += 1
            progress(sum(counts.values()), n_todo)

    try:
        async with asyncio.TaskGroup() as tg:
            commit_task = tg.create_task(committer.run())
            async with asyncio.TaskGroup() as workers:
                for q in queues.values():
                    for _ in range(min(settings.concurrency, len(q))):
                        workers.create_task(worker(q))
            committer.close()
            await commit_task
    finally:
        await _close_clients(clients)
    log.info("collect: made %d calls (%s)", sum(counts.values()), dict(counts))
    latest = call_log.latest()
    order = {k: i for i, k in enumerate(wanted)}
    out = latest[latest["call_key"].isin(order)].copy()
    out["_order"] = out["call_key"].map(order)
    return out.sort_values("_order").drop(columns="_order").reset_index(drop=True)


def _call_queues(tasks: list[dict], agents: list[AgentSpec], repetition: int, sh: str, done):
    """(every wanted call key in task x agent order, per provider a queue of the (key, agent, task) not done)."""
    wanted: list[str] = []
    queues: dict[str, collections.deque] = collections.defaultdict(collections.deque)
    for t in tasks:
        for a in agents:
            k = call_key(a.name, str(t["task_id"]), repetition, sh)
            wanted.append(k)
            if k not in done:
                queues[a.provider].append((k, a, t))
    return wanted, queues


def _graded_row(k: str, a: AgentSpec, t: dict, repetition: int, sh: str, fields: dict, grade_fn: GradeFn) -> dict:
    """The call-log row of one finished call, graded (errors are not graded; an empty reply is not correct)."""
    if fields["status"] == "error":
        extracted, correct = None, None
    else:
        extracted, correct = grade_fn(fields["response_text"], str(t["gold"]), t["grader"])
        correct = bool(correct) if fields["status"] == "ok" else False
    return {"call_key": k, "agent": a.name, "model": a.model, "task_id": str(t["task_id"]),
            "repetition": int(repetition), "settings_hash": sh, "status": fields["status"],
            "error_kind": fields["error_kind"], "response_text": fields["response_text"],
            "extracted": extracted, "correct": correct, "prompt_tokens": fields["prompt_tokens"],
            "completion_tokens": fields["completion_tokens"], "cost_usd": fields["cost_usd"],
            "latency_ms": fields["latency_ms"], "finish_reason": fields["finish_reason"],
            "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "attempts": fields["attempts"], "error_message": fields["error_message"],
            "usage_source": fields["usage_source"]}


# -------------------------------------------------------------------------------------------------- preflight
PREFLIGHT_CALLS = 20
PREFLIGHT_MAX_EMPTY_RATE = 0.05
USABLE_USAGE = ("provider", "provider_estimate")  # token counts the provider returned (replay: by a stated method)
ESTIMATED_USAGE = ("provider_estimate", "estimated")  # costs from these counts are estimates, and say so


async def preflight_async(client_for: Callable[[AgentSpec], Any], agents: list[AgentSpec], prompts: list[str],
                          settings: CollectionSettings | None = None, n_calls: int = PREFLIGHT_CALLS) -> pd.DataFrame:
    settings = settings or CollectionSettings()
    _check_agents(agents)
    prompts = [p for p in prompts if isinstance(p, str) and p.strip()]
    if not prompts:
        raise RouterLiteError("preflight needs at least one non-empty prompt")
    chosen = [prompts[i % len(prompts)] for i in range(n_calls)]
    sems: dict[str, asyncio.Semaphore] = collections.defaultdict(lambda: asyncio.Semaphore(settings.concurrency))
    clients = {a.name: client_for(a) for a in agents}

    async def one(a: AgentSpec, p: str) -> dict:
        async with sems[a.provider]:
            return await call_once(clients[a.name], a, p, settings)

    rows = []
    try:
        results = await asyncio.gather(*[asyncio.gather(*[one(a, p) for p in chosen]) for a in agents])
    finally:
        await _close_clients(clients)
    for a, calls in zip(agents, results):
        n = len(calls)
        errors = [c for c in calls if c["status"] == "error"]
        answered = [c for c in calls if c["status"] != "error"]
        n_empty = sum(c["status"] == "empty" for c in calls)
        max_ct = max((c["completion_tokens"] or 0 for c in answered), default=0)
        no_usage = sum(c["usage_source"] not in USABLE_USAGE or not c["prompt_tokens"] for c in answered)
        reasons = []
        if errors:
            kinds = collections.Counter(c["error_kind"] for c in errors)
            reasons.append(f"{len(errors)}/{n} calls failed ({', '.join(f'{k}: {v}' for k, v in kinds.items())}; "
                           f"first: {errors[0]['error_message'][:160]})")
        if max_ct > settings.max_tokens:
            reasons.append(f"max_tokens not respected: {max_ct} completion tokens > {settings.max_tokens}")
        if no_usage:
            reasons.append(f"{no_usage}/{len(answered)} responses lack usable usage token counts")
        empty_rate = n_empty / n if n else 1.0
        if empty_rate >= PREFLIGHT_MAX_EMPTY_RATE:
            reasons.append(f"empty-rate {empty_rate:.0%} >= {PREFLIGHT_MAX_EMPTY_RATE:.0%}")
        rows.append({
            "agent": a.name, "model": a.model, "provider": a.provider, "n_calls": n,
            "n_ok": sum(c["status"] == "ok" for c in calls), "n_empty": n_empty, "n_error": len(errors),
            "empty_rate": empty_rate, "max_completion_tokens": max_ct,
            "mean_latency_ms": float(sum(c["latency_ms"] for c in calls) / n) if n else 0.0,
            "cost_usd": float(sum(c["cost_usd"] or 0.0 for c in answered)),
            "passed": not reasons, "reason": "; ".join(reasons) if reasons else "ok",
        })
    return pd.DataFrame(rows)


def run_sync(coro):
    """Run a coroutine from synchronous code: its own event loop, in a helper thread inside a running loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()


def preflight(client_for: Callable[[AgentSpec], Any], agents: list[AgentSpec], prompts: list[str],
              settings: CollectionSettings | None = None, n_calls: int = PREFLIGHT_CALLS) -> pd.DataFrame:
    """Per agent: `n_calls` (20) calls; passed when every call returned a valid completion, max_tokens was
    respected, usage token counts were reported, and the empty-rate is < 5 %. Columns: agent, model, provider,
    n_calls, n_ok, n_empty, n_error, empty_rate, max_completion_tokens, mean_latency_ms, cost_usd, passed, reason.
    Runs its own event loop (in a helper thread when called from inside a running loop)."""
    return run_sync(preflight_async(client_for, agents, prompts, settings, n_calls))


def run_collect(*args: Any, **kwargs: Any) -> pd.DataFrame:
    """`collect` from synchronous code (its own event loop; a helper thread inside a running loop)."""
    return run_sync(collect(*args, **kwargs))
