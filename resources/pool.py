"""The agent pool as a Dagster resource: which agents, and an `openai.AsyncOpenAI` client per agent.

kind:
- `replay` (default): the in-process replay of real recorded outputs (`pipeline.collect.replay`), no network, no key.
- `openrouter`: https://openrouter.ai/api/v1 (or `base_url`), key from `api_key` or else the environment variable
  named by `api_key_env` (default: the kind's, `OPENROUTER_API_KEY`), read when a client is made - never when the
  resource is built, so the assets that do not call the pool (the task pool, `agent_pool`, the rewards, the head)
  run without a key.
  A missing key fails in `check()` / `client_for` - before any call - with one `MissingKeyError` naming
  OPENROUTER_API_KEY; `check(needed_by=ASSET)` / `require_key(ASSET)` name the asset (or command) that needs it.
- `openai_compatible`: any OpenAI-protocol endpoint at `base_url` (e.g. `pipeline.collect.replay.serve`, vLLM); the key
  is optional (`api_key`, else the env var named by `api_key_env` when set, else a dummy).

The key goes only to the provider it belongs to: OpenRouter's host (https://openrouter.ai), or a host listed in
`key_hosts` (profile `pool.key_hosts`, e.g. `[llm.internal.example:8443]`). An `openrouter` pool whose base URL points
elsewhere fails in `check()`; an `openai_compatible` endpoint on an unlisted host gets a dummy key, never the real one.

Each kind is one `PoolKind` row of `POOL_KINDS`: a client factory `(resource, agent) -> openai.AsyncOpenAI`, an
optional pre-flight check `(resource, agents)`, and the attributes the rest of the code asks of a kind instead of
testing its name (free or live, recorded prompts only, its key's variable and host, its pre-flight prompts);
`register_pool_kind` adds one (docs/architecture.md, "How to add an agent pool").

The clients have `max_retries=0`: `pipeline.collect.client.call_once` owns retries. The key is never logged, printed,
put in metadata, the call log, or exception text (`repr` hides it; `call_once` scrubs it from recorded errors).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import httpx
from dagster import ConfigurableResource
from pydantic import Field, PrivateAttr

from pipeline import profile
from pipeline.collect.agents import AgentSpec, load_agents
from pipeline.collect.preflight import PREFLIGHT_CALLS
from pipeline.core.errors import RouterLiteError
from pipeline.core.tables import Table

OPENROUTER_URL = "https://openrouter.ai/api/v1"
OPENROUTER_HOST = "openrouter.ai"
OPENROUTER_KEY_ENV = "OPENROUTER_API_KEY"


class _ReleasingStream(httpx.AsyncByteStream):
    """A response body that gives its shard's in-flight slot back when closed (once)."""

    def __init__(self, inner: Any, load: list[int], shard: int):
        self._inner, self._load, self._shard, self._done = inner, load, shard, False

    async def __aiter__(self):
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if not self._done:
                self._done = True
                self._load[self._shard] -= 1


class ShardedTransport(httpx.AsyncBaseTransport):
    """An httpx async transport spreading requests over several small connection pools (least in-flight first).

    httpcore scans every connection of a pool (with a readability syscall per idle one) on each request and each
    release, so the client CPU per call grows with the pool size: measured here, one pool at 128 in flight costs
    ~15 ms CPU per call against ~3 ms for 16 pools. Each shard opens connections only as it needs them.
    """

    def __init__(self, shards: int = 16, per_shard: int = 16, **transport_kwargs: Any):
        limits = httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard)
        if "verify" not in transport_kwargs:  # one TLS context for all shards (each costs ~10-50 ms to build)
            transport_kwargs["verify"] = httpx.create_ssl_context()
        self._shards = [httpx.AsyncHTTPTransport(limits=limits, **transport_kwargs) for _ in range(shards)]
        self._load = [0] * shards

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        load = self._load
        i = min(range(len(load)), key=load.__getitem__)
        load[i] += 1
        try:
            response = await self._shards[i].handle_async_request(request)
        except BaseException:
            load[i] -= 1
            raise
        response.stream = _ReleasingStream(response.stream, load, i)
        return response

    async def aclose(self) -> None:
        for t in self._shards:
            await t.aclose()


_PROXY_ENV = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy")


