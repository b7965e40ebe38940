"""The attack suite of issue 20 (and the residues of issue 12): every row an attack on loopback or on files in a
temp dir, bounded in count, size and time, reproducible (fixed seeds, a synthetic head: no model, no network).

    python bench/attack.py            # every row: a held/failed table, exit 1 when a row failed
    python bench/attack.py --fast     # only the fast rows (those `make test` runs: tests/test_attack.py)
    python bench/attack.py --rows 1,2 # rows by number

A row holds when the attack gets the documented answer: one RouterLiteError line naming the bad input (file, key,
row), or the documented HTTP status, within its bounds. A row is a function raising AssertionError when it fails.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pipeline.core.environ import environ as env  # noqa: E402
from pipeline.core.errors import RouterLiteError  # noqa: E402


@dataclass(frozen=True)
class Row:
    number: int
    item: str  # issue 20 item (1..13, "n"), "12.x" / "25.x" for issues 12 and 25, or a topic ("degenerate")
    name: str
    fast: bool
    fn: Callable[[Path], str]


ROWS: list[Row] = []


def row(item: str, name: str, fast: bool = True):
    def add(fn):
        ROWS.append(Row(len(ROWS) + 1, item, name, fast, fn))
        return fn
    return add


def refused(fn, *must: str, max_len: int = 600) -> str:
    """fn() raises one RouterLiteError line holding every `must` string, at most `max_len` characters."""
    try:
        fn()
    except RouterLiteError as exc:
        msg = str(exc)
        assert "\n" not in msg, f"not one line: {msg[:300]!r}"
        assert len(msg) <= max_len, f"{len(msg)} characters: {msg[:200]!r}..."
        for m in must:
            assert m in msg, f"{m!r} not in {msg!r}"
        return msg
    raise AssertionError("accepted")


def cli(*argv: str) -> tuple[int, str]:
    """`router-lite ARGV` in process: (exit code, stderr)."""
    from cli.main import main

    err = io.StringIO()
    saved = dict(os.environ)  # `run --profile` exports the profile for Dagster's workers: not for the next row
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(list(argv))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return rc, err.getvalue()


@contextlib.contextmanager
def profile_text(tmp: Path, text: str | bytes, name: str = "demo"):
    """A copy of config/ whose profile `name` holds `text`, as ROUTER_LITE_CONFIG; yields the profile's path."""
    cfg = tmp / "config"
    if not cfg.exists():
        shutil.copytree(REPO / "config", cfg)
    path = cfg / "profiles" / f"{name}.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with env(ROUTER_LITE_CONFIG=str(cfg)):
        yield path


def demo_with(**collection) -> str:
    import yaml

    raw = yaml.safe_load((REPO / "config" / "profiles" / "demo.yaml").read_text())
    raw.setdefault("collection", {}).update(collection)
    return yaml.safe_dump(raw)


