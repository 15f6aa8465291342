"""Headless Chromium (Debian's package) driven by Playwright, running the demo chat page.

Playwright's own browser download cannot work here (and is not wanted): it drives
/usr/bin/chromium. The flags keep Chromium off the network it would otherwise call home to
and make timings comparable (no QUIC, no GPU process).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from playwright.sync_api import Browser, Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium(
    extra_args: list[str] | None = None, env: dict[str, str | float | bool] | None = None
) -> Iterator[Browser]:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[*CHROMIUM_ARGS, *(extra_args or [])],
            env=env,
        )
        try:
            yield browser
        finally:
            browser.close()


def chat_url(app: str, collector: str | None = None, **params: Any) -> str:
    """The demo chat page on ``app``; ``collector`` is the beacon endpoint's base URL."""
    q = {k: str(v) for k, v in params.items() if v is not None}
    if collector:
        q["collector"] = collector
    return f"{app}/?{urlencode(q)}" if q else f"{app}/"


def run_chat(page: Page, kind: str, timeout_ms: float = 30_000, **pacing: Any) -> str:
    """Ask one question over ``kind`` (fetch | sse | ws) and wait for the whole answer."""
    page.set_default_timeout(timeout_ms)
    text: str = page.evaluate("([kind, extra]) => window.chat(kind, extra)", [kind, pacing or None])
    return text


def open_chat(browser: Browser, url: str, artifacts: Path | None = None) -> Page:
    page = browser.new_page()
    if artifacts is not None:
        artifacts.mkdir(parents=True, exist_ok=True)
    page.goto(url, wait_until="load")
    page.wait_for_function("typeof window.chat === 'function'")
    return page


def flush_beacons(page: Page) -> None:
    """Make the probe send what it holds, the way a real tab does when it is hidden."""
    page.evaluate(
        "() => { Object.defineProperty(document, 'visibilityState', {value: 'hidden',"
        " configurable: true}); document.dispatchEvent(new Event('visibilitychange'));"
        " Object.defineProperty(document, 'visibilityState', {value: 'visible',"
        " configurable: true}); }"
    )
