"""The Dagster UI over a materialised smoke lineage: dagster-webserver on a free loopback port, asked over GraphQL
for the asset graph, the latest benchmark_report materialisation and the operations (schedule, sensors, jobs)."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow  # a Dagster webserver on the smoke_home lineage (make test-fast leaves it out)

REPO = Path(__file__).resolve().parents[1]
LINEAGE = {"source_tasks", "task_pool", "agent_pool", "preflight", "graded_calls", "reward_matrix", "baselines",
           "prompt_embeddings", "pool_report", "router_head", "registered_head", "benchmark_report",
           "routerbench_replication", "routerbench_summary"}

ASSET_GRAPH = "{ assetNodes { assetKey { path } dependencyKeys { path } pools } }"
REPORT = """{ assetOrError(assetKey: {path: ["benchmark_report"]}) {
  __typename
  ... on Asset { assetMaterializations(limit: 1) { runId timestamp metadataEntries {
      __typename label
      ... on FloatMetadataEntry { floatValue }
      ... on TextMetadataEntry { text }
      ... on MarkdownMetadataEntry { mdStr } } } } } }"""
OPERATIONS = """{ repositoriesOrError { ... on RepositoryConnection { nodes { name
  schedules { name cronSchedule scheduleState { status } }
  sensors { name sensorState { status } }
  jobs { name } } } } }"""
LOCATION = ("{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
            "locationOrLoadError { __typename ... on PythonError { message } } } } } }")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gql(url: str, query: str) -> dict:
    r = httpx.post(url, json={"query": query}, timeout=30)
    r.raise_for_status()
    body = r.json()
    assert not body.get("errors"), body["errors"]
    return body["data"]


@pytest.fixture
def webserver(smoke_home, tmp_path):
    """dagster-webserver over the smoke lineage's instance, in its own process group; killed as a group after."""
    home, dagster_home = smoke_home
    port = _free_port()
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "ROUTER_LITE_HOME": str(home),
           "ROUTER_LITE_PROFILE": "smoke", "PYTHONPATH": str(REPO), "DAGSTER_DISABLE_TELEMETRY": "1"}
    log = open(tmp_path / "webserver.log", "w")
    # cwd = the smoke root: dagster.yaml's relative storage folders resolve as when the lineage ran
    proc = subprocess.Popen([sys.executable, "-m", "dagster_webserver", "-h", "127.0.0.1", "-p", str(port),
                             "-m", "assets.definitions", "-d", str(REPO)],
                            cwd=dagster_home.parent, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/graphql"
    try:
        deadline, status = time.time() + 180, None
        while time.time() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"dagster-webserver exited ({proc.returncode}):\n"
                            f"{(tmp_path / 'webserver.log').read_text()[-3000:]}")
            try:
                entries = _gql(url, LOCATION)["workspaceOrError"]["locationEntries"]
                status = [(e["loadStatus"], e["locationOrLoadError"]) for e in entries]
                if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                    break
            except (httpx.HTTPError, AssertionError, KeyError, TypeError):
                pass
            time.sleep(1)
        else:
            pytest.fail(f"code location not loaded within 180 s ({status}):\n"
                        f"{(tmp_path / 'webserver.log').read_text()[-3000:]}")
        errors = [s for s in status if s[1] and s[1]["__typename"] == "PythonError"]
        assert not errors, errors
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ui_shows_the_asset_graph_report_metadata_and_operations(webserver, smoke_home):
    nodes = _gql(webserver, ASSET_GRAPH)["assetNodes"]
    keys = {"/".join(n["assetKey"]["path"]) for n in nodes}
    assert LINEAGE <= keys
    deps = {"/".join(n["assetKey"]["path"]): {"/".join(d["path"]) for d in n["dependencyKeys"]} for n in nodes}
    assert {"task_pool", "preflight"} <= deps["graded_calls"] and "graded_calls" in deps["reward_matrix"]
    assert deps["routerbench_summary"] == {"routerbench_replication"}
    pools = {"/".join(n["assetKey"]["path"]): n["pools"] for n in nodes}
    assert pools["graded_calls"] == ["provider:replay"]

    asset = _gql(webserver, REPORT)["assetOrError"]
    assert asset["__typename"] == "Asset"
    (latest,) = asset["assetMaterializations"]
    meta = {e["label"]: e for e in latest["metadataEntries"]}
    assert {"headline", "report", "head_test_accuracy", "aiq_trained_head", "frontier_plot"} <= set(meta)
    assert 0.0 <= meta["head_test_accuracy"]["floatValue"] <= 1.0
    assert meta["report"]["mdStr"].startswith("## What the router is worth (smoke")
    assert "## Routed benchmark (smoke" in meta["report"]["mdStr"]
    # one headline, the best validation AIQ kind's (the ★, the router served, is the promotion's): the first entry,
    # in the report once; the report links no image the UI cannot load
    assert latest["metadataEntries"][0]["label"] == "headline"
    assert meta["headline"]["text"].startswith("best validation AIQ: ")
    assert meta["report"]["mdStr"].count(meta["headline"]["text"]) == 1 and "![" not in meta["report"]["mdStr"]

    (repo,) = _gql(webserver, OPERATIONS)["repositoriesOrError"]["nodes"]
    schedules = {s["name"]: s for s in repo["schedules"]}
    assert schedules["recollect_wide_pool"]["scheduleState"]["status"] == "STOPPED"
    assert {"recollect_collect_partitions", "refresh_after_collection"} <= {s["name"] for s in repo["sensors"]}
    assert {"source_tasks_job", "collection_job", "recollect_preflight", "refresh_downstream",
            "collection_dask"} <= {j["name"] for j in repo["jobs"]}


