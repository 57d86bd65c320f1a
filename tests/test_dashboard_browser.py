"""The episode dashboard in a real browser: Debian's Chromium driven by Playwright for Python.

Opens /web on a live server, switches to the Dashboard tab, steps an episode, then picks the
multi-tenant task and runs one to the end, and checks what a visitor would see: every plot drawn
with its data points (none before the run), one attainment line per tenant, the episode finished
and the grade shown; and that the manual knobs drive the steps when that policy is picked.
Requests to any host but the server are aborted and recorded: the dashboard must work with no
CDN (web fonts fall back to system fonts). A full-page screenshot is saved to
artifacts/dashboard.png.

Needs `scripts/ci_browser_deps.sh` (chromium + playwright). Missing, the tests are skipped, unless
LLMSERVE_REQUIRE_BROWSER is set (`.ci/run` sets it once it has installed them): then they fail.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    # Gradio's queue uses pandas options that pandas 3 deprecates: its noise, not this project's.
    pytest.mark.filterwarnings("ignore:::gradio.queueing"),
]

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOT = ROOT / "artifacts" / "dashboard.png"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Without the background-networking flags Chromium keeps calling Google's hosts, which this
# machine's closed network refuses.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Web fonts named by OpenEnv's and Gradio's themes: the page falls back to system fonts without them.
FONT_HOSTS = {"fonts.googleapis.com", "fonts.gstatic.com"}
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
PLOT_COUNT = 12
TASK = "adversarial_multitenant"
TENANTS = ("interactive", "code", "batch")
# Gradio draws its plots with Vega's SVG renderer: one hover symbol per data point of each line.
COUNT_POINTS = "els => els.map(el => el.querySelectorAll('g.mark-symbol.role-mark path').length)"
COUNT_LINES = "els => els.map(el => el.querySelectorAll('g.mark-line.role-mark path').length)"
# A line is only drawn if its series is in the plot's colour domain, which the legend lists.
LEGENDS = "els => els.map(el => [...el.querySelectorAll('.role-legend-label text')].map(t => t.textContent))"


def expect(locator: Any) -> Any:
    """Playwright's retrying assertions, imported only where Playwright is installed."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def _playwright():
    if not Path(CHROMIUM).exists():
        return None, f"no Chromium at {CHROMIUM}"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None, "playwright for Python is not installed"
    return sync_playwright, ""


@pytest.fixture(scope="module")
def browser():
    factory, why = _playwright()
    if factory is None:
        message = f"{why}: run scripts/ci_browser_deps.sh"
        if os.environ.get("LLMSERVE_REQUIRE_BROWSER"):
            pytest.fail(message)
        pytest.skip(message)
    with factory() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        yield chromium
        chromium.close()


@dataclass
class Dashboard:
    page: Any
    external: list[str]

    @property
    def status(self) -> Any:
        return self.page.locator("#dash-status")

    def choose(self, dropdown_id: str, option: str) -> None:
        self.page.locator(f"#{dropdown_id} input").click()
        self.page.get_by_role("option", name=option).click()

    def set_slider(self, slider_id: str, value: str) -> None:
        """Type `value` into a slider's number box until the slider itself holds it.

        The accordion mounts its sliders as it opens, and a slider that mounts after the typing
        resets to its initial value; the range input shows what the next event will send.
        """
        box = self.page.locator(f"#{slider_id} input[type=number]")
        track = self.page.locator(f"#{slider_id} input[type=range]")
        for _ in range(10):
            box.fill(value)
            box.press("Enter")
            try:
                expect(track).to_have_value(value, timeout=1_000)
                expect(box).to_have_value(value, timeout=1_000)
                return
            except AssertionError:
                continue
        raise AssertionError(f"slider #{slider_id} did not take {value}: it shows {track.input_value()}")


