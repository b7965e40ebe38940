"""What a reply cost, for the client keys' spend (`ReplyMeter`, pipeline/serve/auth.py): what the app recorded in
the request's `ChatRequest.answer` (`cost_usd` = the body's `usage.cost` = the header `X-Router-Cost-Usd`) by the
time the response starts; for a streamed prompt-routed reply, which the app relays byte for byte before its cost is
known, the stream's own last `usage` and its content priced as the app prices a whole reply (`reply_usage`). A
response that never started, or whose client left (499), is charged the request's worst case: its calls may have
been paid and their cost is unknown; any other response without a cost (a 4xx, a failed agent) costs nothing."""
from __future__ import annotations

import json

from pipeline.collect.client import reply_usage
from pipeline.serve.relay import DISCONNECTED


class ReplyMeter:
    """What the reply cost, read from the response as it goes out: `send` wraps the ASGI send; `cost(worst_case)`
    once the response is over."""

    def __init__(self, send, state: dict, chat):
        # state: the request's state (scope["state"]), whose `served` the app sets to the router that answers;
        # chat: the request's ChatRequest
        self.send_, self.state, self.chat = send, state, chat
        self.status, self.paid, self.stream = None, None, None

    async def send(self, message) -> None:
        if message["type"] == "http.response.start":
            self.status, answer = message["status"], self.chat.answer
            self.paid = answer.cost_usd
            if self.status == 200 and self.paid is None and answer.agent is not None and self.chat.stream:
                spec = next(s for s in self.state["served"].specs if s.name == answer.agent)
                self.stream = StreamCost(spec, self.chat.upstream)  # a relayed stream: priced as it goes
        elif message["type"] == "http.response.body" and self.stream is not None:
            self.stream.feed(message.get("body", b""))
        await self.send_(message)

    def cost(self, worst_case: float) -> float:
        if self.stream is not None:
            return self.stream.cost()
        if self.paid is not None:
            return self.paid
        return worst_case if self.status in (None, DISCONNECTED) else 0.0


class StreamCost:
    """A relayed SSE stream's cost: its last `usage` (the agent's, `cost` included when it reports one) and its
    content, priced by `reply_usage` as the app prices a whole reply."""

    def __init__(self, spec, upstream: dict):
        self.spec, self.upstream = spec, upstream
        self.buf, self.parts, self.usage = b"", [], None
        self.finish_reason, self.error = None, None  # the traffic log's (pipeline/serve/traffic.py)

    def feed(self, chunk: bytes) -> None:
        self.buf = (self.buf + chunk).replace(b"\r\n", b"\n")
        while True:
            event, sep, rest = self.buf.partition(b"\n\n")
            if not sep:
                return
            self.buf = rest
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    self._data(line[5:].strip())

    def _data(self, payload: bytes) -> None:
        try:
            obj = json.loads(payload)
        except ValueError:
            return
        if not isinstance(obj, dict):
            return
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        if isinstance(obj.get("error"), dict):  # the relay's event of a stream that broke (relay.py)
            self.error = str(obj["error"].get("message"))[:1000]
        choices = obj.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            if isinstance(choices[0].get("finish_reason"), str):
                self.finish_reason = choices[0]["finish_reason"]
            delta = choices[0].get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                self.parts.append(delta["content"])

    def cost(self) -> float:
        return reply_usage(self.spec, self.upstream, {"usage": self.usage or {}}, "".join(self.parts))["cost"]