# ---------------------------------------------------------------------- the same UI in a real browser
# headless Chromium (the system `chromium`, driven by playwright); screenshots land in the test's tmp dir
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
GROUPS = "{ assetNodes { groupName } }"


@pytest.fixture
def browser():
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install -y chromium; .ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (pip, test extra) is not installed")
    with sync_api.sync_playwright() as p:  # the system browser: playwright downloads none
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            yield b.new_page(viewport={"width": 1600, "height": 1200})
        finally:
            b.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_browser_shows_groups_held_out_table_and_frontier_plot(webserver, browser, tmp_path):
    base = webserver.removesuffix("/graphql")
    page, wait = browser, 60_000
    groups = {n["groupName"] for n in httpx.post(webserver, json={"query": GROUPS}, timeout=30).json()["data"]
              ["assetNodes"]}
    assert {"tasks", "collection", "rewards", "router", "report", "publish"} <= groups

    # the asset graph: every group named, as a group node of the graph (not only in the sidebar)
    page.goto(f"{base}/asset-groups")
    page.get_by_text("Global asset lineage").wait_for(timeout=wait)
    for g in sorted(groups):
        page.get_by_text(g, exact=True).first.wait_for(timeout=wait)
    page.wait_for_timeout(1000)  # let the graph finish its layout before the picture
    page.screenshot(path=tmp_path / "asset_graph.png")
    assert "Join the Dagster community" not in page.content()  # dagster.yaml: nux disabled
    for g in sorted(groups):
        assert page.get_by_text(g, exact=True).count() >= 2, g  # sidebar + graph

    # router_head: the held-out table rendered as a table, floats at 4 decimals
    page.goto(f"{base}/assets/router_head")
    held_out = page.locator("tr", has_text="held_out").filter(has_text="oracle").first
    held_out.wait_for(timeout=wait)
    held_out.scroll_into_view_if_needed()
    page.screenshot(path=tmp_path / "router_head.png")
    cells = held_out.locator("table td").all_inner_texts()
    assert {"head", "best_single", "knn", "random", "oracle"} <= set(cells)
    numbers = [c for c in cells if c.replace(".", "", 1).isdigit()]
    assert len(numbers) >= 5 and all(len(n.split(".")[-1]) <= 4 for n in numbers), numbers

    # benchmark_report: its report renders with no broken image, the frontier plot is an inline PNG of its own entry
    page.goto(f"{base}/assets/benchmark_report")
    row = page.locator("tr", has_text="report_dir").first
    row.wait_for(timeout=wait)
    page.locator("tr").filter(has=page.get_by_text("report", exact=True)).first.get_by_text("[Show Markdown]").click()
    page.get_by_text("What the router is worth (smoke", exact=False).first.wait_for(timeout=wait)
    page.wait_for_timeout(800)
    assert page.locator("img").evaluate_all("imgs => imgs.filter(i => !(i.complete && i.naturalWidth > 0)).length") == 0
    page.get_by_text("Close", exact=True).click()
    row = page.locator("tr", has_text="frontier_plot").first
    row.wait_for(timeout=wait)
    row.get_by_text("[Show Markdown]").click()
    plot = page.locator("img[src^='data:image/png']").first
    plot.wait_for(timeout=wait)
    page.wait_for_timeout(800)  # the dialog fades in
    page.screenshot(path=tmp_path / "benchmark_report_frontier.png")
    box = plot.bounding_box()
    assert box["width"] > 300 and box["height"] > 200
    assert plot.evaluate("img => img.complete && img.naturalWidth > 300")
    # floats people read on the page are rounded to 4 decimals
    page.get_by_text("Close", exact=True).click()
    acc = page.locator("tr", has_text="head_test_accuracy").first.locator("td").last.inner_text()
    assert len(acc.split(".")[-1]) <= 4, acc

    # the graph's groups open collapsed (the browser keeps which are open, in the URL: no server setting,
    # docs/usage.md); ⌥E expands them all
    page.goto(f"{base}/asset-groups")
    page.get_by_text("Global asset lineage").wait_for(timeout=wait)
    page.get_by_text("report", exact=True).last.wait_for(timeout=wait)
    assert "expanded=" not in page.url
    page.mouse.click(1200, 300)  # the graph's background: the page has the keyboard
    page.keyboard.press("Alt+KeyE")
    page.wait_for_url(re.compile(r"expanded=.*report"), timeout=wait)
    print(f"screenshots: {sorted(p.name for p in tmp_path.glob('*.png'))} in {tmp_path}")
