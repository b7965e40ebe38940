"""The provider key: sent only to the provider it belongs to (OpenRouter over https, or a host
the profile lists in pool.key_hosts), and scrubbed from recorded errors in any case and as any run of 8+ of its
characters (a truncated or re-cased echo)."""
import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.collect.agents import AgentSpec
from pipeline.collect.client import call_once, scrub
from pipeline.collect.settings import CollectionSettings
from pipeline.core.errors import RouterLiteError
from resources.pool import PoolResource

KEY = "sk-or-v1-0123456789abcdefABCDEF0123456789"
AGENT = AgentSpec("x", "m/x", "local", None, 0.0, 0.0)


@pytest.fixture
def echo_server():
    """A loopback endpoint that records each request's Authorization header and answers 401 with a body echoing the
    bearer token re-cased and cut (as some providers do)."""
    seen = []

    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("content-length", 0)))
            auth = self.headers.get("authorization", "")
            seen.append(auth)
            token = auth.split(" ", 1)[-1]
            body = json.dumps({"error": {"message": f"invalid key {token.upper()} (prefix {token[:12]}...)"}})
            self.send_response(401)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1", seen
    srv.shutdown()


def _call(pool):
    settings = CollectionSettings(max_retries=0, timeout_s=10)
    return asyncio.run(call_once(pool.client_for(AGENT), AGENT, "hi", settings))


def test_key_is_not_sent_to_an_unlisted_openai_compatible_host(echo_server, monkeypatch):
    url, seen = echo_server
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    _call(PoolResource(kind="openai_compatible", base_url=url))
    assert seen and all(KEY not in h for h in seen), seen  # before: "Bearer sk-or-v1-..."
    assert seen[0] == "Bearer not-needed"


def test_listed_host_gets_the_key_and_echoes_are_scrubbed(echo_server, monkeypatch):
    url, seen = echo_server
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    fields = _call(PoolResource(kind="openai_compatible", base_url=url, key_hosts=["127.0.0.1"]))
    assert seen[-1] == f"Bearer {KEY}"
    msg = fields["error_message"]
    assert fields["status"] == "error" and "invalid key" in msg
    assert KEY.upper() not in msg and KEY[:12] not in msg and KEY.upper()[:8] not in msg, msg


def test_openrouter_pool_refuses_a_foreign_base_url(monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    for url in ("https://evil.example/api/v1", "http://openrouter.ai/api/v1", "https://openrouter.ai.evil.example/v1"):
        pool = PoolResource(kind="openrouter", pool="pilot", base_url=url)
        with pytest.raises(RouterLiteError, match="is not https://openrouter.ai; .* pool.key_hosts"):
            pool.check()
        with pytest.raises(RouterLiteError, match="is not https://openrouter.ai"):
            pool.client_for(pool.agents()[0])
    ok = PoolResource(kind="openrouter", pool="pilot", base_url="https://evil.example/api/v1",
                      key_hosts=["evil.example"])
    ok.check()
    assert ok.client_for(ok.agents()[0]).api_key == KEY
    assert PoolResource(kind="openrouter", pool="pilot").client_for(AGENT).api_key == KEY


def test_scrub_covers_any_case_and_any_8_character_run():
    for echo in (KEY, KEY.upper(), KEY.lower(), KEY[:8], KEY[:20] + "...", KEY[5:17], "…" + KEY[-9:]):
        out = scrub(f"error: key {echo} rejected", [KEY])
        assert out.startswith("error: key ") and out.endswith(" rejected"), out
        for n in range(8, len(KEY) + 1):  # no run of 8+ key characters survives, in any case
            for i in range(len(KEY) - n + 1):
                assert KEY[i:i + n].lower() not in out.lower(), (echo, out)
    assert scrub("the sk-or-v1 prefix alone is 9 chars", [KEY]) == "the *** prefix alone is 9 chars"
    assert scrub("short sk-or-v run of 7", [KEY]) == "short sk-or-v run of 7"  # 7 characters: left alone
    assert scrub("Key ABCD and abcd", ["abcd"]) == "Key *** and ***"  # short keys: whole, any case
