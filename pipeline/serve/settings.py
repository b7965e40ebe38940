"""The endpoint's settings (`ServeSettings`): request limits, micro-batching, connection limits and the defaults
forwarded to the agents."""
from __future__ import annotations

import dataclasses

from pipeline.core.errors import RouterLiteError
from pipeline.core.http_server import guarded_h11
from pipeline.core.prompts import ROUTED_WINDOW

FORWARDED_PARAMS = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed", "stream",
                    "stream_options")
SEED_RANGE = (-(1 << 63), (1 << 63) - 1)  # a signed 64-bit integer, as providers take it


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """The endpoint's settings; the options `router-lite serve` takes (their defaults and help come from here; pycma
    style: option = default, meaning):

    max_body_bytes = 1048576
        Largest request body in bytes (1 MiB); a larger one gets 400 body_too_large.
    max_messages = 64
        Most messages in one request; more get 400.
    max_batch = 32
        Prompts per embedding batch (1: every prompt embedded alone, no batching).
    batch_wait_ms = 2.0
        How long a new prompt waits for others to batch with, in ms (0: no wait).
    max_connections = 1024
        Connections open at once; beyond, the oldest idle one is answered 429, else 503 with Retry-After
        (docs/serving.md, Limits).
    max_idle_per_client = 128
        Connections waiting for a request per client address (raise it behind a proxy: every client then has the
        proxy's address).
    reserved_connections = 64
        Slots idle connections never take: kept for requests with a complete head.
    drain_delay_s = 1.0
        After SIGTERM, how long the server keeps serving (and accepting) with /readyz at 503 before it stops
        accepting, finishes what it accepted and exits (behind a load balancer: its readiness probe period times its
        failure threshold).
    """

    max_body_bytes: int = 1 << 20
    max_messages: int = 64
    max_json_depth: int = 32  # nesting of the request body (messages with content parts need 5)
    max_tokens_cap: int = 32768  # the largest max_tokens / max_completion_tokens forwarded (the CLI: the profile's)
    embed_cache_size: int = 1024  # prompts whose routing decision is kept (0 = no cache)
    # word pieces the backbone embeds: a conversation's earlier user turns are routed on as far as they fit
    # (pipeline/core/prompts.py routed_text); build_app sets it from the backbone served
    routed_window: int = ROUTED_WINDOW
    max_batch: int = 32
    batch_wait_ms: float = 2.0
    upstream_timeout_s: float = 180.0
    header_timeout_s: float = 10.0  # a connection's request head must arrive within this (slowloris)
    body_timeout_s: float = 30.0  # ... and its body within this of the head
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this
    max_connections: int = 1024
    max_idle_per_client: int = 128
    reserved_connections: int = 64
    max_head_bytes: int = 16 * 1024  # request line + headers; more -> 431
    drain_delay_s: float = 1.0
    defaults: dict = dataclasses.field(default_factory=dict)  # forwarded params used when a request omits them
    default_target: str | None = None  # operating point when a request names none (pipeline/route/targets.py)
    default_grader: str | None = None  # a cascade's answer format when a request names none (None: prompt-only)
    metrics: bool = True  # GET /metrics and the series behind it (pipeline/serve/metrics.py)

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_messages", "max_batch", "max_json_depth", "max_tokens_cap",
                     "max_connections", "max_idle_per_client", "max_head_bytes", "routed_window"):
            if int(getattr(self, name)) < 1:
                raise RouterLiteError(f"serve setting {name}={getattr(self, name)!r} must be >= 1")
        for name in ("embed_cache_size", "reserved_connections"):
            if int(getattr(self, name)) < 0:
                raise RouterLiteError(f"serve setting {name}={getattr(self, name)!r} must be >= 0")
        if not 0 <= float(self.drain_delay_s) <= 3600:  # NaN too
            raise RouterLiteError(f"serve setting drain_delay_s={self.drain_delay_s!r} must lie in [0, 3600] seconds")
        if not 0 <= float(self.batch_wait_ms) <= 1000:
            raise RouterLiteError(f"serve setting batch_wait_ms={self.batch_wait_ms!r} must lie in [0, 1000]")
        for name in ("upstream_timeout_s", "header_timeout_s", "body_timeout_s", "keep_alive_s"):
            if float(getattr(self, name)) <= 0:
                raise RouterLiteError(f"serve setting {name}={getattr(self, name)!r} must be > 0")
        unknown = sorted(set(self.defaults) - set(FORWARDED_PARAMS) - {"reasoning"})
        if unknown:
            raise RouterLiteError(f"serve defaults {unknown} are not forwarded parameters; known: "
                                  f"{', '.join(FORWARDED_PARAMS + ('reasoning',))}")

    @classmethod
    def from_collection(cls, collection, **kw) -> ServeSettings:
        """Defaults from a `pipeline.collect.settings.CollectionSettings` (max_tokens, temperature, top_p, reasoning
        effort, timeout): agents answer under the settings their rewards were measured with."""
        defaults = {"max_tokens": int(collection.max_tokens), "temperature": collection.temperature,
                    "top_p": collection.top_p}
        if collection.reasoning_effort:
            defaults["reasoning"] = {"effort": collection.reasoning_effort}
        kw.setdefault("upstream_timeout_s", float(collection.timeout_s))
        kw.setdefault("max_tokens_cap", int(collection.max_tokens))
        return cls(defaults=defaults, **kw)

    def uvicorn_options(self) -> dict:
        """uvicorn.Config / uvicorn.run keyword arguments enforcing the connection limits."""
        return {"http": guarded_h11(self.header_timeout_s, self.body_timeout_s, self.max_connections,
                                    max_idle_per_client=self.max_idle_per_client,
                                    reserved=min(self.reserved_connections, self.max_connections - 1),
                                    max_head_bytes=self.max_head_bytes),
                "timeout_keep_alive": self.keep_alive_s, "h11_max_incomplete_event_size": self.max_head_bytes + 1}