@pytest.fixture()
def dashboard(live_server, browser) -> Iterator[Dashboard]:
    """The Dashboard tab of /web in a fresh browser context; hosts other than the server are refused."""
    external: list[str] = []

    def only_local(route):
        host = urlsplit(route.request.url).hostname or ""
        if host in LOCAL_HOSTS:
            route.continue_()
        else:
            external.append(host)
            route.abort()

    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    page = context.new_page()
    page.route("**/*", only_local)
    page.goto(live_server.url + "/web/", wait_until="domcontentloaded")
    page.get_by_role("tab", name="Dashboard").click()
    page.locator("#dash-status").get_by_text("No episode yet").wait_for(timeout=60_000)
    # Gradio mounts the plot components after the text around them (their code loads lazily).
    page.locator(".llmserve-plot").nth(PLOT_COUNT - 1).wait_for(state="attached", timeout=60_000)
    yield Dashboard(page, external)
    context.close()
    assert set(external) <= FONT_HOSTS, f"the page needed hosts besides the server: {sorted(set(external))}"


def test_dashboard_runs_an_episode_and_plots_it(dashboard):
    page, status = dashboard.page, dashboard.status
    plots = page.locator(".llmserve-plot")
    assert plots.count() == PLOT_COUNT
    assert plots.evaluate_all(COUNT_POINTS) == [0] * PLOT_COUNT, "plots hold data before any episode"

    page.locator("#dash-new").click()
    status.get_by_text("window 0/").wait_for(timeout=60_000)
    page.locator("#dash-step").click()
    status.get_by_text("window 1/").wait_for(timeout=60_000)
    page.locator("#dash-step").click()
    status.get_by_text("window 2/").wait_for(timeout=60_000)
    page.wait_for_function(  # two windows: two points per line of the TTFT plot
        f"() => ({COUNT_POINTS})([...document.querySelectorAll('.llmserve-plot')])[0] >= 4",
        timeout=60_000,
    )

    dashboard.choose("dash-task", TASK)
    page.locator("#dash-run").click()
    grade = page.locator("#dash-grade")
    grade.get_by_text("Grade:").wait_for(timeout=180_000)
    assert re.search(r"Grade: [01]\.\d{3}", grade.inner_text())
    finished = re.search(rf"task {TASK}, .*finished, window (\d+)/\1", status.inner_text())
    assert finished, status.inner_text()
    horizon = int(finished.group(1))

    # Vega renders after the data arrives: wait until the last plot has its points.
    page.wait_for_function(
        f"() => ({COUNT_POINTS})([...document.querySelectorAll('.llmserve-plot')])"
        f".every(n => n >= {horizon // 2})",
        timeout=60_000,
    )
    points = plots.evaluate_all(COUNT_POINTS)
    assert min(points) >= horizon // 2, points
    assert points[0] >= 2 * horizon, f"TTFT plot lacks its p50/p99 series: {points}"
    assert plots.evaluate_all(COUNT_LINES)[-1] == len(TENANTS), "one attainment line per tenant"
    legends = plots.evaluate_all(LEGENDS)
    assert legends[-1] == list(TENANTS), f"attainment legend {legends[-1]}: stale series are not drawn"
    assert legends[0] == ["p50 TTFT", "p99 TTFT", *(f"SLO {t}" for t in TENANTS)], legends[0]
    tenants = page.locator("#dash-tenants").inner_text()
    assert all(name in tenants for name in TENANTS), tenants

    # Grow the viewport to the whole page first: a full-page capture would resize it and catch
    # Vega re-laying out every plot.
    height = page.evaluate("() => document.documentElement.scrollHeight")
    page.set_viewport_size({"width": 1440, "height": height})
    page.wait_for_timeout(2_000)
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT))
    print(f"dashboard screenshot: {SCREENSHOT}")


def test_manual_knobs_drive_the_episode(dashboard):
    page = dashboard.page
    dashboard.choose("dash-policy", "Manual knobs (set below)")
    page.get_by_text("Manual knobs (used when").click()
    dashboard.set_slider("dash-batch", "7")
    page.locator("#dash-quant").get_by_text("INT8").click()
    expect(page.locator("#dash-quant input[value=INT8]")).to_be_checked()
    page.locator("#dash-step").click()
    dashboard.status.get_by_text("policy manual: running, window 1/").wait_for(timeout=60_000)
    table = page.locator("#dash-actions")
    table.get_by_text("INT8").first.wait_for(state="attached", timeout=30_000)
    # The action timeline's first row: step 1, batch cap 7, KV 0.9, speculation 0, INT8.
    assert re.search(r"\b1\s+7\s+0\.9\s+0\s+INT8\b", table.inner_text()), table.inner_text()
