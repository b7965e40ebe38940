"""Every fenced shell block (```bash / ```sh) of README.md and docs/*.md, executed as written.

What is executed and what is not is the table `PLAN` below, one row per block (keyed by page and the block's first
line): a block that is not in the table fails the test, so a new command in the docs is either run here or skipped
with its reason in plain sight. Python blocks and unfenced (inline) commands are not executed.

How the blocks run: the blocks of one page, in page order, as one `bash -eo pipefail` script (a server a block starts
in the background serves the next block; the script's leftover jobs are killed when it ends). The ports of the docs
(8080, 8081, 8765) are replaced by free ones (other jobs on the machine may hold them).

In `make test` (`test_tutorial_and_serving_run_and_leave_the_checkout_clean`): docs/tutorial.md, then
docs/serving.md, in a copy of the repository (its own git repository: `git status` there must be clean afterwards)
whose `.router-lite/` is the suite's small lineage, the `smoke` profile, with the few substitutions of `SMALL` (each
with its reason); `PYTHONPATH` points at the copy, no `DAGSTER_HOME` (the CLI uses the copy's instance, as a user's
`router-lite run` in the repository root does).

Opt-in (`make test-docs`, ROUTER_LITE_DOCS_RUN=1, about 15 minutes): README's `make run` (run as `router-lite run`:
`make run` is the venv install + that command, and the test runs inside the installed venv) materialises the demo
home in a scratch folder that stands in for the repository root, then README, the tutorial, serving and operations
pages run there as written; `PYTHONPATH` points at this checkout (`python -m pipeline.standin`, `-m
assets.definitions` resolve as in the repository root); `DAGSTER_HOME` is a temporary instance.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/tutorial.md", "docs/serving.md", "docs/operations.md", "docs/usage.md",
         "docs/architecture.md", "docs/training.md", "docs/tasks.md", "docs/backbones.md", "docs/decisions.md",
         "docs/history.md", "docs/wide_pool.md"]
GENERATED = {"docs/README.template.md": "README.md"}  # README.md is generated from it: the same blocks, run there
BLOCK = re.compile(r"^[ \t]*```(?:bash|sh|shell)[ \t]*\n(.*?)^[ \t]*```", re.S | re.M)
PORTS = (8080, 8081, 8765)


@dataclass(frozen=True)
class Plan:
    how: str  # "run" (as written) | "instead" (the `commands` below, for `reason`) | "skip" (for `reason`)
    reason: str = ""
    commands: str = ""


PLAN: dict[tuple[str, str], Plan] = {
    ("docs/wide_pool.md", "printf 'pool: {name: demo_wide}\\n' > demo_wide.yaml"): Plan(
        "skip", "the whole demo lineage again on the 10-agent wider pool (about 12 minutes on 2 cores) over the demo "
                "home the other pages read; the page itself is generated from such a run (scripts/readme.py --wide) "
                "and tests/test_quarantine.py tests the quarantine that lets it finish"),
    ("README.md", "make run"): Plan(
        "instead", "`make run` = install into .venv (already installed: the test runs in it) + `router-lite run`; "
                   "`make test` is this test suite itself (it would run this test again)", "router-lite run"),
    ("docs/tutorial.md", "mkdir -p mine"): Plan("run"),
    ("docs/tutorial.md", "cat > mine/pool.yaml <<'EOF'"): Plan("run"),
    ("docs/tutorial.md", "python -m pipeline.standin --pool my_pool --override mine/pool.yaml --port 8765 "
                         "--write-override"): Plan("run"),
    ("docs/tutorial.md", "python -c \"import pandas as pd"): Plan("run"),
    ("docs/tutorial.md", "python -m pipeline.standin --pool my_pool --override mine/pool.yaml --port 8765 & "): Plan(
        "run"),
    ("docs/serving.md", "router-lite serve --profile demo"): Plan("run"),
    ("docs/serving.md", "router-lite run --profile demo && router-lite run --profile chat"): Plan(
        "skip", "both whole lineages (demo about 25 minutes, chat about 10 on 2 cores) and a server over them: "
                "tests/test_serve_worlds.py composes the same endpoint through serve's own set-up on small routers, "
                "and scripts/serve_star.py --open-ended-profile chat measures it on the full lineages"),
    ("docs/serving.md", "mkdir -p mine"): Plan("run"),
    ("docs/serving.md", "curl -s localhost:8080/v1/chat/completions -H 'X-Router-Target: parity'"): Plan("run"),
    ("docs/serving.md", "KEY=$(python -c \"import secrets"): Plan("run"),
    ("docs/operations.md", "export DAGSTER_HOME=$PWD"): Plan("run"),
    ("docs/operations.md", "HEAD=$(jq -r .head.path .router-lite/registry/latest.json)"): Plan("run"),
    ("docs/operations.md", "python -m pipeline.standin --port 8765"): Plan(
        "skip", "the pilot's whole 1,110-task path through the stand-in: tests/test_pilot_e2e.py runs these two "
                "commands on a 63-task slice, and docs/tutorial.md section 2 (run above) the same on an override"),
    ("docs/operations.md", "dagster job launch -m assets.definitions -j recollect_preflight \\"): Plan(
        "instead", "`dagster job launch` queues the run for a dagster-daemon, which is not running here; the block's "
                   "in-process line runs as written",
        "dagster asset materialize -m assets.definitions --select preflight \\\n"
        "  --config-json '{\"ops\": {\"preflight\": {\"config\": {\"pool\": \"demo_wide\"}}}}'"),
    ("docs/operations.md", "dagster schedule start recollect_wide_pool"): Plan("run"),
    ("docs/operations.md", "dagster job launch -m assets.definitions -j recollect_preflight \\ #2"): Plan(
        "skip", "`dagster job launch` queues the run for a dagster-daemon, which is not running here (the same "
                "pre-flight ran in process with the page's first block)"),
    ("docs/operations.md", "dagster job execute -m assets.definitions -j recollect_preflight \\"): Plan(
        "skip", "re-collects the demo on its wider pool and refreshes every downstream asset (many minutes, and it "
                "changes the demo home the other pages read); tests/test_ops.py runs these jobs in process"),
    ("docs/operations.md", "ROUTER_LITE_PROFILE=pilot dagster asset materialize"): Plan("run"),
    ("docs/operations.md", "dagster instance concurrency set provider:openrouter 1"): Plan("run"),
    ("docs/operations.md", "export ROUTER_LITE_DASK_ADDRESS=tcp://dask-scheduler:8786"): Plan(
        "skip", "needs a Dask scheduler at tcp://dask-scheduler:8786; tests/test_dask.py runs collection_dask on a "
                "local cluster"),
}


def page_blocks(page: str) -> list[str]:
    return [m.group(1) for m in BLOCK.finditer((REPO / page).read_text())]


def _first_lines(page: str) -> list[str]:
    """Each block's first line, " #n" added to the n-th block of a page that starts with the same line."""
    seen: dict[str, int] = {}
    out = []
    for block in page_blocks(page):
        first = block.strip().splitlines()[0].strip()
        seen[first] = seen.get(first, 0) + 1
        out.append(first if seen[first] == 1 else f"{first} #{seen[first]}")
    return out