def http_client(timeout_s: float = 180.0, max_connections: int = 256) -> httpx.AsyncClient:
    """The httpx.AsyncClient behind every live client: pools of 16 connections (ShardedTransport), up to
    `max_connections` in all. With a proxy in the environment, a plain client (httpx honours the proxy variables
    only for its own transport)."""
    timeout = httpx.Timeout(timeout_s, connect=min(30.0, timeout_s))
    if any(os.environ.get(v) for v in _PROXY_ENV):
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=min(64, max_connections))
        return httpx.AsyncClient(timeout=timeout, limits=limits)
    shards = max(1, -(-int(max_connections) // 16))
    return httpx.AsyncClient(transport=ShardedTransport(shards, 16), timeout=timeout)


def default_agents_file() -> Path:
    env = os.environ.get("ROUTER_LITE_CONFIG")
    base = Path(env) if env else Path(__file__).resolve().parents[1] / "config"
    return base / "agents.yaml"


class MissingKeyError(RouterLiteError):
    """The pool needs an API key and the environment has none: `env` names the variable."""

    def __init__(self, message: str, env: str = OPENROUTER_KEY_ENV):
        super().__init__(message)
        self.env = env


def missing_key_message(env: str, needed_by: str, pool: str, kind: str) -> str:
    """One line naming the variable and what needs it."""
    return (f"{needed_by} needs the {env} environment variable, which is not set (pool {pool!r} of kind {kind!r} "
            f"calls the provider)")


class PoolResource(ConfigurableResource):
    """Agents of `pool` in `agents_file` and their clients (see module doc for `kind`)."""

    kind: str = "replay"
    pool: str = "demo"
    agents_file: str = ""  # default: config/agents.yaml ($ROUTER_LITE_CONFIG/agents.yaml when set)
    base_url: str | None = None
    api_key: str | None = Field(default=None, repr=False)
    # the variable the key is read from when api_key is not set; None: the kind's (`PoolKind.key_env`), "": none
    api_key_env: str | None = None
    # hosts (host or host:port) besides openrouter.ai that may receive the key
    key_hosts: list[str] = Field(default_factory=list)
    replay_path: str | None = None  # default: data/replay/mmlu_pro_outputs.parquet under $ROUTER_LITE_DATA|data/
    timeout_s: float = 180.0
    app_title: str = "BenchGen Router Lite"  # OpenRouter attribution header (X-Title)
    max_connections: int = 256  # per client (= per agent); collection concurrency is bounded per provider anyway

    _store: Any = PrivateAttr(default=None)

    def __repr__(self) -> str:  # never show the key
        return (f"PoolResource(kind={self.kind!r}, pool={self.pool!r}, base_url={self.base_url!r}, "
                f"api_key={'<set>' if self.api_key else None})")

    __str__ = __repr__

    # ------------------------------------------------------------------------------------------------- agents
    def agents(self, only: list[str] | None = None) -> list[AgentSpec]:
        path = Path(self.agents_file) if self.agents_file else default_agents_file()
        return load_agents(path, self.pool, only=only)

    def setup_for_execution(self, context) -> None:  # dagster hook: a bad setting fails at resource init
        self.check_setup()  # a missing key does not: only the assets that call the pool need one (`require_key`)

    # ------------------------------------------------------------------------------------------------- checks
    def spec(self) -> PoolKind:
        """This pool's kind (an unknown kind -> one error listing the known ones)."""
        return pool_kind(self.kind)

    def key_env(self) -> str | None:
        """The environment variable the key is read from: `api_key_env`, else the kind's (None: no key)."""
        env = self.api_key_env if self.api_key_env is not None else self.spec().key_env
        return env or None

    def _key(self) -> str | None:
        if self.api_key:
            return self.api_key
        env = self.key_env()
        return (os.environ.get(env) or None) if env else None

    def key_allowed(self, base_url: str | None) -> bool:
        """May a request to `base_url` carry the key? The host the kind's key belongs to (`PoolKind.key_host`,
        OpenRouter's) over https, or a host the profile lists."""
        try:
            url = httpx.URL(base_url or "")
        except Exception:  # noqa: BLE001 - an unparsable URL gets no key
            return False
        host = (url.host or "").lower()
        spec = POOL_KINDS.get(self.kind)
        if spec is not None and spec.key_host and host == spec.key_host.lower() and url.scheme == "https":
            return True
        listed = {h.strip().lower() for h in self.key_hosts if h and h.strip()}
        return bool(host) and (host in listed or (url.port is not None and f"{host}:{url.port}" in listed))

    def _base_url(self, agent: AgentSpec | None) -> str | None:
        return self.base_url or (agent.base_url if agent else None) or self.spec().default_base_url

    def check(self, agents: list[AgentSpec] | None = None, needed_by: str | None = None) -> None:
        """Fail before any call: unknown kind, missing key (a kind that needs one), the kind's own check (missing
        base_url, unrecorded replay model). `needed_by` (an asset or command) is named in the missing-key message."""
        spec = self.spec()
        try:
            if spec.key_required and not self._key():
                env = self.key_env() or spec.key_env
                raise MissingKeyError(f"pool kind {self.kind!r} needs an API key: set the {env} environment "
                                      f"variable", env)
            if spec.check is not None:
                spec.check(self, agents)
        except MissingKeyError as exc:
            if needed_by is None:
                raise
            # a plain RouterLiteError: what `router-lite run` and the Dagster step show as the user's one line
            raise RouterLiteError(missing_key_message(exc.env, needed_by, self.pool, self.kind)) from None
        self.check_key_hosts(agents)

    def check_setup(self, agents: list[AgentSpec] | None = None) -> None:
        """`check` without the key: what every asset using the pool needs (listing agents, reading the rewards)."""
        try:
            self.check(agents)
        except MissingKeyError:
            self.check_key_hosts(agents)

    def require_key(self, needed_by: str) -> None:
        """`needed_by` (an asset or command) calls the pool: fail now, naming it, when the key is missing."""
        self.check(needed_by=needed_by)

    def check_key_hosts(self, agents: list[AgentSpec] | None = None) -> None:
        """A pool of a kind that needs its key (`PoolKind.key_required`, openrouter) sends it with every request:
        each base URL must be one that may see it."""
        spec = self.spec()
        if spec.key_required:
            for a in agents or [None]:
                url = self._base_url(a)
                if not self.key_allowed(url):
                    raise RouterLiteError(
                        f"pool kind {self.kind!r}{f' agent {a.name}' if a else ''}: base URL {url} is not "
                        f"https://{spec.key_host}; the {self.key_env() or spec.key_env} key is sent only there or to "
                        f"a host listed in the profile's pool.key_hosts")

    def store(self):
        """The replay recordings (loaded once per resource instance)."""
        from pipeline.collect.replay import ReplayStore

        if self._store is None:
            self._store = ReplayStore.load(self.replay_path)
        return self._store

    # ------------------------------------------------------------------------------------------------ clients
    def client_for(self, agent: AgentSpec):
        """A fresh `openai.AsyncOpenAI` for `agent` (max_retries=0; `collect` closes it when done)."""
        self.check()
        self.check_key_hosts([agent])
        return self.spec().client(self, agent)


# ------------------------------------------------------------------------------------------------ pool kinds
LIVE_PREFLIGHT_PROMPT = "What is 2 + 2? Reply with the number only."  # the pre-flight prompt of a live pool


@dataclass(frozen=True)
class PoolKind:
    """One kind of agent pool: `client(resource, agent)` makes the agent's `openai.AsyncOpenAI` (max_retries=0);
    `check(resource, agents)` (optional) fails before any call when the resource cannot work (no URL...).

    What the rest of the code asks of a kind, by attribute (never by its name):
    - `free`: calls cost nothing (replay): the benchmark, which calls the routed agents, refreshes by itself after a
      collection (assets/automation.py); a live kind's benchmark runs by hand only.
    - `recorded_only`: the pool answers only prompts recorded in the replay store (pipeline/collect/replay.py): the
      task pool keeps the recorded tasks and the pre-flight asks recorded train prompts (`preflight_prompts`).
    - `key_env`: the environment variable its key is read from (None: no key); `key_required`: a missing key fails
      before any call, and every base URL must be one that may see the key; `key_host`: the host the key belongs
      to (over https it may see it; other hosts only when the profile's `pool.key_hosts` lists them).
    - `default_base_url`: the endpoint when neither the profile nor the agent names one.
    """

    name: str
    client: Callable[[PoolResource, AgentSpec], Any]
    check: Callable[[PoolResource, list[AgentSpec] | None], None] | None = None
    description: str = ""
    free: bool = False
    recorded_only: bool = False
    key_env: str | None = None
    key_required: bool = False
    key_host: str | None = None
    default_base_url: str | None = None

    def __post_init__(self):
        if self.key_required and not self.key_env:
            raise RouterLiteError(f"pool kind {self.name!r}: key_required needs key_env (the key's variable)")

    def preflight_prompts(self, task_pool) -> list[str]:
        """What the pre-flight asks each agent: a recorded-only pool the first `PREFLIGHT_CALLS` train prompts of
        the task pool (it answers nothing else); a live one the fixed arithmetic prompt."""
        if self.recorded_only:
            return task_pool[task_pool["split"] == "train"]["prompt"].head(PREFLIGHT_CALLS).tolist()
        return [LIVE_PREFLIGHT_PROMPT]


def _timeout(res: PoolResource) -> httpx.Timeout:
    return httpx.Timeout(res.timeout_s, connect=min(30.0, res.timeout_s))


def _replay_client(res: PoolResource, agent: AgentSpec):
    import openai

    from pipeline.collect.replay import REPLAY_BASE_URL, replay_transport

    http = httpx.AsyncClient(transport=replay_transport(res.store()), timeout=_timeout(res))
    return openai.AsyncOpenAI(api_key="replay", base_url=REPLAY_BASE_URL, http_client=http, max_retries=0,
                              timeout=_timeout(res))


def _http_client(res: PoolResource, agent: AgentSpec, headers: dict[str, str] | None = None):
    """openai_compatible (and openrouter's, with its headers): the agent's base URL; the key only where it may go."""
    import openai

    base_url = res._base_url(agent)
    key = res._key() if res.key_allowed(base_url) else None  # never the key to a host it is not for
    http = http_client(res.timeout_s, res.max_connections)
    return openai.AsyncOpenAI(api_key=key or "not-needed", base_url=base_url, http_client=http,
                              max_retries=0, timeout=_timeout(res), default_headers=headers or None)


def _openrouter_client(res: PoolResource, agent: AgentSpec):
    """`_http_client` with OpenRouter's attribution header (X-Title)."""
    return _http_client(res, agent, {"X-Title": res.app_title})


def _check_replay(res: PoolResource, agents: list[AgentSpec] | None) -> None:
    if agents:
        store = res.store()
        missing = [f"{a.name} ({a.model})" for a in agents if not store.has_model(a.model)]
        if missing:
            raise RouterLiteError(f"pool {res.pool!r}: agent(s) {missing} have no replay recordings in "
                                  f"{store.source}; recorded models: {', '.join(store.models())}")


def _check_openai_compatible(res: PoolResource, agents: list[AgentSpec] | None) -> None:
    if not res.base_url:
        raise RouterLiteError("pool kind 'openai_compatible' needs `base_url` (e.g. http://127.0.0.1:8000/v1)")


def _sync_profile_kinds(table: Table[PoolKind]) -> None:
    """Profiles check `pool.kind` against `pipeline.profile.POOL_KINDS` (names only: pipeline/ has no clients)."""
    profile.POOL_KINDS[:] = list(table)


POOL_KINDS: Table[PoolKind] = Table("pool kind", {k.name: k for k in [
    PoolKind("replay", _replay_client, _check_replay, "recorded real outputs, in process; no network, no key",
             free=True, recorded_only=True),
    PoolKind("openrouter", _openrouter_client, None, "OpenRouter; key from OPENROUTER_API_KEY",
             key_env=OPENROUTER_KEY_ENV, key_required=True, key_host=OPENROUTER_HOST, default_base_url=OPENROUTER_URL),
    PoolKind("openai_compatible", _http_client, _check_openai_compatible,
             "any OpenAI-protocol endpoint at base_url (vLLM, pipeline.collect.replay.serve); key optional",
             key_env=OPENROUTER_KEY_ENV, key_host=OPENROUTER_HOST),
]}, on_change=_sync_profile_kinds)
KINDS = POOL_KINDS.keys()  # a live view: a registered kind is known everywhere that checks names


def pool_kind(kind: str) -> PoolKind:
    """The row of `kind`; an unknown kind -> one error listing the known ones."""
    return POOL_KINDS.lookup(kind)


def register_pool_kind(kind: str, client: Callable[[PoolResource, AgentSpec], Any],
                       check: Callable[[PoolResource, list[AgentSpec] | None], None] | None = None,
                       description: str = "", replace: bool = False, **attributes: Any) -> PoolKind:
    """Add a pool kind (profiles may then say `pool: {kind: NAME}`); `attributes`: the other `PoolKind` fields
    (`free`, `recorded_only`, `key_env`, `key_required`, `key_host`, `default_base_url`; a live kind without a key
    by default). A name already taken -> error unless `replace`."""
    if not callable(client):
        raise RouterLiteError(f"register_pool_kind needs a client factory, got {client!r} for kind {kind!r}")
    known = {f.name for f in fields(PoolKind)} - {"name", "client", "check", "description"}
    unknown = sorted(set(attributes) - known)
    if unknown:
        raise RouterLiteError(f"register_pool_kind {kind!r}: unknown attribute(s) {', '.join(unknown)}")
    return POOL_KINDS.register(kind, PoolKind(kind, client, check, description, **attributes), replace=replace)


def pool_kinds_restored() -> AbstractContextManager[Table[PoolKind]]:
    """The pool-kind table as it was on entry, restored on exit (tests that register toy kinds)."""
    return POOL_KINDS.restored()