# ----------------------------------------------------------------------------------------------------- profiles
@row("3", "profile: billion-laughs YAML at an integer field")
def yaml_bomb(tmp: Path) -> str:
    from pipeline import profile
    from pipeline.core import config

    levels = ["  - &l0 [" + ", ".join(["lol"] * 9) + "]"]
    levels += [f"  - &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 9)]
    text = "collection:\n  concurrency:\n" + "\n".join(levels) + "\nsources: {zeroeval_gsm8k: {}}\n"
    t = time.perf_counter()
    with profile_text(tmp, text) as path:
        msg = refused(lambda: profile.load_profile("demo"), str(path), "aliases")
    bomb = ["lol"] * 9
    for _ in range(9):
        bomb = [bomb] * 9  # 9^10 strings once expanded, 10 lists in memory
    shown = config._what(bomb)  # the error path renders a cut value, never the whole graph
    assert len(shown) <= 80 and time.perf_counter() - t < 5
    return f"{len(text)} bytes refused in {time.perf_counter() - t:.2f}s: {msg[len(str(path)) + 2:][:60]}"


@row("5", "profile: temperature nan / 5 / -1, top_p 2 / inf, max_tokens 1e9")
def profile_bounds(tmp: Path) -> str:
    from pipeline import profile

    cases = [("temperature", float("nan")), ("temperature", 5), ("temperature", -1), ("top_p", 2),
             ("top_p", float("inf")), ("max_tokens", 10**9)]
    for key, value in cases:
        with profile_text(tmp, demo_with(**{key: value})) as path:
            refused(lambda: profile.load_profile("demo"), str(path), f"collection.{key}")
    return f"{len(cases)} values refused at load, each naming file and key"


@row("6", "profile: 50 MB file, 100,000-deep nesting, non-UTF-8 bytes")
def profile_size_depth_encoding(tmp: Path) -> str:
    from pipeline import profile

    t = time.perf_counter()
    with profile_text(tmp, b"description: '" + b"x" * (50 << 20) + b"'\n") as path:
        refused(lambda: profile.load_profile("demo"), str(path), "larger than")
    big_s = time.perf_counter() - t
    with profile_text(tmp, "train: " + "[" * 100_000 + "]" * 100_000 + "\n") as path:
        refused(lambda: profile.load_profile("demo"), str(path), "nested deeper")
    with profile_text(tmp, b"description: caf\xe9\n") as path:
        refused(lambda: profile.load_profile("demo"), str(path), "not UTF-8")
    assert big_s < 5, big_s
    return f"each one line; the 50 MB file refused in {big_s:.2f}s"


@row("7", "profile: --profile ../path, ROUTER_LITE_PROFILE=<path>, dagster.yaml as a profile")
def profile_traversal(tmp: Path) -> str:
    from pipeline import profile

    (tmp / "elsewhere").mkdir(exist_ok=True)
    shutil.copy(REPO / "config" / "profiles" / "demo.yaml", tmp / "elsewhere" / "name.yaml")
    rel = os.path.relpath(tmp / "elsewhere" / "name", REPO / "config" / "profiles")
    for name in (rel, str(tmp / "elsewhere" / "name"), "../../dagster"):
        refused(lambda name=name: profile.load_profile(name), "is not a profile name", "ROUTER_LITE_CONFIG")
        with env(ROUTER_LITE_PROFILE=name):
            refused(lambda: profile.load_profile(), "is not a profile name")
    rc, err = cli("run", "--profile", "../../dagster", "--upto", "source_tasks")
    assert rc == 2 and err.count("\n") == 1 and "is not a profile name" in err, (rc, err)
    return "names only; another config dir only through ROUTER_LITE_CONFIG"


# ------------------------------------------------------------------------------------------------ train inputs
def _train_files(tmp: Path, n: int = 60) -> tuple[Path, Path]:
    rewards = [{"task_id": f"t{i}", "agent_order": ["frontier_a", "frontier_b"], "mean_reward": [i % 2, 1 - i % 2]}
               for i in range(n)]
    tasks = [{"task_id": f"t{i}", "prompt": f"question {i}", "split": ("train", "validation", "test")[i % 3]}
             for i in range(n)]
    r, t = tmp / "rewards.jsonl", tmp / "tasks.jsonl"
    r.write_text("".join(json.dumps(x) + "\n" for x in rewards))
    t.write_text("".join(json.dumps(x) + "\n" for x in tasks))
    return r, t


def _train(tmp: Path, r: Path, t: Path) -> tuple[int, str]:
    return cli("train", "--rewards", str(r), "--tasks", str(t), "--out", str(tmp / "out"))


def _one_line(rc: int, err: str, *must: str, max_len: int = 600) -> str:
    assert rc == 2, (rc, err[-300:])
    assert err.count("\n") == 1 and len(err) <= max_len, f"{err.count(chr(10))} lines, {len(err)} chars"
    for m in must:
        assert m in err, (m, err)
    return err.strip()


def _duplicate_ids(tmp: Path, n: int) -> str:
    r, t = _train_files(tmp)
    line = json.dumps({"task_id": "t0", "agent_order": ["frontier_a", "frontier_b"], "mean_reward": [1, 0]}) + "\n"
    r.write_text(line * n)
    err = _one_line(*_train(tmp, r, t), "t0", f"{n:,} times", "in all")
    return f"{n:,} rows of one task_id: {len(err)}-character line"


@row("8", "train: 200,000 rows of one task_id (fast form of the 10^6 row)")
def train_duplicate_ids_fast(tmp: Path) -> str:
    return _duplicate_ids(tmp, 200_000)


@row("8", "train: 10^6 rows of one task_id", fast=False)
def train_duplicate_ids(tmp: Path) -> str:
    return _duplicate_ids(tmp, 1_000_000)


@row("11", "train: a split 'banana'; a CSV list column without separators")
def train_split_and_csv(tmp: Path) -> str:
    import pandas as pd

    r, t = _train_files(tmp)
    rows = [json.loads(x) for x in t.read_text().splitlines()]
    rows[4]["split"] = "banana"
    t.write_text("".join(json.dumps(x) + "\n" for x in rows))
    _one_line(*_train(tmp, r, t), "row 5", "'banana'", "train, validation, test")
    r2, t2 = _train_files(tmp)
    df = pd.read_json(r2, lines=True)
    df["agent_order"] = "['frontier_a' 'frontier_b']"  # numpy's print form: no comma
    df.to_csv(tmp / "rewards.csv", index=False)
    _one_line(*_train(tmp, tmp / "rewards.csv", t2), "agent_order", "without commas")
    return "both one line naming file, row and field"


# ----------------------------------------------------------------------------------------------- task sources
@row("12", "tasks: one question under two ids lands in two splits")
def task_pool_duplicate_prompts(tmp: Path) -> str:
    import pandas as pd

    from pipeline.tasks.task_pool import TaskPoolConfig, build_task_pool, cross_split_duplicates

    n = 300
    tasks = pd.DataFrame({
        "task_id": [f"src/test/{i:06d}" for i in range(n)], "source": "src",
        "prompt": [f"What is {i % 100} + 1?" for i in range(n)],  # every question three times
        "gold": "1", "grader": "integer", "domain": ["math", "knowledge", "reasoning"] * (n // 3),
        "difficulty": ["easy", "medium", "hard"] * (n // 3), "category": "c"})
    cfg = TaskPoolConfig(size=90, balance="category", stratify_column="category")
    pool = build_task_pool(tasks, cfg)
    leak = cross_split_duplicates(pool)
    assert leak.empty, f"{len(leak)} tasks share a prompt across splits"
    assert pool["prompt"].is_unique
    from assets.tasks import task_pool_no_cross_split_prompts

    spec = next(iter(task_pool_no_cross_split_prompts.check_specs))
    assert spec.blocking
    return f"{n} rows of 100 questions -> pool of {len(pool)} distinct prompts; blocking check {spec.name}"


# ------------------------------------------------------------------------------------------------- registry
@functools.lru_cache(maxsize=1)
def _world_files() -> Path:
    """A registered synthetic head with operating points (two clusters, an expensive and a cheap agent)."""
    import numpy as np
    import pandas as pd

    from pipeline.route import registry
    from pipeline.route.fit import fit_router
    from pipeline.route.train import TrainConfig

    root = Path(tempfile.mkdtemp(prefix="attack-world-"))
    rng = np.random.default_rng(1)
    n, d = 300, 8
    cluster = rng.random(n) < 0.5
    centres = np.zeros((2, d))
    centres[0, 0], centres[1, 1] = 3, 3
    X = (centres[cluster.astype(int)] + rng.normal(0, 0.3, (n, d))).astype(np.float32)
    R = np.column_stack([np.ones(n), (~cluster).astype(float)])
    C = np.tile([0.02, 0.001], (n, 1))
    names = ["expensive", "cheap"]
    rewards = pd.DataFrame({"task_id": [f"t{i}" for i in range(n)], "agent_order": [names] * n,
                            "mean_reward": list(R), "mean_cost": list(C)})
    split = pd.Series(np.array(["train", "validation", "test"])[np.arange(n) % 5 % 3])
    fit = fit_router(X, rewards, split, TrainConfig(generations=2, log_every=0), labels=np.where(cluster, "A", "B"))
    path = registry.register(root / "registry", fit.head, registry.PromptFit(fit.guard, fit.best_single, fit.scorer,
                                                                             fit.cost_scorer, fit.operating_points),
                             backbone={"id": "synthetic", "key": "synthetic", "dim": d},
                             agents=[{"name": a, "model": a} for a in names], training={}, data_hashes={},
                             metrics=fit.metrics)
    np.save(root / "X.npy", X)
    return path


def _head_copy(tmp: Path) -> Path:
    dst = tmp / "head"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(_world_files(), dst)
    return dst


def _edit_manifest(head: Path, edit) -> None:
    m = json.loads((head / "manifest.json").read_text())
    edit(m)
    (head / "manifest.json").write_text(json.dumps(m))


@row("9", "registry: operating_points missing / not an object / string lambda (route, serve start-up)")
def tampered_operating_points(tmp: Path) -> str:
    from pipeline.route import registry

    edits = {
        "not an object": lambda m: m.__setitem__("operating_points", "fast"),
        "no points": lambda m: m["operating_points"].pop("points"),
        "empty points": lambda m: m["operating_points"].__setitem__("points", []),
        "string lambda": lambda m: m["operating_points"]["points"][1].__setitem__("lambda", "0.5"),
        "short agent_cost": lambda m: m["operating_points"].__setitem__("agent_cost", [1.0]),
    }
    for edit in edits.values():
        head = _head_copy(tmp)
        _edit_manifest(head, edit)
        refused(lambda head=head: registry.load(head), "manifest.json", "operating_points")
        _one_line(*cli("route", "--head", str(head), "--target", "parity", "What is 2 + 2?"), "operating_points")
    head = _head_copy(tmp)
    _edit_manifest(head, lambda m: m.pop("operating_points"))
    reg = registry.load(head)
    refused(lambda: reg.resolve_target("parity"), "no operating points")
    return f"{len(edits)} tamperings: one line at load; a missing path serves max-quality only"


@row("10", "registry: head.safetensors a symlink out of the head dir, files.weights absent")
def weights_symlink_default_name(tmp: Path) -> str:
    from pipeline.route import registry

    head = _head_copy(tmp)
    outside = tmp / "outside.safetensors"
    shutil.move(head / "head.safetensors", outside)
    os.symlink(outside, head / "head.safetensors")
    _edit_manifest(head, lambda m: m["files"].pop("weights"))
    refused(lambda: registry.load(head), "head.safetensors", "symlink")
    return "refused: every file the loader opens is a plain file of the entry directory"


# --------------------------------------------------------------------------------------------------- call log
@row("13", "call log: a garbage line in the middle; --quarantine-bad-log-lines")
def call_log_garbage(tmp: Path) -> str:
    from pipeline.collect.call_log import CallLog

    d = tmp / "calls"
    with CallLog(d) as log:
        for i in range(5):
            log.append({"call_key": f"a|t{i}|0|h", "agent": "a", "status": "ok", "task_id": f"t{i}"})
    f = d / "a.jsonl"
    lines = f.read_text().splitlines(keepends=True)
    f.write_text("".join(lines[:2]) + "garbage {{{ not json\n" + "".join(lines[2:]))
    msg = refused(lambda: CallLog(d).keys(), f"{f}:3", "--quarantine-bad-log-lines")
    assert CallLog(d, quarantine=True).keys() == {f"a|t{i}|0|h" for i in range(5)}
    assert "garbage" in (d / "a.jsonl.quarantine").read_text() and CallLog(d).read().shape[0] == 5
    with CallLog(d, quarantine=True) as log:  # the writer appends to the rewritten file
        log.keys()
        log.append({"call_key": "a|t9|0|h", "agent": "a", "status": "ok", "task_id": "t9"})
    assert len(CallLog(d).keys()) == 6
    return f"one line naming {f.name}:3 ({len(msg)} chars); quarantined on request, the writer goes on"


# ----------------------------------------------------------------------------------------------------- server
class _Backbone:
    """Embeds "row 12" as X[12] (no model)."""

    def __init__(self, X):
        self.X, self.dim, self.key, self.model_id, self.device = X, X.shape[1], "synthetic", "synthetic", "cpu"

    def encode(self, texts):
        import numpy as np

        return np.stack([self.X[int(t.split()[-1]) % len(self.X)] for t in texts])


def _agent_client(agent):
    import httpx
    import openai

    def reply(request):
        return httpx.Response(200, json={"id": "x", "object": "chat.completion", "model": agent.model,
                                         "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                             "role": "assistant", "content": f"from {agent.model}"}}]})
    return openai.AsyncOpenAI(api_key="k", base_url="http://agents.test/v1", max_retries=0,
                              http_client=httpx.AsyncClient(transport=httpx.MockTransport(reply)))


@contextlib.contextmanager
def server(**settings):
    import numpy as np

    from pipeline.collect.agents import AgentSpec
    from pipeline.route import registry
    from pipeline.serve.app import build_app
    from pipeline.serve.server import serve_in_thread
    from pipeline.serve.settings import ServeSettings

    path = _world_files()
    reg = registry.load(path)
    X = np.load(path.parent.parent / "X.npy")
    specs = [AgentSpec("expensive", "big-model", "test", None, 10.0, 30.0),
             AgentSpec("cheap", "small-model", "test", None, 0.1, 0.3)]
    app = build_app(reg, _Backbone(X), specs, _agent_client, ServeSettings(**settings))
    with serve_in_thread(app) as srv:
        yield srv


def _chat(c, text: str = "row 3", **kw):
    return c.post("/chat/completions", json={"messages": [{"role": "user", "content": text}], **kw.pop("body", {})},
                  **kw)


@row("1", "server: one client holds 300 half-open sockets (cap 64); /healthz and chat still answer")
def connection_exhaustion(tmp: Path) -> str:
    import httpx

    socks = []
    with server(max_connections=64, max_idle_per_client=16, reserved_connections=8, header_timeout_s=20) as srv:
        try:
            for _ in range(300):
                s = socket.create_connection((srv.host, srv.port), timeout=5)
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # half a head, then silence
                socks.append(s)
            t = time.perf_counter()
            with httpx.Client(base_url=srv.base_url, timeout=10) as c:
                for _ in range(10):
                    assert httpx.get(srv.url + "/healthz", timeout=10).status_code == 200
                    assert _chat(c).status_code == 200
            took = time.perf_counter() - t
            open_ = sum(1 for s in socks if not _closed(s))
        finally:
            for s in socks:
                s.close()
    assert open_ <= 16, open_
    return f"20 good requests all 200 in {took:.2f}s; {open_} of the attacker's 300 sockets left open (bound 16)"


@row("1", "server: every slot serving a request -> 503 with Retry-After, not a reset")
def connection_full_is_503(tmp: Path) -> str:
    socks = []
    with server(max_connections=4, max_idle_per_client=4, reserved_connections=1, body_timeout_s=20) as srv:
        try:
            for _ in range(4):  # complete heads, bodies never sent: busy, not idle
                s = socket.create_connection((srv.host, srv.port), timeout=5)
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
                socks.append(s)
            time.sleep(0.2)
            s = socket.create_connection((srv.host, srv.port), timeout=5)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = _read_all(s)
            s.close()
        finally:
            for s in socks:
                s.close()
    assert reply.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in reply.lower(), reply[:200]
    return reply.split(b"\r\n")[0].decode()


def _closed(s: socket.socket) -> bool:
    """The server ended its side (a refusal it answered first, e.g. 429, is read through to the end)."""
    s.settimeout(0.05)
    try:
        while s.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def _read_all(s: socket.socket, limit: float = 5.0) -> bytes:
    s.settimeout(limit)
    out = b""
    with contextlib.suppress(OSError):
        while chunk := s.recv(65536):
            out += chunk
    return out


@row("2", "server: 20 distinct lambda= targets, then parity / quality>=0.98 / budget=0.5")
def target_table(tmp: Path) -> str:
    import httpx

    with server() as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        for i in range(20):
            r = _chat(c, headers={"X-Router-Target": f"lambda={i / 7:.4f}"})
            assert r.status_code == 200, r.text
        for t in ("parity", "quality>=0.98", "budget=0.5", "max-quality"):
            r = _chat(c, headers={"X-Router-Target": t})
            assert r.status_code == 200 and r.headers["x-router-target"] == t, (t, r.status_code, r.text[:200])
    return "every target resolves after 20 distinct ones (LRU of head views)"


@row("4", "server: 60 KB X-Router-Target header, 1 MB router_target, 20 KB path")
def huge_echo(tmp: Path) -> str:
    import httpx

    with server() as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        r = _chat(c, headers={"X-Router-Target": "x" * 60_000})
        assert r.status_code == 431 and len(r.content) < 1000, (r.status_code, len(r.content))
        r = _chat(c, body={"router_target": "y" * 1_000_000})  # under the 1 MiB body limit: the target is read
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_target" and len(r.content) < 1000, \
            (r.status_code, len(r.content))
        r = _chat(c, body={"router_target": "y" * (1 << 20)})  # over it: body_too_large, its body left unread
        assert r.status_code == 400 and len(r.content) < 1000, (r.status_code, len(r.content))
        r = c.get("/" + "z" * 20_000)
        assert r.status_code == 431 and len(r.content) < 1000, (r.status_code, len(r.content))
        r = c.get("/" + "z" * 8_000)
        assert r.status_code == 404 and len(r.content) < 1000, (r.status_code, len(r.content))
        ok = _chat(c, headers={"X-Filler": "f" * 15_000})
        assert ok.status_code == 200, ok.status_code  # a head under 16 KiB still passes
    return "head > 16 KiB -> 431; echoed values cut (replies < 1 kB)"


@row("n", "server: n = true / 2 / 1.0")
def n_not_one(tmp: Path) -> str:
    import httpx

    with server() as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        for n in (True, 2, 1.0, "1"):
            r = _chat(c, body={"n": n})
            assert r.status_code == 400 and r.json()["error"]["param"] == "n", (n, r.status_code)
        assert _chat(c, body={"n": 1}).status_code == 200
    return "400 invalid_value for every n but 1"


# ------------------------------------------------------------------------------------- issue 12 (last round)
@row("12.1", "server: a lone surrogate next to good requests")
def lone_surrogate(tmp: Path) -> str:
    import httpx

    with server() as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        r = c.post("/chat/completions", content=b'{"messages":[{"role":"user","content":"\\ud800 x"}]}',
                   headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_text"
        assert _chat(c).status_code == 200
    return "400 invalid_text; the next request 200"


@row("12.3", "server: JSON nested 100,000 deep; NaN; a 2 MB body")
def deep_json(tmp: Path) -> str:
    import httpx

    with server() as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        for body, code in ((b"[" * 100_000 + b"]" * 100_000, "json_too_deep"), (b'{"messages": NaN}', "invalid_json"),
                           (b"{" + b" " * (2 << 20) + b"}", "body_too_large")):
            r = c.post("/chat/completions", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400 and r.json()["error"]["code"] == code, (code, r.status_code)
    return "400 each"


@row("12.11", "server: max_tokens 1e23, seed 2^70")
def sampling_bounds(tmp: Path) -> str:
    import httpx

    with server() as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        for body in ({"max_tokens": 10**23}, {"seed": 2**70}, {"temperature": 3}):
            assert _chat(c, body=body).status_code == 400, body
    return "400 each"


@row("12.10", "server: slowloris: a partial head trickled a byte at a time is closed")
def slowloris(tmp: Path) -> str:
    with server(header_timeout_s=1.0) as srv:
        s = socket.create_connection((srv.host, srv.port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        t = time.perf_counter()
        closed = False
        while time.perf_counter() - t < 4 and not closed:
            time.sleep(0.2)
            try:
                s.sendall(b"a")
            except OSError:
                closed = True
            closed = closed or _closed(s)
        s.close()
    assert closed, "still open after 4 s"
    return f"closed after {time.perf_counter() - t:.1f}s (header timeout 1 s)"


@row("12.8", "registry: files.weights outside the head dir; manifest without backbone")
def manifest_paths(tmp: Path) -> str:
    from pipeline.route import registry

    head = _head_copy(tmp)
    _edit_manifest(head, lambda m: m["files"].__setitem__("weights", "../outside.safetensors"))
    refused(lambda: registry.load(head), "files.weights")
    head = _head_copy(tmp)
    _edit_manifest(head, lambda m: m.pop("backbone"))
    refused(lambda: registry.load(head), "'backbone' is missing")
    return "one line each"


# ------------------------------------------------------------------------ issue 25: deadlines, bursts, LOW rows
def _fault_server(**kw):
    """tests/fault_server.py's local OpenAI-protocol agent pool (counts every call per model)."""
    if str(REPO / "tests") not in sys.path:
        sys.path.insert(0, str(REPO / "tests"))
    from fault_server import FaultServer

    return FaultServer(**kw)


def _fault_client_for(fs, timeout_s: float = 30.0):
    import openai

    return lambda agent: openai.AsyncOpenAI(api_key="k", base_url=fs.base_url, max_retries=0, timeout=timeout_s)


@functools.lru_cache(maxsize=1)
def _cascade_files() -> Path:
    """A registered cascade over the synthetic world: agents expensive (big-model) and cheap (small-model); at
    target quality>=0.5 the plan asks cheap first and accepts its reply when it has an answer, else expensive."""
    import numpy as np

    from pipeline.route import registry
    from pipeline.route.cascade import CascadeRouter, Plan, Policy, Stage
    from pipeline.route.fit import constant_head
    from pipeline.route.head import Head
    from pipeline.route.ood import OODGuard

    X = np.load(_world_files().parent.parent / "X.npy")
    names = ["expensive", "cheap"]

    def point(plan, quality, cost):
        return {"plan": plan.to_dict(names), "quality": quality, "ci_low": quality, "ci_high": quality,
                "cost_per_1k": cost, "gain": 0.0, "gain_low": 0.0, "gain_high": 0.0, "gain_se": 0.0,
                "shares": {a: 0.0 for a in names}, "lambda": 0.0}

    path = {"kind": "cascade", "agents": names, "best_single": "expensive", "guard_z": 0.0,
            "best_single_validation": {"quality": 0.8, "ci_low": 0.8, "ci_high": 0.8, "cost_per_1k": 1.0},
            "n_validation": 100, "points": [point(Plan(Policy((Stage((0,)),))), 0.8, 1.0),
                                            point(Plan(Policy((Stage((1,), 1), Stage((0,))))), 0.7, 0.3)]}
    head = constant_head(Head(np.zeros((X.shape[1], 2), np.float32), np.zeros(2, np.float32), agents=names), 0)
    root = Path(tempfile.mkdtemp(prefix="attack-cascade-"))
    return registry.register(root / "registry", CascadeRouter(head, path, [0, 1], names),
                             registry.PromptFit(OODGuard().fit(X, X), 0),
                             backbone={"id": "synthetic", "key": "synthetic", "dim": int(X.shape[1])},
                             agents=[{"name": a, "model": a} for a in names], training={}, data_hashes={},
                             metrics={})


@contextlib.contextmanager
def cascade_server(fs, **settings):
    """The cascade entry served over the fault server's agents (requests name the grader: a cascade runs)."""
    import numpy as np

    from pipeline.collect.agents import AgentSpec
    from pipeline.route import registry
    from pipeline.serve.app import build_app
    from pipeline.serve.server import serve_in_thread
    from pipeline.serve.settings import ServeSettings

    X = np.load(_world_files().parent.parent / "X.npy")
    specs = [AgentSpec("expensive", "big-model", "test", None, 10.0, 30.0),
             AgentSpec("cheap", "small-model", "test", None, 0.1, 0.3)]
    app = build_app(registry.load(_cascade_files()), _Backbone(X), specs, _fault_client_for(fs),
                    ServeSettings(**settings))
    with serve_in_thread(app) as srv:
        yield srv


def _graded(c, text: str = "row 3", **kw):
    headers = {"X-Router-Grader": "mcq_letter", "X-Router-Target": "quality>=0.5", **kw.pop("headers", {})}
    return _chat(c, text, headers=headers, **kw)


@row("25.2", "serve: an agent sends its headers then 1 byte/s: upstream_timeout at timeout_s (head, stream, cascade)")
def per_call_deadline(tmp: Path) -> str:
    import httpx
    import numpy as np

    from pipeline.collect.agents import AgentSpec
    from pipeline.route import registry
    from pipeline.serve.app import build_app
    from pipeline.serve.server import serve_in_thread
    from pipeline.serve.settings import ServeSettings

    took = {}
    with _fault_server(drip_s=1.0) as fs:
        fs.always("drip")
        specs = [AgentSpec("expensive", "big-model", "test", None, 10.0, 30.0),
                 AgentSpec("cheap", "small-model", "test", None, 0.1, 0.3)]
        X = np.load(_world_files().parent.parent / "X.npy")
        app = build_app(registry.load(_world_files()), _Backbone(X), specs, _fault_client_for(fs),
                        ServeSettings(upstream_timeout_s=2.0))
        with serve_in_thread(app) as srv, httpx.Client(base_url=srv.base_url, timeout=8) as c:
            for mode, body in (("head", {}), ("stream", {"stream": True})):
                t = time.perf_counter()
                r = _chat(c, body=body)
                took[mode] = time.perf_counter() - t
                assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_timeout", (mode, r.text[:200])
                assert took[mode] < 4.0, (mode, took[mode])
        fs.always(None)
        fs.always("drip", model="small-model")  # the cheap stage drips: it times out and escalates
        with cascade_server(fs, upstream_timeout_s=2.0) as srv, httpx.Client(base_url=srv.base_url, timeout=8) as c:
            t = time.perf_counter()
            r = _graded(c)
            took["cascade"] = time.perf_counter() - t
            assert r.status_code == 200 and r.headers["x-router-agents-called"] == "cheap,expensive", \
                (r.status_code, r.text[:200])
            assert took["cascade"] < 4.0, took
    return "timeout_s 2: " + ", ".join(f"{k} {v:.1f}s" for k, v in took.items()) + \
        " (502 upstream_timeout; the cascade escalated)"


@row("25.2", "serve: a client that disconnects mid-stage cancels its cascade: the expensive agent is never called")
def disconnect_cancels_cascade(tmp: Path) -> str:
    import httpx

    def answer(model, prompt):
        return "I am not sure." if model == "small-model" else "The answer is (A)."

    with _fault_server(answer=answer, hang_s=1.5) as fs:
        fs.always("timeout", model="small-model")  # the cheap stage takes 1.5 s and has no answer: it escalates
        with cascade_server(fs) as srv:
            body = json.dumps({"messages": [{"role": "user", "content": "row 3"}]}).encode()
            s = socket.create_connection((srv.host, srv.port), timeout=5)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Router-Grader: mcq_letter\r\n"
                      b"X-Router-Target: quality>=0.5\r\n"
                      b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() +
                      b"\r\n\r\n" + body)
            time.sleep(0.5)  # the cheap call is in flight
            s.close()
            time.sleep(2.5)  # it would have answered, and the expensive agent been called, by now
            gone = fs.hit_counts()
            with httpx.Client(base_url=srv.base_url, timeout=10) as c:  # the same request, waited for: escalates
                r = _graded(c)
    by_model = {m: n for (m, _), n in gone.items()}
    assert by_model.get("small-model") == 1 and not by_model.get("big-model"), by_model
    assert r.status_code == 200 and r.headers["x-router-agents-called"] == "cheap,expensive", r.text[:200]
    return f"calls after the disconnect: {by_model} (a client that waits: cheap,expensive)"


def _burst(host: str, port: int, n: int, grader: str = "mcq_letter", limit_s: float = 60.0) -> list:
    """`n` simultaneous cascade requests, each on its own connection: the status line of each (None: none came)
    with its Retry-After when refused."""
    import asyncio

    body = json.dumps({"messages": [{"role": "user", "content": "row 3"}]}).encode()
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Router-Grader: {grader}\r\n"
           f"X-Router-Target: quality>=0.5\r\nContent-Type: "
           f"application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body

    async def one(go: asyncio.Event):
        await go.wait()
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            return None
        try:
            writer.write(req)  # a client sends its request as soon as it is connected
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            retry = next((ln.split(b":", 1)[1].strip().decode() for ln in head.split(b"\r\n")
                          if ln.lower().startswith(b"retry-after:")), None)
            return status, retry
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            return None
        finally:
            writer.close()

    async def main():
        go = asyncio.Event()
        tasks = [asyncio.ensure_future(one(go)) for _ in range(n)]
        await asyncio.sleep(0.05)
        go.set()
        return await asyncio.wait_for(asyncio.gather(*tasks), limit_s)

    return asyncio.run(main())


def _bursts(rounds: int, n: int, **settings) -> str:
    import collections

    with _fault_server() as fs, cascade_server(fs, **settings) as srv:
        seen = collections.Counter()
        for _ in range(rounds):
            got = _burst(srv.host, srv.port, n)
            silent = sum(g is None for g in got)
            assert not silent, f"{silent} of {n} requests got no status line ({collections.Counter(got)})"
            for status, retry in got:
                assert status == 200 or (status in (429, 503) and retry), (status, retry)
                seen[status] += 1
    return f"{rounds} x {n}: every request answered: " + ", ".join(f"{k}: {v}" for k, v in sorted(seen.items()))


@row("25.3", "serve: a burst of 120 simultaneous cascade requests from one address (idle cap 32): all answered")
def burst_small(tmp: Path) -> str:
    return _bursts(1, 120, max_idle_per_client=32)


@row("25.3", "serve: a burst of 120 over max_connections 48: every request a status (200, or 503/429 + Retry-After)")
def burst_over_limit(tmp: Path) -> str:
    return _bursts(1, 120, max_connections=48, max_idle_per_client=16, reserved_connections=8)


@row("25.3", "serve: 3 bursts of 250 simultaneous cascade requests from one address (default caps)", fast=False)
def burst_full(tmp: Path) -> str:
    return _bursts(3, 250)


@row("25.4", "serve: router_grader '' in the body vs the X-Router-Grader header -> 400 naming both")
def grader_conflict(tmp: Path) -> str:
    import httpx

    with _fault_server() as fs, cascade_server(fs) as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        for field in ("", "integer"):
            r = _graded(c, body={"router_grader": field})
            msg = r.json()["error"]["message"]
            assert r.status_code == 400 and "router_grader" in msg and "X-Router-Grader" in msg, (field, r.text[:300])
        same = _graded(c, body={"router_grader": "mcq_letter"})
        assert same.status_code == 200, same.text[:200]
    return msg[:100]


@row("25.4", "serve: an agent's usage.cost Infinity / \"inf\" -> finite cost header, strict JSON, flagged")
def non_finite_cost(tmp: Path) -> str:
    import math

    import httpx

    def strict(c):
        raise ValueError(f"{c} in the reply")

    with _fault_server() as fs, cascade_server(fs) as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        for fault in ("cost_inf", "cost_inf_str"):
            fs.always(fault, model="small-model")
            r = _graded(c)
            assert r.status_code == 200, r.text[:200]
            cost = float(r.headers["x-router-cost-usd"])
            data = json.loads(r.content, parse_constant=strict)
            assert math.isfinite(cost) and r.headers.get("x-router-cost-invalid") == "cheap", dict(r.headers)
            assert data["router"]["cost_invalid"] == ["cheap"] and math.isfinite(data["router"]["cost_usd"])
    return f"X-Router-Cost-Usd {cost} (estimated from prices x tokens), X-Router-Cost-Invalid: cheap"


@row("25.4", "serve: a taken port -> one line, exit 2 (--workers 1 and --workers 2)")
def bind_error_one_line(tmp: Path) -> str:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        for workers in ("1", "2"):
            err = _one_line(*cli("serve", "--head", str(_world_files()), "--profile", "demo", "--port", str(port),
                                 "--workers", workers), f"127.0.0.1:{port}", "in use")
    finally:
        busy.close()
    return err[:120]


@row("25.4", "serve --workers: a worker dies with its parent (SIGKILL of the parent: no orphan on the port)")
def workers_die_with_parent(tmp: Path) -> str:
    import signal
    import subprocess

    script = ("import sys, time\n"
              "from pipeline.serve.server import spawn_worker\n"  # what `serve --workers N` starts its workers with
              "p = spawn_worker([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              "print(p.pid, flush=True)\n"
              "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        child = int(parent.stdout.readline())
        parent.send_signal(signal.SIGKILL)
        parent.wait(5)
        t = time.perf_counter()
        while time.perf_counter() - t < 5 and _alive(child):
            time.sleep(0.05)
        alive = _alive(child)
    finally:
        if parent.poll() is None:
            parent.kill()
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, f"worker {child} outlived its parent by 5 s"
    return f"the worker got SIGTERM and exited {time.perf_counter() - t:.2f}s after the parent's SIGKILL"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" not in f.read().lower()
    except OSError:
        return False


@row("25.4", "stand-in: max_tokens Infinity / 1e30, JSON 100,000 deep, a 200 MB body -> 4xx, no traceback")
def standin_bounds(tmp: Path) -> str:
    import httpx

    from pipeline.collect.standin import OpenRouterStandIn, StandInServer

    bodies = [b'{"model": "m", "max_tokens": Infinity, "messages": [{"role": "user", "content": "hi"}]}',
              b'{"model": "m", "max_tokens": 1e30, "messages": [{"role": "user", "content": "hi"}]}',
              b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"]
    with StandInServer(OpenRouterStandIn(["m"])) as srv, httpx.Client(timeout=10) as c:
        codes = [c.post(srv.base_url + "/chat/completions", content=b,
                        headers={"content-type": "application/json"}).status_code for b in bodies]
        assert codes == [400, 400, 400], codes
        host, port = srv.host_port.split(":")
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 209715200\r\n\r\n" + b" " * 65536)
        reply = _read_all(s)
        s.close()
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
        ok = c.post(srv.base_url + "/chat/completions",
                    json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
        assert ok.status_code == 200, ok.text[:200]
    return "400 x3, 413 for the 200 MB body (refused from its Content-Length); then 200"


def _cascade_copy(tmp: Path, edit) -> Path:
    dst = tmp / "cascade"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(_cascade_files(), dst)
    doc = json.loads((dst / "cascade.json").read_text())
    edit(doc, dst)
    (dst / "cascade.json").write_text(json.dumps(doc))
    return dst


def _point_policy(doc, i: int = 1) -> dict:
    return doc["path"]["points"][i]["plan"]["default"]


@row("25.4", "registry: cascade.json tampered (k > stage, thresholds, duplicate/unknown agent, self fallback, "
             "fallback file outside) -> one line at load, route, serve")
def cascade_json_tampered(tmp: Path) -> str:
    from pipeline.route import registry

    (tmp / "outside.safetensors").write_bytes(b"x")
    edits = {
        "k": lambda d, _: _point_policy(d)["stages"][0].__setitem__("k", 2),
        "skip_below": lambda d, _: _point_policy(d).__setitem__("skip_below", -0.5),
        "accept_above": lambda d, _: _point_policy(d).__setitem__("accept_above", 1.5),
        "agents": lambda d, _: _point_policy(d)["stages"][0].__setitem__("agents", ["cheap", "cheap"]),
        ".agents": lambda d, _: _point_policy(d)["stages"][0].__setitem__("agents", ["nobody"]),
        "fallback.kind": lambda d, _: d.__setitem__("fallback", {"kind": "cascade", "files": {}}),
        "fallback.files.weights": lambda d, _: d.__setitem__("fallback", {"kind": "head", "files": {
            "weights": "../outside.safetensors"}}),
    }
    for field, edit in edits.items():
        head = _cascade_copy(tmp, edit)
        refused(lambda head=head: registry.load(head), "cascade.json", field)
        _one_line(*cli("route", "--head", str(head), "row 3"), "cascade.json", field)
        _one_line(*cli("serve", "--head", str(head), "--profile", "demo", "--port", "0"), "cascade.json", field)
    return f"{len(edits)} tamperings: one RouterLiteError line naming cascade.json and the field (load, route, serve)"


# ------------------------------------------------------------------------------- issue 25: reply texts (grading)
# A model's reply is untrusted text. Each row drives a real entry point (collection, regrade, the agreement tensor
# that train and the cascade assets build, a served cascade) with poisoned replies, in a child process with a wall
# bound where the old code hung (so a row fails, never hangs, on code without the grading budget).
POISON_REPLIES = [  # (reply text, the grader it is graded with); none says 42
    (r"The answer is $\exp(\exp(\exp(100)))$", "math_expression"),
    (r"The answer is $\tan(\exp(\exp(20)))$", "math_expression"),
    (r"The answer is $(9^{99})^{99}$", "integer"),
    ('{"answer": "1' + " " * 20_000 + '+1"}', "integer"),
    ('{"answer": "1' + " " * 20_000 + '+1"}', "math_expression"),
    ("answer" + " " * 20_000 + ": B", "mcq_letter"),
    ('{"answer": ' + "[" * 20_000, "python_literal"),
    ("\\boxed{" * 3_000 + "x", "math_expression"),
    ("<answer>" * 3_000 + "1", "integer"),
    ("The answer is $" + "\\text{" * 2_000 + "5" + "}" * 2_000 + "$ cm", "math_expression"),
]


def _in_child(code: str, limit_s: float) -> str:
    """Run `code` (Python, the repo importable) in a child process; its stdout, or AssertionError past `limit_s`."""
    import subprocess

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
from attack import POISON_REPLIES
"""


@row("25.1", "collection + regrade: a model answering poisoned replies; every call logged, graded unparsable")
def grading_poison_collection(tmp: Path) -> str:
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
    calls = run_collect(tasks, [agent], 0, CallLog({str(tmp / "calls")!r}), client_for,
                        CollectionSettings(max_retries=0))
    assert len(calls) == len(texts) and set(calls["status"]) == {{"ok"}}, calls[["status", "error_kind"]]
    assert not calls["correct"].any(), calls[["extracted", "correct"]]
    again, _ = regrade(calls, tasks)
    assert len(again) == len(texts) and not again["correct"].any()
    print(f"{{len(calls)}} calls logged and graded (none correct), regraded")
"""
    return _in_child(code, 90)


@row("25.1", "train/agreement: 40 answers of 4,994 spaces, exp towers, (9^99)^99 in the agreement tensor")
def grading_poison_agreement(tmp: Path) -> str:
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
    return _in_child(code, 90)


def _cascade_entry(tmp: Path, names: list[str]) -> Path:
    """A registered cascade over the synthetic world: agents 1 and 2 asked first (k=2), else agent 0."""
    import numpy as np

    from pipeline.route import registry
    from pipeline.route.cascade import CascadeRouter, Plan, Policy, Stage
    from pipeline.route.fit import constant_head
    from pipeline.route.head import Head
    from pipeline.route.ood import OODGuard

    X = np.load(_world_files().parent.parent / "X.npy")
    point = {"quality": 0.9, "ci_low": 0.9, "ci_high": 0.9, "cost_per_1k": 1.0, "gain": 0.0, "gain_low": 0.0,
             "gain_high": 0.0, "gain_se": 0.0, "shares": {a: 0.0 for a in names}, "lambda": 0.0,
             "plan": Plan(Policy((Stage((1, 2), 2), Stage((0,))))).to_dict(names)}
    path = {"kind": "cascade", "agents": names, "best_single": names[0], "guard_z": 0.0, "n_validation": 100,
            "best_single_validation": {"quality": 0.9, "ci_low": 0.9, "ci_high": 0.9, "cost_per_1k": 1.0},
            "points": [point]}
    head = constant_head(Head(np.zeros((X.shape[1], 3), np.float32), np.zeros(3, np.float32), agents=names), 0)
    return registry.register(tmp / "registry", CascadeRouter(head, path, [0, 1, 2], names),
                             registry.PromptFit(OODGuard().fit(X, X), 0),
                             backbone={"id": "synthetic", "key": "synthetic", "dim": X.shape[1]},
                             agents=[{"name": a, "model": a} for a in names], training={}, data_hashes={},
                             metrics={})


def poisoned_cascade_app(tmp: Path, reply_of: Callable[[str, str, int], str], **settings):
    """The cascade of `_cascade_entry` (cheap_a and cheap_b asked first, k=2, else strong) as an app whose agents
    answer `reply_of(agent, grader, i)` to a prompt "<grader> <i> row <i>" (no network: httpx.MockTransport)."""
    import httpx
    import numpy as np
    import openai

    from pipeline.collect.agents import AgentSpec
    from pipeline.route import registry
    from pipeline.serve.app import build_app
    from pipeline.serve.settings import ServeSettings

    names = ["strong", "cheap_a", "cheap_b"]
    reg = registry.load(_cascade_entry(tmp, names))
    X = np.load(_world_files().parent.parent / "X.npy")
    specs = [AgentSpec(n, n, "test", None, p, p) for n, p in zip(names, (10.0, 0.1, 0.1))]

    def client_for(spec):
        def reply(request):
            grader, i = json.loads(request.content)["messages"][-1]["content"].split()[:2]
            text = reply_of(spec.name, grader, int(i))
            return httpx.Response(200, json={"id": "x", "object": "chat.completion", "model": spec.model, "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]})
        return openai.AsyncOpenAI(api_key="k", base_url="http://agents.test/v1", max_retries=0,
                                  http_client=httpx.AsyncClient(transport=httpx.MockTransport(reply)))

    return build_app(reg, _Backbone(X), specs, client_for, ServeSettings(**settings))


@row("25.1", "serve: cheap agents answer poisoned replies; /healthz < 100 ms meanwhile, 200 escalated, counted")
def grading_poison_serve(tmp: Path) -> str:
    import threading

    import httpx

    from pipeline.serve.server import serve_in_thread

    poison = {"math_expression": [r"The answer is $\exp(\exp(\exp(100)))$", r"The answer is $\tan(\exp(\exp(20)))$"],
              "integer": [r"The answer is $(9^{99})^{99}$", '{"answer": "1' + " " * 20_000 + '+1"}']}

    def reply_of(agent: str, grader: str, i: int) -> str:  # the two cheap agents never give the same poison
        return "The answer is 1" if agent == "strong" else poison[grader][(i + (agent == "cheap_b")) % 2]

    health, results = [], []
    with serve_in_thread(poisoned_cascade_app(tmp, reply_of)) as srv:
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
    return (f"4 poisoned cascades 200 (escalated, overruns/errors counted {overruns}); /healthz over {len(health)} "
            f"polls: median {np.median(health):.0f} ms, p90 {p90:.0f} ms, max {worst:.0f} ms")


# ----------------------------------------------------------------- degenerate answers (nan, infinity, 0/0, log 0)
DEGENERATE_REPLIES = [r"The answer is $\infty$", r"So \boxed{\frac{0}{0}}", '{"answer": "\\\\log(0)"}',
                      r"The answer is $\frac{1}{0}$."]


def _agents_client(answer):
    """client_for over a MockTransport: agent spec -> its reply text `answer(spec, prompt)`."""
    import httpx
    import openai

    def client_for(spec):
        def reply(request):
            prompt = json.loads(request.content)["messages"][-1]["content"]
            return httpx.Response(200, json={"id": "x", "object": "chat.completion", "model": spec.model, "choices": [
                {"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": answer(spec, prompt)}}]})
        return openai.AsyncOpenAI(api_key="k", base_url="http://agents.test/v1", max_retries=0,
                                  http_client=httpx.AsyncClient(transport=httpx.MockTransport(reply)))
    return client_for


@row("degenerate", "serve: a cheap agent answers \\infty / \\frac{0}{0} / \\log(0) / \\frac{1}{0}: escalated")
def degenerate_answer_escalates(tmp: Path) -> str:
    import httpx

    def answer(model, prompt):  # prompt "case K row K": the cheap agent gives reply K, the last one an answer
        k = int(prompt.split()[1])
        return "The answer is $13$" if model == "big-model" or k == len(DEGENERATE_REPLIES) else DEGENERATE_REPLIES[k]

    called, got = [], []
    with _fault_server(answer=answer) as fs, cascade_server(fs) as srv, \
            httpx.Client(base_url=srv.base_url, timeout=30) as c:
        for k in range(len(DEGENERATE_REPLIES) + 1):
            r = _graded(c, f"case {k} row {k}", headers={"X-Router-Grader": "math_expression"})
            assert r.status_code == 200, r.text[:200]
            called.append(r.headers["x-router-agents-called"])
            got.append(r.json()["choices"][0]["message"]["content"])
    assert called == ["cheap,expensive"] * len(DEGENERATE_REPLIES) + ["cheap"], called  # the control is accepted
    assert set(got) == {"The answer is $13$"}, got  # no client received a degenerate reply
    return f"{len(DEGENERATE_REPLIES)} degenerate replies escalated, the control answered at stage 0"


@row("degenerate", "serve: two cheap agents both answer \\infty (identical strings): they do not agree, escalated")
def degenerate_answers_do_not_agree(tmp: Path) -> str:
    import httpx
    import numpy as np

    from pipeline.collect.agents import AgentSpec
    from pipeline.route import registry
    from pipeline.serve.app import build_app
    from pipeline.serve.server import serve_in_thread
    from pipeline.serve.settings import ServeSettings

    names = ["strong", "cheap_a", "cheap_b"]
    reg = registry.load(_cascade_entry(tmp, names))  # agents cheap_a and cheap_b first, k = 2, else strong
    X = np.load(_world_files().parent.parent / "X.npy")
    specs = [AgentSpec(n, n, "test", None, p, p) for n, p in zip(names, (10.0, 0.1, 0.1))]
    texts = [r"\boxed{\infty}", r"\boxed{-\infty}", r"\boxed{\frac{0}{0}}", r"\boxed{1}"]  # the control: 1 and 1

    def answer(spec, prompt):
        return "The answer is 7" if spec.name == "strong" else texts[int(prompt.split()[-1])]

    app = build_app(reg, _Backbone(X), specs, _agents_client(answer), ServeSettings())
    with serve_in_thread(app) as srv, httpx.Client(base_url=srv.base_url, timeout=30) as c:
        agents = [_chat(c, f"row {i}", headers={"X-Router-Grader": "math_expression"}).headers["x-router-agent"]
                  for i in range(len(texts))]
    assert agents[:-1] == ["strong"] * (len(texts) - 1) and agents[-1] in ("cheap_a", "cheap_b"), agents
    return f"identical degenerate answers escalated ({agents})"


@row("degenerate", "collection + regrade: an agent answers \\boxed{\\frac{0}{0}} to every task: graded wrong")
def degenerate_answer_collection(tmp: Path) -> str:
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
    calls = run_collect(tasks, [agent], 0, CallLog(str(tmp / "calls")),
                        _agents_client(lambda spec, prompt: r"Simplifying, \boxed{\frac{0}{0}}"),
                        CollectionSettings(max_retries=0))
    assert len(calls) == len(golds) and set(calls["status"]) == {"ok"}, calls[["status", "error_kind"]]
    assert not calls["correct"].any() and calls["extracted"].isna().all(), calls[["extracted", "correct"]]
    before = calls.assign(extracted=r"\frac{0}{0}", correct=True)  # how a version before graded this log
    again, changed = regrade(before, tasks)
    assert changed == len(golds) and not again["correct"].any(), (changed, again[["extracted", "correct"]])
    return f"{len(calls)} calls graded wrong (no answer); regrade of the old grades: {changed} changed"


# ------------------------------------------------------------------- numbers a reply or a user hands in, checked
def _strict_json(text: str | bytes):
    def strict(c):
        raise AssertionError(f"{c} in {str(text)[:200]!r}")
    return json.loads(text, parse_constant=strict)


@contextlib.contextmanager
def _access_lines():
    """The access-log lines (logger router_lite.access) written inside the block."""
    import logging

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logger, h = logging.getLogger("router_lite.access"), Keep(logging.INFO)
    level = logger.level
    logger.addHandler(h)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(h)
        logger.setLevel(level)


@row("costs", "serve: two agents each report usage.cost 1e308 -> finite cost header, strict JSON body, SSE and "
              "access log, both flagged (a prompt-only reply too)")
def costs_absurd_serve(tmp: Path) -> str:
    import math

    import httpx

    answer = lambda model, prompt: "no idea" if model == "small-model" else "The answer is (A)."  # noqa: E731
    with _fault_server(answer=answer) as fs, cascade_server(fs) as srv, _access_lines() as logged, \
            httpx.Client(base_url=srv.base_url, timeout=10) as c:
        fs.always("cost_huge")
        r, s, one = _graded(c), _graded(c, body={"stream": True}), _chat(c)  # one: prompt-only, no grader named
    for resp in (r, s, one):
        assert resp.status_code == 200, resp.text[:200]
        cost = float(resp.headers["x-router-cost-usd"])
        flagged = "cheap,expensive" if resp is not one else one.headers["x-router-agent"]
        assert math.isfinite(cost) and resp.headers.get("x-router-cost-invalid") == flagged, dict(resp.headers)
    assert math.isfinite(_strict_json(one.content)["usage"]["cost"])
    data = _strict_json(r.content)
    assert math.isfinite(data["usage"]["cost"]) and data["router"]["cost_invalid"] == ["cheap", "expensive"], data
    events = [_strict_json(e[6:]) for e in s.text.split("\n\n") if e.startswith("data: {")]
    assert events and all(math.isfinite(e.get("usage", {}).get("cost", 0.0)) for e in events), s.text[:300]
    assert len(logged) == 3 and all(math.isfinite(_strict_json(ln)["cost_usd"]) for ln in logged), logged
    return (f"X-Router-Cost-Usd {r.headers['x-router-cost-usd']} (prices x tokens of both calls), "
            "X-Router-Cost-Invalid: cheap,expensive; a prompt-only reply flagged too")


@row("costs", "collection: a provider reports usage.cost 1e308; a log already holding 1e308 rows resumes under "
              "a budget")
def costs_absurd_collection(tmp: Path) -> str:
    import math

    import pandas as pd

    from pipeline.collect.agents import AgentSpec
    from pipeline.collect.budget import Budget, collection_state
    from pipeline.collect.call_log import CallLog
    from pipeline.collect.calls import run_collect
    from pipeline.collect.settings import CollectionSettings

    agents = [AgentSpec("cheap", "small-model", "test", None, 0.1, 0.3)]
    tasks = pd.DataFrame({"task_id": [f"t{i}" for i in range(4)], "prompt": [f"question {i}" for i in range(4)],
                          "gold": ["A"] * 4, "grader": ["mcq_letter"] * 4})
    settings = CollectionSettings(max_retries=0)
    log = CallLog(tmp / "calls")
    with _fault_server() as fs:
        fs.always("cost_huge")
        state = lambda: collection_state([tmp / "calls"], tasks, agents, 1, settings.hash())  # noqa: E731
        run_collect(tasks.iloc[:2], agents, 0, log, _fault_client_for(fs), settings,
                    budget=Budget(1.0, state()["spent"], settings.max_tokens))
        rows = log.read()
        assert len(rows) == 2 and (rows["cost_invalid"] == True).all(), rows.T  # noqa: E712
        assert rows["cost_usd"].map(lambda v: math.isfinite(v) and v < 1e-3).all(), rows["cost_usd"].tolist()
        old = {**log.read().iloc[0].to_dict(), "cost_usd": 1e308}  # what the unchecked code wrote
        old.pop("cost_invalid")
        (tmp / "calls" / "cheap.jsonl").write_text("".join(json.dumps({**old, "call_key": k}) + "\n" for k in
                                                           rows["call_key"]))
        before = state()
        assert math.isfinite(before["spent"]) and before["spent"] < 1e-3 and before["cost_invalid"] == 2, before
        budget = Budget(1.0, before["spent"], settings.max_tokens)
        out = run_collect(tasks, agents, 0, log, _fault_client_for(fs), settings, budget=budget)
    after = state()
    assert not budget.stopped and after["done"] == 4 and not after["missing"], after
    assert out["cost_usd"].map(math.isfinite).all() and math.isfinite(after["spent"]), out["cost_usd"].tolist()
    return f"rows hold the estimate, flagged cost_invalid; a 1e308 log reads as ${before['spent']:.6f}, resumed to 4/4"


@row("cascade-json", "registry: cascade.json points without quality / best_single_validation, cost_per_1k null, "
                     "a string lambda, nested 100,000 deep -> one line at load, route, serve, publish")
def cascade_json_shapes(tmp: Path) -> str:
    from pipeline.report.hub_release import head_release
    from pipeline.route import registry

    def deep(_, dst):
        (dst / "cascade.json").write_text('{"path": ' + "[" * 100_000 + "]" * 100_000 + "}")

    edits = {
        "path.points[1].quality": lambda d, _: d["path"]["points"][1].pop("quality"),
        "path.best_single_validation": lambda d, _: d["path"].pop("best_single_validation"),
        "path.points[0].cost_per_1k": lambda d, _: d["path"]["points"][0].__setitem__("cost_per_1k", None),
        "path.points[1].lambda": lambda d, _: d["path"]["points"][1].__setitem__("lambda", "5"),
        "path.points[0].gain_high": lambda d, _: d["path"]["points"][0].__setitem__("gain_high", float("nan")),
        "nested": None,
    }
    for field, edit in edits.items():
        head = _cascade_copy(tmp, edit or (lambda d, _: None))
        if edit is None:
            deep(None, head)
        refused(lambda head=head: registry.load(head), "cascade.json", field)
        refused(lambda head=head: head_release("owner/name", head), "cascade.json", field)
        _one_line(*cli("route", "--head", str(head), "--target", "lambda=5", "row 3"), "cascade.json", field)
        _one_line(*cli("serve", "--head", str(head), "--profile", "demo", "--port", "0"), "cascade.json", field)
    return (f"{len(edits)} shapes: one RouterLiteError line naming cascade.json and the field (load, route, serve, "
            "publish)")


@row("prices", "config: a price table (or an agent) with a negative, .nan or .inf price -> forecast and run: one "
               "line naming file and field, exit 2")
def prices_not_numbers(tmp: Path) -> str:
    import yaml

    cfg = tmp / "config"
    shutil.copytree(REPO / "config", cfg)
    prices, agents = (cfg / "prices.yaml").read_text(), (cfg / "agents.yaml").read_text()
    model = "gpt-4o-2024-08-06"  # an agent of the demo pool
    assert f"  {model}:\n    {{input: 2.50, output: 10.00," in prices
    pool = yaml.safe_load(agents)
    first = pool["pools"]["demo"]["agents"][0]
    cases = []
    for bad in ("-2.5", ".nan", ".inf"):
        cases.append(("prices.yaml", f"models.{model}.input", lambda bad=bad: (cfg / "prices.yaml").write_text(
            prices.replace("{input: 2.50, output: 10.00,", f"{{input: {bad}, output: 10.00,", 1))))
    cases.append(("agents.yaml", "price_out_per_mtok", lambda: (cfg / "agents.yaml").write_text(yaml.safe_dump(
        {**pool, "pools": {**pool["pools"], "demo": {**pool["pools"]["demo"], "agents": [
            {**first, "price_in_per_mtok": 1.0, "price_out_per_mtok": float("inf")},
            *pool["pools"]["demo"]["agents"][1:]]}}}))))
    with env(ROUTER_LITE_CONFIG=str(cfg), ROUTER_LITE_HOME=str(tmp / "home")):
        for n, (file, field, write) in enumerate(cases):
            (cfg / "prices.yaml").write_text(prices)
            (cfg / "agents.yaml").write_text(agents)
            write()
            err = _one_line(*cli("forecast", "--profile", "demo"), file, field)
            if n:
                continue  # `run` (Dagster) once: it loads the agents as forecast does
            rc, out = cli("run", "--profile", "demo", "--upto", "task_pool")  # progress lines, then one error
            errors = [ln for ln in out.splitlines() if ln.startswith("router-lite: error:")]
            assert rc == 2 and len(errors) == 1 and file in errors[0] and field in errors[0], (rc, out[-400:])
            assert "Traceback" not in out, out[-400:]
    return err[:160]


def _push_body(host: str, port: int, head: bytes, limit_s: float) -> tuple[float | None, int, bytes]:
    """Send `head`, then chunks of a body that never ends, reading nothing, for at most `limit_s`: (seconds until
    the server closed the connection or None, bytes pushed, the reply read afterwards)."""
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(head)
    chunk = b"%x\r\n" % 65536 + b" " * 65536 + b"\r\n"
    pushed, closed, t0 = 0, None, time.perf_counter()
    s.settimeout(0.2)
    while closed is None and time.perf_counter() - t0 < limit_s:
        try:
            s.sendall(chunk)
            pushed += len(chunk)
        except TimeoutError:
            continue  # the server stopped reading but kept the socket: not closed yet
        except OSError:
            closed = time.perf_counter() - t0
    reply = _read_all(s, 2.0)
    s.close()
    return closed, pushed, reply


@row("body", "server: a chunked body (and a declared 1 GB one) pushed on after its 400 body_too_large -> "
             "Connection: close, the socket closed within 2 s")
def body_refused_closes(tmp: Path) -> str:
    import httpx

    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    with server(body_timeout_s=30) as srv:
        out = []
        for framing in (b"Transfer-Encoding: chunked\r\n\r\n", b"Content-Length: 1000000000\r\n\r\n"):
            closed, pushed, reply = _push_body(srv.host, srv.port, head + framing, 6.0)
            assert reply.startswith(b"HTTP/1.1 400") and b"body_too_large" in reply, reply[:200]
            assert b"connection: close" in reply.lower(), reply[:300]
            assert closed is not None and closed < 2.0, f"still open after {pushed / 1e6:.0f} MB in 6 s"
            out.append(f"{framing.split(b':')[0].decode()}: closed after {closed:.2f} s, {pushed / 1e6:.1f} MB")
        with httpx.Client(base_url=srv.base_url, timeout=10) as c:
            assert _chat(c).status_code == 200
    return "; ".join(out)


def grading_workers() -> int:
    """Live children of the grading forkserver (pipeline/collect/bounded.py's sympy workers), read from /proc."""
    from multiprocessing import forkserver

    pid, alive = getattr(forkserver._forkserver, "_forkserver_pid", None), 0
    for proc in Path("/proc").iterdir() if pid is not None else ():
        try:
            state, ppid = (proc / "stat").read_text().split(")")[-1].split()[:2] if proc.name.isdigit() else ("", "")
        except OSError:  # gone meanwhile
            continue
        alive += ppid == str(pid) and state != "Z"
    return alive


@row("starvation", "serve: 40 math_expression cascades spinning in sympy (3 s budget); integer ones answered first")
def grading_starvation(tmp: Path) -> str:
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
        with serve_in_thread(poisoned_cascade_app(tmp, reply_of)) as srv:
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
    return (f"5 integer cascades answered in {good_s:.2f} s with {len(graded)} poisoned cascades in flight; all 200, "
            f"the poisoned escalated; {left} grading worker(s) alive after")


# ----------------------------------------------------------------------- the registry pointer a user hands in
def _registry_home(tmp: Path) -> Path:
    """A home whose registry holds one registered head (`head`), latest.json not written yet."""
    home = tmp / "home"
    if home.exists():
        shutil.rmtree(home)
    (home / "registry").mkdir(parents=True)
    shutil.copytree(_world_files(), home / "registry" / "head")
    return home


def _cli_on(home: Path, *argv: str) -> tuple[int, str]:
    saved = os.environ.get("ROUTER_LITE_HOME")
    os.environ["ROUTER_LITE_HOME"] = str(home)
    try:
        return cli(*argv)
    finally:
        os.environ.pop("ROUTER_LITE_HOME") if saved is None else os.environ.__setitem__("ROUTER_LITE_HOME", saved)


@row("latest-json", "registry: latest.json not JSON, a list, without name -> serve and publish: one line, exit 2")
def latest_json_malformed(tmp: Path) -> str:
    home = _registry_home(tmp)
    for text in ("{not json", "[1, 2]", '{"path": "head"}'):
        (home / "registry" / "latest.json").write_text(text)
        for argv in (("serve", "--profile", "smoke", "--workers", "1"), ("publish", "--repo-id", "me/x", "--dry-run")):
            rc, err = _cli_on(home, *argv)
            lines = err.strip().splitlines()
            assert rc == 2 and len(lines) == 1 and "latest.json" in lines[0] and "Traceback" not in err, (argv, err)
    return "3 pointers x (serve, publish): one line naming latest.json, exit 2"


@row("registry-outside", "registry: an entry symlinked to a folder outside the home, a pointer leaving it -> refused")
def registry_outside_home(tmp: Path) -> str:
    from pipeline.route import registry

    home = _registry_home(tmp)
    elsewhere = tmp / "elsewhere"
    if elsewhere.exists():
        shutil.rmtree(elsewhere)
    shutil.copytree(_world_files(), elsewhere)
    (home / "registry" / "linked").symlink_to(elsewhere, target_is_directory=True)
    pointer = home / "registry" / "latest.json"
    msgs = []
    for path in ("linked", str(elsewhere), "../../elsewhere"):
        pointer.write_text(json.dumps({"name": "x", "path": path}))
        msgs.append(refused(lambda: registry.latest_path(home / "registry"), "outside the registry"))
        rc, err = _cli_on(home, "publish", "--repo-id", "me/x", "--dry-run")
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "outside the registry" in err, err
    return f"3 pointers refused in one line (publish: exit 2), e.g. {msgs[0][:90]}"


# --------------------------------------------------------------------------------------------------------- run
def run_rows(rows: list[Row]) -> list[tuple[Row, bool, str, float]]:
    out = []
    for r in rows:
        tmp = Path(tempfile.mkdtemp(prefix=f"attack-{r.number}-"))
        t = time.perf_counter()
        try:
            detail, held = r.fn(tmp), True
        except AssertionError as exc:
            detail, held = f"FAILED: {str(exc)[:150]}", False
        except Exception as exc:  # noqa: BLE001 - a traceback is a failed row too
            detail, held = f"FAILED: {type(exc).__name__}: {str(exc)[:150]}", False
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        out.append((r, held, detail, time.perf_counter() - t))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", action="store_true", help="only the fast rows (those tests/test_attack.py runs)")
    ap.add_argument("--rows", default=None, help="comma-separated row numbers")
    args = ap.parse_args(argv)
    rows = [r for r in ROWS if not args.fast or r.fast]
    if args.rows:
        wanted = {int(x) for x in args.rows.split(",")}
        rows = [r for r in rows if r.number in wanted]
    results = run_rows(rows)
    print("| # | item | attack | result | s | detail |\n|---|---|---|---|---|---|")
    for r, held, detail, s in results:
        print(f"| {r.number} | {r.item} | {r.name} | {'held' if held else 'FAILED'} | {s:.1f} | "
              f"{detail.replace('|', '/')} |")
    failed = sum(not h for _, h, _, _ in results)
    print(f"\n{len(results) - failed} of {len(results)} rows held")
    return 1 if failed else 0


if __name__ == "__main__":
    with env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1"):
        sys.exit(main())
