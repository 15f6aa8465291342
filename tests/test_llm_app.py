"""The shared LLM-style app paces tokens as configured and logs its own clock truthfully."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(scope="module", params=["python", "node"])
def app(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """The Python app and its Node.js twin answer the same way."""
    log = tmp_path_factory.mktemp("llm") / "timing.jsonl"
    runtime = (
        [sys.executable, "-m", "demo.llm_app"]
        if request.param == "python"
        else ["node", "demo/llm_app.mjs"]
    )
    pacing = ["--first-token-ms", "80", "--token-gap-ms", "25", "--tokens", "6"]
    argv = [*runtime, "--port", "0", "--timing-log", str(log), *pacing]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.startswith("llm_app: listening on "), line
    yield line.split()[-1], log
    p.terminate()
    p.wait(timeout=10)


def _records(log: Path, n: int) -> list[dict[str, object]]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        lines = log.read_text().splitlines() if log.exists() else []
        if len(lines) >= n:
            return [json.loads(x) for x in lines]
        time.sleep(0.05)
    raise AssertionError(f"timing log has fewer than {n} records")


def test_chunked_stream_pacing_and_timing_log(app: tuple[str, Path]) -> None:
    base, log = app
    n0 = len(log.read_text().splitlines()) if log.exists() else 0
    req = urllib.request.Request(f"{base}/v1/chat", data=b"{}", headers={"traceparent": TP})
    t0 = time.monotonic_ns()
    arrivals = []
    with urllib.request.urlopen(req, timeout=10) as r:
        while chunk := r.read1():
            arrivals.append(time.monotonic_ns())
            assert chunk
    rec = _records(log, n0 + 1)[n0]
    assert rec["traceparent"] == TP and rec["path"] == "/v1/chat"
    writes = rec["t_writes_ns"]
    assert isinstance(writes, list) and len(writes) == 6
    # paced on a schedule (80 ms after the request body, then every 25 ms), as a model's
    # decode steps are: a late token is followed by a shorter gap, never by a drift of the
    # rest. The schedule starts at the body's end, which a busy machine delays past t_start
    # (47 ms once at load 5): the first write is 80 ms or more in, the rest keep the pace.
    offsets = [(w - rec["t_start_ns"]) / 1e6 for w in writes]
    assert offsets[0] >= 78, offsets
    assert all(25 * i - 32 <= t - offsets[0] <= 25 * i + 30 for i, t in enumerate(offsets)), offsets
    assert (arrivals[0] - t0) / 1e6 >= 78


def test_websocket_exchanges_are_numbered(app: tuple[str, Path]) -> None:
    base, log = app
    n0 = len(log.read_text().splitlines()) if log.exists() else 0

    async def talk() -> list[list[str]]:
        out = []
        url = base.replace("http", "ws") + f"/v1/ws?tokens=3&token_gap_ms=5&traceparent={TP}"
        async with websockets.connect(url) as ws:
            for _ in range(2):
                await ws.send("hello")
                got = []
                while (m := await ws.recv()) != "[DONE]":
                    got.append(str(m))
                out.append(got)
        return out

    answers = asyncio.run(asyncio.wait_for(talk(), 10))
    assert [len(a) for a in answers] == [3, 3]
    recs = _records(log, n0 + 2)[n0:]
    assert [r["ws_seq"] for r in recs] == [1, 2]
    assert all(r["traceparent"] == TP for r in recs)


def test_stream_stops_when_the_client_goes_away(app: tuple[str, Path]) -> None:
    base, log = app
    n0 = len(log.read_text().splitlines()) if log.exists() else 0
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"GET /v1/stream?tokens=1000&token_gap_ms=10 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        time.sleep(0.3)
    rec = _records(log, n0 + 1)[n0]
    writes = rec["t_writes_ns"]
    assert isinstance(writes, list)
    assert len(writes) < 100 and rec.get("client_gone") is True, len(writes)
