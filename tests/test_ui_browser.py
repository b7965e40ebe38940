"""The Dagster UI in a real browser: dagster-webserver on loopback over the materialised smoke lineage, opened in
headless Chromium (the system `chromium`, driven by playwright). Screenshots land in the test's tmp dir."""
import shutil

import httpx
import pytest
from test_ui import webserver  # noqa: F401 (the fixture: dagster-webserver on a free loopback port)

pytestmark = pytest.mark.slow  # a browser on a Dagster webserver (make test-fast leaves it out)

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
def test_browser_shows_groups_held_out_table_and_frontier_plot(webserver, browser, tmp_path):  # noqa: F811
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

    # benchmark_report: the frontier plot, an inline PNG shown from its metadata entry
    page.goto(f"{base}/assets/benchmark_report")
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
    acc = page.locator("tr", has_text="test_accuracy").first.locator("td").last.inner_text()
    assert len(acc.split(".")[-1]) <= 4, acc
    print(f"screenshots: {sorted(p.name for p in tmp_path.glob('*.png'))} in {tmp_path}")
