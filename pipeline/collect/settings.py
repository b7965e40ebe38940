"""`CollectionSettings`: how one call is made (generation + transport); `.hash()` covers only what changes an answer,
so changing timeouts, retries or concurrency never invalidates a call log."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Annotated

from pydantic import Field

from pipeline.core.config import Int, Number, check_fields
from pipeline.core.errors import RouterLiteError

MAX_TOKENS_BOUND = 131072


@dataclasses.dataclass(frozen=True)
class CollectionSettings:
    """How one call is made (the call settings of a profile's `collection:` section; pycma style: option = default,
    meaning). Only the answer-changing ones (``ANSWER_FIELDS``) enter the settings hash of every call key, so
    timeouts, retries and concurrency can change without invalidating a call log.

    max_tokens = 4096
        Completion token cap sent with every call (answer-changing); 1 to 131,072.
    temperature = 0.1
        Sampling temperature (answer-changing); 0 to 2.
    top_p = 1.0
        Nucleus sampling mass (answer-changing); 0 to 1.
    reasoning_effort = "minimal"
        Sent as ``extra_body={"reasoning": {"effort": ...}}`` (OpenRouter); None sends nothing (answer-changing).
    timeout_s = 180.0
        Seconds one attempt may take (> 0).
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
    grading_budget_ms = 250.0
        Wall time one sympy evaluation of a reply (an extraction or a comparison) may take: past it the grading
        worker is killed and the reply has no answer (pipeline/collect/bounded.py); 1 to 600,000. Also the default
        of ``serve`` / ``train --grading-budget-ms``.
    grading_max_chars = 32768
        Text cap: a longer reply is graded on its last this-many characters; 1,000 to 10,000,000.
    """

    max_tokens: Annotated[Int, Field(ge=1, le=MAX_TOKENS_BOUND)] = 4096
    temperature: Annotated[Number, Field(ge=0, le=2)] = 0.1
    top_p: Annotated[Number, Field(ge=0, le=1)] = 1.0
    reasoning_effort: str | None = "minimal"  # sent as extra_body={"reasoning": {"effort": ...}} (OpenRouter)
    timeout_s: Annotated[Number, Field(gt=0)] = 180.0
    max_retries: Annotated[Int, Field(ge=0)] = 3  # retries after the first attempt
    concurrency: Annotated[Int, Field(ge=1)] = 16  # in-flight calls per provider
    backoff_base_s: Number = 1.0  # attempt k waits backoff_base_s * 2**k (jittered), capped at backoff_max_s
    backoff_max_s: Number = 60.0
    max_retry_after_s: Number = 120.0  # a longer Retry-After is not waited for: the call is recorded as rate_limit
    grading_budget_ms: Number = 250.0  # one sympy evaluation of a reply; past it: no answer (collect/bounded.py)
    grading_max_chars: Int = 32768  # a longer reply is graded on its last this-many characters

    # fields that change what a model answers: the settings hash in every call key
    ANSWER_FIELDS = ("max_tokens", "temperature", "top_p", "reasoning_effort")

    def __post_init__(self) -> None:
        check_fields(self, "collection")  # built in code too (a profile's nan would fail every request later)
        from pipeline.collect.bounded import Budget

        try:
            Budget(self.grading_budget_ms, self.grading_max_chars)
        except RouterLiteError as exc:
            raise RouterLiteError(f"collection.grading_budget_ms / grading_max_chars: {exc}") from None

    def hash(self) -> str:
        """12 hex of the answer-changing fields (timeouts, retries, concurrency do not invalidate the log)."""
        payload = {f: getattr(self, f) for f in self.ANSWER_FIELDS}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]
