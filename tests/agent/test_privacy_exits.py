"""Privacy on every way out of the agent: a request's cookie, authorization header, body,
query string and path parameters appear in none of the JSONL records, the agent's stderr,
its /metrics text or the OTLP export (raw protobuf bytes as posted to a receiver on
loopback), while the span itself does arrive with its path and the query's traceparent —
over HTTP/1.1 and over HTTP/2, whose header blocks the agent decodes whole (HPACK)."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from parallax_contracts import trace_context
from tests.agent.helpers import PY, Agent, OtlpReceiver, Proc, http_request, leaks

pytestmark = pytest.mark.ebpf


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Agent, OtlpReceiver]]:
    tmp: Path = tmp_path_factory.mktemp("privacy")
    rx = OtlpReceiver()
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp / "t.jsonl")])
    port = srv.port()
    try:
        agent = Agent(tmp, [port], ["--otlp", rx.url])
    except Exception:
        srv.stop()
        rx.close()
        raise
    yield port, agent, rx
    agent.stop()
    srv.stop()
    rx.close()


def test_secrets_leave_by_no_exit(env: tuple[int, Agent, OtlpReceiver]) -> None:
    port, agent, rx = env
    uid = trace_context.new_span_id()
    secrets = {
        "cookie": f"secret-cookie-{uid}",
        "auth": f"secret-token-{uid}",
        "body": f"secret-body-{uid}",
        "query": f"secret-query-{uid}",
        "param": f"secret-param-{uid}",
        "header": f"secret-header-{uid}",
    }
    ctx = trace_context.generate()
    path = f"/priv-{uid}"
    body = f'{{"prompt": "{secrets["body"]}"}}'.encode()
    # the traceparent rides in the query (as EventSource sends it), behind the secret one
    target = f"{path};jsessionid={secrets['param']}?{secrets['query']}&traceparent={ctx.header()}"
    head = (
        f"POST {target} HTTP/1.1\r\nHost: t\r\n"
        f"Cookie: session={secrets['cookie']}\r\n"
        f"Authorization: Bearer {secrets['auth']}\r\n"
        f"X-Api-Key: {secrets['header']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    assert http_request(port, head + body).startswith(b"HTTP/1.1 200")
    # the same secrets in a head too large for the capture window (the overflow path)
    big = (
        f"GET {path}-big?{secrets['query']} HTTP/1.1\r\nHost: t\r\n"
        f"Cookie: session={secrets['cookie']}\r\nX-Pad: {'p' * 5000}\r\n"
        f"Authorization: Bearer {secrets['auth']}\r\nConnection: close\r\n\r\n"
    ).encode()
    assert http_request(port, big).startswith(b"HTTP/1.1 200")
    [rec] = agent.wait_for(lambda r: r["path"] == path)
    assert rec["trace_id"] == ctx.trace_id and rec["parent_span_id"] == ctx.span_id
    assert rec["method"] == "POST" and rec["bytes_in"] == len(head) + len(body)
    assert agent.wait_for(lambda r: r["path"] == f"{path}-big")
    url = f"http://127.0.0.1:{agent.metrics_port}/metrics"
    metrics = urllib.request.urlopen(url, timeout=5).read()
    assert b"parallax_agent_requests_total" in metrics  # /metrics did answer
    assert agent.stop() == 0  # SIGTERM flushes the span exporter
    deadline = time.monotonic() + 5
    while not any(path.encode() in b for _, b in rx.posts) and time.monotonic() < deadline:
        time.sleep(0.1)
    otlp = b"".join(rx.traces())
    # the span arrived: its path and its parent's trace id (16 raw bytes) are in the export
    assert path.encode() in otlp and bytes.fromhex(ctx.trace_id) in otlp, len(otlp)
    exits = {
        "jsonl": agent.jsonl.read_bytes(),
        "stderr": agent.err.read_bytes(),
        "metrics": metrics,
        "otlp": otlp,
    }
    found = leaks(exits, secrets)
    assert not found, found


def test_h2_secrets_leave_by_no_exit(tmp_path: Path) -> None:
    """The same over HTTP/2 (h2c, Hypercorn): the agent decodes every header block (HPACK's
    dynamic table needs it) and keeps only the documented fields; the cookie, authorization,
    other headers, body, query and path parameters leave by no exit."""
    rx = OtlpReceiver()
    srv = Proc([PY, "-m", "tests.agent.servers.h2_app", "--timing-log", str(tmp_path / "t.jsonl")])
    try:
        port = srv.port()
        agent = Agent(tmp_path, [port], ["--otlp", rx.url])
    except Exception:
        srv.stop()
        rx.close()
        raise
    try:
        uid = trace_context.new_span_id()
        secrets = {
            k: f"secret-{k}-{uid}" for k in ("cookie", "auth", "body", "query", "param", "header")
        }
        ctx = trace_context.generate()
        path = f"/priv-{uid}"

        async def send() -> None:
            async with httpx.AsyncClient(http1=False, http2=True, trust_env=False) as c:
                for _ in range(2):  # the second time, HPACK's dynamic table indexes them
                    r = await c.post(
                        f"http://127.0.0.1:{port}{path};jsessionid={secrets['param']}"
                        f"?{secrets['query']}",
                        headers={
                            "traceparent": ctx.header(),
                            "cookie": f"session={secrets['cookie']}",
                            "authorization": f"Bearer {secrets['auth']}",
                            "x-api-key": secrets["header"],
                        },
                        content=f'{{"prompt": "{secrets["body"]}"}}'.encode(),
                    )
                    assert r.http_version == "HTTP/2"

        asyncio.run(send())
        recs = agent.wait_for(lambda r: r["path"] == path, count=2)
        assert len(recs) == 2 and all(r["version"] == "2" for r in recs), recs
        assert recs[0]["trace_id"] == ctx.trace_id and recs[0]["method"] == "POST"
        metrics = urllib.request.urlopen(
            f"http://127.0.0.1:{agent.metrics_port}/metrics", timeout=5
        ).read()
        assert agent.stop() == 0
        deadline = time.monotonic() + 5
        while not any(path.encode() in b for _, b in rx.posts) and time.monotonic() < deadline:
            time.sleep(0.1)
        otlp = b"".join(rx.traces())
        assert path.encode() in otlp
        exits = {
            "jsonl": agent.jsonl.read_bytes(),
            "stderr": agent.err.read_bytes(),
            "metrics": metrics,
            "otlp": otlp,
        }
        found = leaks(exits, secrets)
        assert not found, found
    finally:
        agent.stop()
        srv.stop()
        rx.close()
