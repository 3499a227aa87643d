"""The dashboard in a real browser: serve it, open headless Chromium, wait for what a user sees.

Shared by the browser tests, the first-view benchmark (:mod:`infra.tools.bench.study_dashboard`)
and the docs screenshots (:mod:`infra.tools.screenshots`). Chromium is Debian's
``/usr/bin/chromium`` driven by Playwright (a dev dependency, imported only here and only when
used); it is started with no network features of its own, and the dashboard listens on 127.0.0.1
only.

Usage::

    with dashboard_server(Path("results")) as url, chromium_browser() as browser:
        page = browser.new_page()
        open_page(page, f"{url}/study?study=my-study", ".st-key-chart-latency-throughput")
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dashboards import launch
from infra import procs
from infra.ports import free_port

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
EXCEPTION_SELECTOR = '[data-testid="stException"]'


class DashboardError(RuntimeError):
    """The dashboard server did not come up, or a page showed a Streamlit exception."""


@contextmanager
def dashboard_server(
    results_dir: Path, log_path: Path | None = None, timeout_s: float = 90.0,
    app: Path = launch.APP_PATH,
) -> Iterator[str]:
    """Serve the dashboard (or another ``app`` script, the same way) on a free localhost port;
    yields its base URL; stops it (and every child) on exit, SIGTERM first, SIGKILL after 15 s."""
    port = free_port()
    command = launch.build_command(results_dir, port, "127.0.0.1", app)
    # its own process group, so the stop reaches every child; a temporary log if none is asked
    with procs.running(command, name="dashboard", log_path=log_path, grace_s=15.0) as server:
        wait_for_port(server, port, timeout_s)
        yield f"http://127.0.0.1:{port}"


def wait_for_port(server: procs.ManagedProcess, port: int, timeout_s: float) -> None:
    try:
        server.wait_ready(port=port, timeout_s=timeout_s, interval_s=0.3)
    except procs.ProcessStartError as exc:
        raise DashboardError(f"dashboard did not listen on {port}: {exc}") from None


@contextmanager
def chromium_browser() -> Iterator[Any]:
    """Headless Debian Chromium under Playwright; closed on exit."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        raise DashboardError(f"needs Debian chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


# True once the ready element is drawn (a box on screen; an <img> decoded) or an exception shows.
_READY_OR_EXCEPTION_JS = """([ready, exception]) => {
  const element = document.querySelector(ready);
  if (element) {
    const box = element.getBoundingClientRect();
    const style = getComputedStyle(element);
    if (box.width > 0 && box.height > 0 && style.visibility !== "hidden"
        && (element.tagName !== "IMG" || (element.complete && element.naturalWidth > 0))) {
      return true;
    }
  }
  return document.querySelector(exception) !== null;
}"""


class NetworkChanged(DashboardError):
    """Chromium dropped the page's requests (``net::ERR_NETWORK_CHANGED``): another process on
    the machine added or removed a network interface (dockerd, a container, a network
    namespace), and Chromium aborts every request in flight when it sees one. The page stays
    blank; nothing in the dashboard is wrong."""


NETWORK_CHANGED = "net::ERR_NETWORK_CHANGED"


def open_page(page: Any, url: str, ready_selector: str, timeout_ms: int = 90_000,
              retries: int = 2) -> float:
    """Go to ``url`` and wait until ``ready_selector`` (CSS) is drawn; seconds it took.

    The check runs in the page on every animation frame, so the time is the frame that drew
    it. (Playwright's ``locator.wait_for`` polls at 0, 20, 70, 170, 270 ms and then every 500
    ms: a first view timed with it lands on one of those ticks, up to half a second late.)
    Raises :class:`DashboardError` with the exception text when the page shows a Streamlit
    exception first. When Chromium drops the page's requests for a network change
    (:class:`NetworkChanged`), it loads the page again, up to ``retries`` times, and returns the
    time of the load that drew; with ``retries=0`` it raises :class:`NetworkChanged` at once (a
    benchmark redoes such a view in a new context, so a retry does not count a warmer cache).
    """
    dropped: list[str] = []

    def on_failed(request: Any) -> None:
        if NETWORK_CHANGED in (request.failure or ""):
            dropped.append(request.url)

    page.on("requestfailed", on_failed)
    try:
        for attempt in range(retries + 1):
            dropped.clear()
            try:
                return _timed_load(page, url, ready_selector, timeout_ms, dropped)
            except NetworkChanged:
                if attempt == retries:
                    raise
        raise AssertionError("unreachable")
    finally:
        page.remove_listener("requestfailed", on_failed)


