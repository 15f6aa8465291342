"""Privacy on every way out of the agent: a request's cookie, authorization header, body,
query string and path parameters appear in none of the JSONL records, the agent's stderr,
its /metrics text or the OTLP export (raw protobuf bytes as posted to a receiver on
loopback), while the span itself does arrive with its path and the query's traceparent."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

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