def _key(page: str, block: str) -> tuple[str, str] | None:
    """The PLAN row of a block: the longest key its first line starts with (a repeated first line: " #n")."""
    first = _first_lines(page)[page_blocks(page).index(block)]
    repeated = re.compile(r" #\d+$")
    keys = [(p, prefix) for p, prefix in PLAN if p == page and first.startswith(prefix)
            and bool(repeated.search(prefix)) == bool(repeated.search(first))]
    return max(keys, key=lambda k: len(k[1])) if keys else None


def test_every_block_of_every_page_is_planned():
    pages = sorted({*PAGES, *(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))} - set(GENERATED))
    assert set(pages) <= {*PAGES, "README.md"}, f"add the new page to PAGES: {set(pages) - set(PAGES)}"
    unplanned = [(p, b.strip().splitlines()[0]) for p in pages for b in page_blocks(p) if _key(p, b) is None]
    assert not unplanned, f"fenced shell blocks with no row in PLAN (run them, or skip them with a reason): {unplanned}"
    used = {_key(p, b) for p in pages for b in page_blocks(p)}
    assert not set(PLAN) - used, f"rows of PLAN whose block is gone: {set(PLAN) - used}"
    for page, gen in GENERATED.items():  # the template's blocks are README's
        assert page_blocks(page) == page_blocks(gen)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def page_script(page: str, ports: dict[int, int], small: tuple[tuple[str, str], ...] = ()) -> tuple[str, list[str]]:
    """The page's executed blocks as one script, and what was skipped (with why); `small`: (text, replacement) pairs
    applied to the script (SMALL), each of which must occur in it."""
    parts, skipped = [], []
    for block in page_blocks(page):
        plan = PLAN[_key(page, block)]
        if plan.how == "skip":
            skipped.append(f"{page}: {block.strip().splitlines()[0]} — {plan.reason}")
            continue
        text = plan.commands if plan.how == "instead" else block
        for old, new in ports.items():
            text = re.sub(rf"\b{old}\b", str(new), text)
        parts.append(f"echo {shlex.quote('### ' + page + ': ' + block.strip().splitlines()[0][:60])}\n{text}")
    script = "\n".join(parts)
    for old, new in small:
        assert old in script, f"SMALL for {page}: {old!r} is no longer in its commands (update SMALL)"
        script = script.replace(old, new)
    return script, skipped


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs")
    work, dagster_home = root / "work", root / "dagster"
    work.mkdir()
    dagster_home.mkdir()
    text = (REPO / "dagster.yaml").read_text()
    (dagster_home / "dagster.yaml").write_text(text.replace(".router-lite/dagster", str(dagster_home / "instance")))
    env = _page_env(REPO)
    env.update({"DAGSTER_HOME": str(dagster_home), "DAGSTER_DISABLE_TELEMETRY": "1"})
    return work, env, {p: _free_port() for p in PORTS}


