"""Where real Chromium puts ``traceparent`` among its request headers (docs/agent.md).

A same-origin fetch with a traceparent header, sent by Chromium through Playwright to a raw
socket server that dumps the request head. The head must fit the agent's default window
with traceparent inside it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from demo.browser import chromium
from parallax_contracts import trace_context
from tests.agent.helpers import PY, Proc

pytestmark = pytest.mark.browser


def test_chromium_header_order(tmp_path: Path) -> None:
    dump = tmp_path / "heads.jsonl"
    srv = Proc(
        [
            PY,
            "-m",
            "tests.agent.servers.raw_server",
            "--timing-log",
            str(tmp_path / "t.jsonl"),
            "--dump",
            str(dump),
        ]
    )
    try:
        port = srv.port()
        ctx = trace_context.generate()
        with chromium() as b:
            page = b.new_page()
            page.goto(f"http://127.0.0.1:{port}/page", timeout=15000)
            status = page.evaluate(
                "async (tp) => (await fetch('/api', {headers: {traceparent: tp}})).status",
                ctx.header(),
            )
            assert status == 200
    finally:
        srv.stop()
    heads = [json.loads(x) for x in dump.read_text().splitlines()]
    api = next(h for h in heads if h.startswith("GET /api "))
    names = [ln.split(":", 1)[0].lower() for ln in api.split("\r\n")[1:] if ":" in ln]
    print("chromium header order:", names)
    assert "traceparent" in names
    # the whole head fits the default 4 KB capture window, traceparent included
    assert api.lower().index("traceparent") < 4096 and len(api) < 4096
