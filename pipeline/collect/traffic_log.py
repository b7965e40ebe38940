"""A day of the served traffic log, read: the lines `router-lite serve` appends (the contract: docs/tasks.md, "Traffic
as a source"), validated line by line and joined into one `TrafficRequest` per request id.

The log is append-only and written line by line, so a reader can meet a torn last line (a write under way, a crash):
a file's last line without its newline is skipped and counted (`DayLog.torn`), never parsed (the next read, once the
line is whole, takes it). A whole line that is no JSON, or breaks the contract, is skipped and counted with its place
(`DayLog.unreadable`): the file keeps it, nothing is rewritten. The fields are read with pydantic, unknown fields
allowed (a newer writer may add some).
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pydantic

LOG_VERSION = 1


class Call(pydantic.BaseModel):
    """One agent's call (CALL in the contract): its reply or its error."""

    model_config = pydantic.ConfigDict(extra="allow")
    agent: str
    model: str
    reply: str | None = None
    cost_usd: float | None = None
    latency_ms: float | None = None
    finish_reason: str | None = None
    error: str | None = None


class Message(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    role: str
    content: str


class Decision(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    agent: str | None = None  # None: no agent replied (a 502: the calls say why)
    policy: str
    ood: bool = False
    format: str | None = None


class Line(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    v: Literal[1]
    record: Literal["request", "exploration"]
    request_id: str = pydantic.Field(min_length=1)
    ts: str
    day: str


class RequestLine(Line):
    record: Literal["request"]
    router: str
    target: str | None = None
    pool: list[str]
    agent_models: dict[str, str] = {}
    routed_text: str
    messages: list[Message] = pydantic.Field(min_length=1)
    conversation_hash: str
    decision: Decision
    calls: list[Call]
    explore: bool = False


class ExplorationLine(Line):
    record: Literal["exploration"]
    calls: list[Call]
    complete: bool = False
    usd: float = 0.0


_LINE = pydantic.TypeAdapter(RequestLine | ExplorationLine)


@dataclass
class TrafficRequest:
    """One request with every call made for it: the decision's, then the exploration's (first call per agent)."""

    request: RequestLine
    explorations: list[ExplorationLine] = field(default_factory=list)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def calls(self) -> list[tuple[Call, str]]:
        """(call, "decision" | "exploration"), one per agent, in the order they were made."""
        seen, out = set(), []
        for calls, by in [(self.request.calls, "decision"), *((e.calls, "exploration") for e in self.explorations)]:
            for c in calls:
                if c.agent not in seen:
                    seen.add(c.agent)
                    out.append((c, by))
        return out

    @property
    def explored(self) -> bool:
        """Every agent of the router's pool replied (a reply, no error): a full row, every agent on one prompt."""
        replied = {c.agent for c, _ in self.calls if c.error is None and c.reply is not None}
        return set(self.request.pool) <= replied


@dataclass
class DayLog:
    """What one day's files held: the joined requests, and what was skipped and why."""

    requests: list[TrafficRequest]
    lines: int = 0  # whole lines read
    torn: int = 0  # a file's last line without its newline: skipped, counted
    unreadable: list[str] = field(default_factory=list)  # "<file>:<line>: why", skipped
    orphans: int = 0  # exploration lines whose request line is not in the day
    duplicates: int = 0  # request lines repeating an id already read


def _read_file(path: Path, log: DayLog) -> Iterable[RequestLine | ExplorationLine]:
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the file ends with a newline: every line is whole
    elif lines:
        lines.pop()  # the last line has no newline yet: torn (a write under way or cut short)
        log.torn += 1
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        log.lines += 1
        try:
            yield _LINE.validate_python(json.loads(raw.decode("utf-8")))
        except (ValueError, pydantic.ValidationError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            why = str(exc).splitlines()[0][:160]
            log.unreadable.append(f"{path.name}:{i}: {why}")


def read_day(files: Iterable[Path]) -> DayLog:
    """The requests of one day's log files (sorted by name: one file per writing process), each joined with its
    exploration lines by request id, in the order the request lines were read."""
    log = DayLog(requests=[])
    by_id: dict[str, TrafficRequest] = {}
    explorations: list[ExplorationLine] = []
    for path in sorted(files):
        for line in _read_file(Path(path), log):
            if isinstance(line, ExplorationLine):
                explorations.append(line)
            elif line.request_id in by_id:
                log.duplicates += 1
            else:
                by_id[line.request_id] = TrafficRequest(line)
                log.requests.append(by_id[line.request_id])
    for e in explorations:  # an exploration may sit in another worker's file than its request
        if e.request_id in by_id:
            by_id[e.request_id].explorations.append(e)
        else:
            log.orphans += 1
    return log