def _page_env(code: Path) -> dict[str, str]:
    """A user's shell after `make run`: the venv on PATH, offline, none of the suite's homes, keys or instance;
    `python -m ...` and the CLI import `code`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROUTER_LITE_", "OPENROUTER_", "DAGSTER_"))}
    env.update({"PYTHONPATH": str(code), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    return env


def _run_page(page: str, scratch, timeout: int, small=(), out: Path | None = None) -> list[str]:
    """Run the page's blocks in `scratch` = (folder, env, ports); their stdout and stderr go to `out` (default: the
    folder's <page>.out)."""
    work, env, ports = scratch
    script, skipped = page_script(page, ports, small)
    if not script:
        return skipped
    wrapped = f"set -eo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{script}\n"
    proc = subprocess.run(["bash", "-c", wrapped], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{page} failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    (out or work / f"{Path(page).stem}.out").write_text(proc.stdout + "\n---- stderr\n" + proc.stderr)
    return skipped


# --- the tutorial and serving pages in `make test`: on the small lineage, in a copy of the repository --------------

# What the suite shrinks, and why (reviewed: nothing else of the pages changes; neither page has a command that needs
# the network or a key, so nothing is skipped):
# - the demo's home is the `smoke` lineage (300 MMLU-Pro tasks, the replay pool, the same backbone: conftest's
#   `smoke_home`, materialised once for the suite) instead of `make run`'s demo lineage (about 10 minutes on 2
#   cores): the pages' `--profile demo` is `--profile smoke`;
# - the tutorial's pilot on your pool (63 tasks through the stand-in) collects one repetition instead of the pilot's
#   three (Dagster runs one collection step per source x repetition: 7 instead of 21, about 1.5 s each) and trains
#   its head for 20 generations instead of 60 (the smoke profile's number): two more lines of its override file.
POOL_FILE_END = "task_pool: {size: 63}\n"
SMALL: dict[str, tuple[tuple[str, str], ...]] = {
    "docs/tutorial.md": (("--profile demo", "--profile smoke"),
                         (POOL_FILE_END, POOL_FILE_END + "collection: {repetitions: 1}\ntrain: {generations: 20}\n")),
    "docs/serving.md": (("--profile demo", "--profile smoke"),),
}


def repo_copy(dst: Path) -> Path:
    """The checkout as git sees it (tracked files, and untracked ones that are not ignored: a page being edited
    counts), committed in a fresh repository at `dst`: `git status` there says what the pages left behind."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():  # a tracked file deleted in the checkout is listed too
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dst / name)
    git = ["git", "-c", "user.name=docs", "-c", "user.email=docs@localhost", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the checkout"]):
        subprocess.run([*git, *args], cwd=dst, check=True, capture_output=True)
    return dst


def _json_objects(text: str) -> list:
    """The objects jq pretty-printed (a `{` line ... a `}` line)."""
    return [json.loads(m) for m in re.findall(r"^\{\n.*?^\}$", text, re.S | re.M)]


@pytest.mark.timeout(900)
def test_tutorial_and_serving_run_and_leave_the_checkout_clean(smoke_home, tmp_path):
    """Every fenced shell block of docs/tutorial.md, then docs/serving.md, in a copy of the repository whose
    `.router-lite/` is the smoke lineage (SMALL): every command succeeds, the replies and files they show are what
    the pages say, and `git status` is clean afterwards (what a user makes goes under ignored folders)."""
    repo = repo_copy(tmp_path / "repo")
    home = repo / ".router-lite"
    shutil.copytree(smoke_home[0], home, ignore=shutil.ignore_patterns("backbones"))
    (home / "backbones").symlink_to(smoke_home[0] / "backbones")  # built once for the suite (a cache, 170 MB)
    scratch = repo, _page_env(repo), {p: _free_port() for p in PORTS}
    for page in ("docs/tutorial.md", "docs/serving.md"):
        _run_page(page, scratch, 600, SMALL[page], out=tmp_path / f"{Path(page).stem}.out")
    tutorial, serving = ((tmp_path / f"{n}.out").read_text().split("\n---- stderr\n") for n in ("tutorial", "serving"))

    # tutorial 1: the ★ router answers a recorded question; its access-log line is the reply's cost, no prompt
    star, trained, mine = _json_objects(tutorial[0])
    assert star["router"]["agents_called"] and star["usage"]["cost"] > 0, star
    log = json.loads((repo / "mine/serve.log").read_text().splitlines()[-1])
    assert log["status"] == 200 and log["cost_usd"] == star["usage"]["cost"] and "prompt" not in log
    # tutorial 2: the pilot on your pool through the stand-in: my_llama in its pool report, no failed check
    assert "my_llama" in tutorial[0] and "check FAILED" not in tutorial[1], tutorial[1][-3000:]
    # tutorial 3-4: a head trained on that data, over my_llama too, served at the stand-in
    manifest = json.loads((repo / trained["registered"] / "manifest.json").read_text())
    assert "my_llama" in [a["name"] for a in manifest["agents"]]
    assert mine["router"]["head"] == Path(trained["registered"]).name and mine["usage"]["cost"] > 0, mine
    # serving: a reply, the headers at another target, parity, a route, and a client key (401 without it)
    reply, parity = _json_objects(serving[0])[:2]
    assert reply["router"]["head"] == star["router"]["head"] and parity["target"] == "parity"
    assert re.search(r"^x-router-target: quality>=0\.95\r?$", serving[0], re.M | re.I)
    assert "invalid_api_key" in serving[0].splitlines()
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=repo, capture_output=True,
                            text=True, check=True).stdout
    assert not status, f"the pages left these in the checkout (write under mine/ or the home):\n{status}"


@pytest.mark.timeout(3600)
@pytest.mark.skipif(not os.environ.get("ROUTER_LITE_DOCS_RUN"),
                    reason="the whole demo lineage from scratch, then every page (about 15 minutes on 2 cores): opt in "
                           "with ROUTER_LITE_DOCS_RUN=1 (`make test-docs`)")
def test_the_docs_run_as_written(scratch):
    """README's `make run` first (the demo home), then each page; the ★ router answers a recorded held-out question
    and a cascade reply's usage.cost equals its header."""
    work, *_ = scratch
    skipped = []
    for page, timeout in (("README.md", 2400), ("docs/tutorial.md", 2400), ("docs/serving.md", 900),
                          ("docs/operations.md", 1200)):
        skipped += _run_page(page, scratch, timeout)
    out = (work / "tutorial.out").read_text()
    replies = _json_objects(out)
    star = next(r for r in replies if r.get("router") and r["router"]["head"].startswith("cascade-"))
    assert star["usage"]["cost"] > 0 and star["router"]["target"] == "quality>=0.98"
    log = [json.loads(line) for line in (work / "mine/serve.log").read_text().splitlines()]
    assert log[-1]["status"] == 200 and log[-1]["cost_usd"] == star["usage"]["cost"] and "prompt" not in log[-1]
    trained = json.loads((work / "mine/trained.json").read_text())
    manifest = json.loads((work / trained["registered"] / "manifest.json").read_text())  # relative to the pages
    assert "my_llama" in [a["name"] for a in manifest["agents"]]
    print("\n".join(["skipped:", *skipped]))