def _timed_load(page: Any, url: str, ready_selector: str, timeout_ms: int,
                dropped: list[str]) -> float:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    started = time.perf_counter()
    try:
        page.goto(url, timeout=timeout_ms)
    except PlaywrightError as exc:
        if NETWORK_CHANGED in str(exc):
            raise NetworkChanged(f"{url}: {NETWORK_CHANGED} on the page itself") from None
        raise
    deadline = started + timeout_ms / 1000
    while True:
        # in slices, so a page whose requests Chromium dropped is known within a second
        slice_ms = max(1, min(1_000, int((deadline - time.perf_counter()) * 1000)))
        try:
            page.wait_for_function(_READY_OR_EXCEPTION_JS,
                                   arg=[ready_selector, EXCEPTION_SELECTOR], polling="raf",
                                   timeout=slice_ms)
            break
        except PlaywrightTimeout:
            if dropped:
                raise NetworkChanged(f"{url}: Chromium dropped {len(dropped)} request(s) "
                                     f"({NETWORK_CHANGED}), e.g. {dropped[0]}") from None
            if time.perf_counter() >= deadline:
                raise
    took = time.perf_counter() - started
    exception = page.locator(EXCEPTION_SELECTOR)
    if exception.count():
        raise DashboardError(f"{url}: {exception.first.inner_text()}")
    return took


# Streamlit's own state of the page's script run, on the app's root element
SCRIPT_DONE_SELECTOR = '[data-testid="stApp"][data-test-script-state="notRunning"]'


def wait_for_script(page: Any, timeout_ms: int = 120_000) -> None:
    """Until the page's script run has ended on the server: every element drawn (and every
    chart the server draws cached), not only the one a view waits for. A benchmark's untimed
    first visit ends here, or its first timed views share the server with the rest of that
    run (the Run page's first visit is ready at 4.2 s and done at 5.1 s, at load 15)."""
    page.wait_for_selector(SCRIPT_DONE_SELECTOR, state="attached", timeout=timeout_ms)


# True once everything on the page is drawn: Streamlit's script run ended (on a Streamlit page),
# every <img> decoded, every Vega view rendered and every web font loaded
_DRAWN_JS = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (app && app.getAttribute("data-test-script-state") !== "notRunning") return false;
  if (![...document.images].every((image) => image.complete && image.naturalWidth > 0)) {
    return false;
  }
  const views = [...document.querySelectorAll(".vega-embed, div.chart")];
  if (!views.every((view) => view.querySelector("svg.marks, canvas.marks"))) return false;
  return document.fonts.status === "loaded";
}"""


def wait_until_drawn(page: Any, timeout_ms: int = 120_000) -> None:
    """Until the whole page is drawn, checked on every animation frame: Streamlit's script run
    over (every element sent), each image decoded (a chart is a ``data:`` image, which the
    browser decodes after the element is laid out: a screenshot taken before shows no chart),
    each Vega view rendered (the dashboard's interactive charts, the static export's
    ``div.chart``) and the fonts loaded. A screenshot waits here, not on a fixed pause."""
    page.wait_for_function(_DRAWN_JS, polling="raf", timeout=timeout_ms)


def raise_on_exception(page: Any) -> None:
    """Fail when the page shows a Streamlit exception box, a traceback, or Streamlit's
    "Page not found" dialog (a link to a page path that does not exist)."""
    exception = page.locator(EXCEPTION_SELECTOR)
    if exception.count():
        raise DashboardError(exception.first.inner_text())
    if page.get_by_text("Page not found", exact=True).count():
        raise DashboardError(f"{page.url}: Streamlit says 'Page not found'")
    if "Traceback (most recent call last)" in page.content():
        raise DashboardError("the page shows a traceback")
