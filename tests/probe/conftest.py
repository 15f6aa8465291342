"""Fixtures for the probe's end-to-end tests: real Chromium (Debian's, through Playwright),
the shared LLM-style server (demo.llm_app) with its timing log, and the beacon sink."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser

from demo.browser import chromium
from tests.probe.sink import LLM_JS, OTEL_JS, PROBE_JS, READER_JS, ROOT, Sink


def _built() -> None:
    """The probe, its token reader and the test bundles, built from js_probe/ if missing.
    Under a lock: pytest's workers (``-n``) would otherwise build the same files at once,
    and one could load a bundle the other is halfway through writing."""
    if not (ROOT / "js_probe" / "node_modules").exists():
        pytest.fail("js_probe/node_modules missing: run `make setup` (npm ci) first")
    with open(ROOT / "js_probe" / "node_modules" / ".parallax-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all(f.exists() for f in (PROBE_JS, READER_JS, OTEL_JS, LLM_JS)):
            return
        r = subprocess.run(
            ["node", "build.mjs", "--otel"],
            cwd=ROOT / "js_probe",
            capture_output=True,
            text=True,
            timeout=120,
        )
    if r.returncode != 0:
        pytest.fail(f"js_probe build failed: {r.stderr.strip() or r.stdout.strip()}")


class LlmServer:
    """``python -m demo.llm_app`` on a free loopback port, with its JSONL timing log."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "demo.llm_app",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--timing-log",
                str(log),
                "--first-token-ms",
                "100",
                "--token-gap-ms",
                "30",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "llm_app: listening on http://127.0.0.1:PORT"
        if "listening on" not in line:
            self.proc.kill()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"demo.llm_app did not start: {line} {err}")
        self.url = line.strip().rsplit(" ", 1)[-1]
        self.port = int(self.url.rsplit(":", 1)[-1])

    def records(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(x) for x in self.log.read_text().splitlines() if x.strip()]

    def wait_record(self, pred: Any, timeout_s: float = 10.0, after: int = 0) -> dict[str, Any]:
        """The first record matching ``pred`` among those from index ``after`` on."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for r in self.records()[after:]:
                if pred(r):
                    return r
            time.sleep(0.05)
        raise AssertionError(f"no matching server record within {timeout_s}s")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


@pytest.fixture(scope="session")
def probe_built() -> None:
    _built()


@pytest.fixture(scope="session")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlmServer]:
    s = LlmServer(tmp_path_factory.mktemp("llm") / "timing.jsonl")
    yield s
    s.close()


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink()
    yield s
    s.close()


@pytest.fixture(scope="module")
def browser(probe_built: None) -> Iterator[Browser]:
    # Module scope: Playwright's sync API runs an event loop in this thread while it is
    # open, which would break every later test that uses asyncio or its own Playwright.
    with chromium() as b:
        yield b
