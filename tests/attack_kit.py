"""What the attack tests (tests/test_attack_*.py) share: a synthetic world (a registered head and cascade over 8-dim
vectors, no model, no network), in-process servers over it, and the checks of a documented refusal. Each attack is
bounded in count, size and time and reproducible (fixed seeds); it holds when it gets the documented answer: one
RouterLiteError line naming the bad input (file, key, row), or the documented HTTP status, within its bounds.
bench/grading_starvation.py serves `poisoned_cascade_app` too."""
from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

from _support import two_cluster_head
from fault_server import FaultServer

from pipeline.core.environ import environ as env
from pipeline.core.errors import RouterLiteError

REPO = Path(__file__).resolve().parents[1]


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


def one_line(rc: int, err: str, *must: str, max_len: int = 600) -> str:
    assert rc == 2, (rc, err[-300:])
    assert err.count("\n") == 1 and len(err) <= max_len, f"{err.count(chr(10))} lines, {len(err)} chars"
    for m in must:
        assert m in err, (m, err)
    return err.strip()


# ------------------------------------------------------------------------------------------------- registry
@functools.lru_cache(maxsize=1)
def world_files() -> Path:
    """A registered synthetic head with operating points (two clusters, an expensive and a cheap agent)."""
    import numpy as np

    root = Path(tempfile.mkdtemp(prefix="attack-world-"))
    _fit, path, X, _cluster = two_cluster_head(root / "registry", 300)
    np.save(root / "X.npy", X)
    return path


def head_copy(tmp: Path) -> Path:
    dst = tmp / "head"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(world_files(), dst)
    return dst


def edit_manifest(head: Path, edit) -> None:
    m = json.loads((head / "manifest.json").read_text())
    edit(m)
    (head / "manifest.json").write_text(json.dumps(m))


# ----------------------------------------------------------------------------------------------------- server
class RowBackbone:
    """Embeds "row 12" as X[12] (no model)."""

    def __init__(self, X):
        self.X, self.dim, self.key, self.model_id, self.device = X, X.shape[1], "synthetic", "synthetic", "cpu"

    def encode(self, texts):
        import numpy as np

        return np.stack([self.X[int(t.split()[-1]) % len(self.X)] for t in texts])


@contextlib.contextmanager
def server(**settings):
    import numpy as np

    from pipeline.collect.agents import AgentSpec
    from pipeline.route import registry
    from pipeline.serve.app import build_app
    from pipeline.serve.server import serve_in_thread
    from pipeline.serve.settings import ServeSettings

    path = world_files()
    reg = registry.load(path)
    X = np.load(path.parent.parent / "X.npy")
    specs = [AgentSpec("expensive", "big-model", "test", None, 10.0, 30.0),
             AgentSpec("cheap", "small-model", "test", None, 0.1, 0.3)]
    app = build_app(reg, RowBackbone(X), specs, agents_client(lambda spec, _: f"from {spec.model}"),
                    ServeSettings(**settings))
    with serve_in_thread(app) as srv:
        yield srv


def chat(c, text: str = "row 3", **kw):
    return c.post("/chat/completions", json={"messages": [{"role": "user", "content": text}], **kw.pop("body", {})},
                  **kw)


def peer_closed(s: socket.socket) -> bool:
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


def read_all(s: socket.socket, limit: float = 5.0) -> bytes:
    s.settimeout(limit)
    out = b""
    with contextlib.suppress(OSError):
        while chunk := s.recv(65536):
            out += chunk
    return out


# ------------------------------------------------------------------------------- cascades over a fault server
def fault_server(**kw) -> FaultServer:
    """tests/fault_server.py's local OpenAI-protocol agent pool (counts every call per model)."""
    return FaultServer(**kw)


def fault_client_for(fs, timeout_s: float = 30.0):
    import openai

    return lambda agent: openai.AsyncOpenAI(api_key="k", base_url=fs.base_url, max_retries=0, timeout=timeout_s)


@functools.lru_cache(maxsize=1)
def cascade_files() -> Path:
    """A registered cascade over the synthetic world: agents expensive (big-model) and cheap (small-model); at
    target quality>=0.5 the plan asks cheap first and accepts its reply when it has an answer, else expensive."""
    import numpy as np

    from pipeline.route import registry
    from pipeline.route.cascade import CascadeRouter, Plan, Policy, Stage
    from pipeline.route.fit import constant_head
    from pipeline.route.head import Head
    from pipeline.route.ood import OODGuard

    X = np.load(world_files().parent.parent / "X.npy")
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

    X = np.load(world_files().parent.parent / "X.npy")
    specs = [AgentSpec("expensive", "big-model", "test", None, 10.0, 30.0),
             AgentSpec("cheap", "small-model", "test", None, 0.1, 0.3)]
    app = build_app(registry.load(cascade_files()), RowBackbone(X), specs, fault_client_for(fs),
                    ServeSettings(**settings))
    with serve_in_thread(app) as srv:
        yield srv


def graded(c, text: str = "row 3", **kw):
    headers = {"X-Router-Grader": "mcq_letter", "X-Router-Target": "quality>=0.5", **kw.pop("headers", {})}
    return chat(c, text, headers=headers, **kw)


# ----------------------------------------------------------------------------------- reply texts (grading)
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


def cascade_entry(tmp: Path, names: list[str]) -> Path:
    """A registered cascade over the synthetic world: agents 1 and 2 asked first (k=2), else agent 0."""
    import numpy as np

    from pipeline.route import registry
    from pipeline.route.cascade import CascadeRouter, Plan, Policy, Stage
    from pipeline.route.fit import constant_head
    from pipeline.route.head import Head
    from pipeline.route.ood import OODGuard

    X = np.load(world_files().parent.parent / "X.npy")
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
    """The cascade of `cascade_entry` (cheap_a and cheap_b asked first, k=2, else strong) as an app whose agents
    answer `reply_of(agent, grader, i)` to a prompt "<grader> <i> row <i>" (no network: httpx.MockTransport)."""
    import numpy as np

    from pipeline.collect.agents import AgentSpec
    from pipeline.route import registry
    from pipeline.serve.app import build_app
    from pipeline.serve.settings import ServeSettings

    names = ["strong", "cheap_a", "cheap_b"]
    reg = registry.load(cascade_entry(tmp, names))
    X = np.load(world_files().parent.parent / "X.npy")
    specs = [AgentSpec(n, n, "test", None, p, p) for n, p in zip(names, (10.0, 0.1, 0.1))]

    def answer(spec, prompt: str) -> str:
        grader, i = prompt.split()[:2]
        return reply_of(spec.name, grader, int(i))

    return build_app(reg, RowBackbone(X), specs, agents_client(answer), ServeSettings(**settings))


def agents_client(answer):
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
