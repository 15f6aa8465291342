"""Per-request sampling decided in the kernel (bpf/agent/sample.h), on real servers with the
real agent at a fixed probability (--sample-fixed): every request counted; the kept share
uniform and independent of time; a request carrying a traceparent kept or dropped by its
trace id exactly as the contract's rule says, so two processes serving the same trace agree;
a kept request after dropped ones on the same connection framed whole."""

from __future__ import annotations

import math
import socket
from pathlib import Path
from typing import Any

import pytest

from parallax_contracts import sampling, trace_context
from tests.agent.helpers import PY, Agent, Proc, http_request, read_response

pytestmark = pytest.mark.ebpf

P = 0.3
TH32 = sampling.th32_for(P)
TH = sampling.th_from_th32(TH32)


def _server(tmp: Path, name: str) -> Proc:
    # --nodelay: the head and the body are two writes; with Nagle each request waits for
    # the client's delayed ACK (~20 ms, 30 s for the 1,500 below)
    args = ["--timing-log", str(tmp / name), "--nodelay"]
    return Proc([PY, "-m", "tests.agent.servers.py_server", *args])


def _seen(agent: Agent, port: int) -> float:
    return agent.metrics().get(f'parallax_agent_requests_seen_total{{port="{port}"}}', 0.0)


def test_uniform_and_every_request_counted(tmp_path: Path) -> None:
    """1,500 requests without traceparent on keep-alive connections, at p = 0.3: the kept
    count is binomial (within 4 sigma), in each of five consecutive blocks of requests too
    (no stretch empty or full), and the kernel counts all 1,500 exactly."""
    srv = _server(tmp_path, "t")
    port = srv.port()
    agent = Agent(tmp_path, [port], ["--sample-fixed", str(P)])
    n, blocks = 1500, 5
    try:
        assert "sampling fixed at 30 %" in agent.err.read_text()
        conns = [socket.create_connection(("127.0.0.1", port), 5) for _ in range(3)]
        for i in range(n):
            s = conns[i % len(conns)]
            s.sendall(f"GET /r/{i}?n=5 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert read_response(s).startswith(b"HTTP/1.1 200")
        for s in conns:
            s.close()
        agent.wait_metric(
            f'parallax_agent_requests_seen_total{{port="{port}"}}', lambda v: v >= n, 10
        )
        kept = agent.wait_for(lambda r: r["path"].startswith("/r/"), n, timeout=3)
        m = agent.metrics()
    finally:
        assert agent.stop() == 0
        srv.stop()
    assert m[f'parallax_agent_requests_seen_total{{port="{port}"}}'] == n
    assert m[f'parallax_agent_requests_traced_total{{port="{port}"}}'] == len(kept)
    assert m[f'parallax_agent_request_ttfb_seconds_count{{port="{port}"}}'] == n
    sd = math.sqrt(n * P * (1 - P))
    assert abs(len(kept) - n * P) <= 4 * sd, (len(kept), n * P)
    assert {r["sample_th"] for r in kept} == {sampling.th_hex(TH)}
    per = n // blocks
    sd_b = math.sqrt(per * P * (1 - P))
    index = [int(r["path"].split("/")[2]) for r in kept]
    assert len(set(index)) == len(index)  # no request recorded twice
    for b in range(blocks):
        k = sum(b * per <= i < (b + 1) * per for i in index)
        assert abs(k - per * P) <= 4 * sd_b, (b, k)


def test_a_trace_is_kept_or_dropped_alike_in_two_processes(tmp_path: Path) -> None:
    """The same traceparent sent to two servers (a proxy and its upstream, say): each
    request kept exactly when the contract's rule keeps its trace id — the header in one
    process, the query parameter (EventSource, WebSocket) in the other."""
    a, b = _server(tmp_path, "a"), _server(tmp_path, "b")
    pa, pb = a.port(), b.port()
    agent = Agent(tmp_path, [pa, pb], ["--sample-fixed", str(P)])
    ids = [trace_context.generate() for _ in range(300)]
    try:
        sa_, sb_ = (socket.create_connection(("127.0.0.1", p), 5) for p in (pa, pb))
        for ctx in ids:
            head = f"GET /plain?n=3 HTTP/1.1\r\nHost: x\r\ntraceparent: {ctx.header()}\r\n\r\n"
            assert http_request(pa, head.encode(), sa_).startswith(b"HTTP/1.1 200")
            line = f"GET /plain?n=3&traceparent={ctx.header()} HTTP/1.1\r\nHost: x\r\n\r\n"
            assert http_request(pb, line.encode(), sb_).startswith(b"HTTP/1.1 200")
        sa_.close()
        sb_.close()
        want = {c.trace_id for c in ids if sampling.keeps(c.trace_id, TH)}
        agent.wait_for(lambda r: r["trace_id"] in want, 2 * len(want), timeout=10)
        recs = agent.records()
    finally:
        assert agent.stop() == 0
        a.stop()
        b.stop()
    kept_a = {r["trace_id"] for r in recs if r["local_port"] == pa}
    kept_b = {r["trace_id"] for r in recs if r["local_port"] == pb}
    assert kept_a == kept_b == want
    assert 0.15 < len(want) / len(ids) < 0.45  # (the rule itself keeps about 30 %)


def test_a_kept_request_after_dropped_ones_is_whole(tmp_path: Path) -> None:
    """On one keep-alive connection, requests the kernel dropped (their reads and writes
    never reach user space) then one it keeps: that record is whole — its own path and
    status, server TTFB, no accept-queue wait (it is not the connection's first)."""
    srv = _server(tmp_path, "t")
    port = srv.port()
    agent = Agent(tmp_path, [port], ["--sample-fixed", str(P)])
    try:
        s = socket.create_connection(("127.0.0.1", port), 5)
        dropped = 0
        kept: trace_context.TraceContext | None = None
        for _ in range(400):
            ctx = trace_context.generate()
            path = "/stream?n=3&gap_ms=1" if sampling.keeps(ctx.trace_id, TH) else "/plain?n=9"
            head = f"GET {path} HTTP/1.1\r\nHost: x\r\ntraceparent: {ctx.header()}\r\n\r\n"
            assert http_request(port, head.encode(), s).startswith(b"HTTP/1.1 200")
            if sampling.keeps(ctx.trace_id, TH):
                if dropped >= 3:
                    kept = ctx
                    break
            else:
                dropped += 1
        assert kept is not None
        [rec] = agent.wait_for(lambda r: r["trace_id"] == kept.trace_id)
        s.close()
    finally:
        assert agent.stop() == 0
        srv.stop()
    assert rec["path"] == "/stream" and rec["status"] == 200 and rec["chunks"] == 3
    assert rec["ttfb_us"] is not None and rec["accept_queue_us"] is None


def test_counts_and_probability_go_out_over_otlp(tmp_path: Path) -> None:
    """--otlp: /v1/metrics carries every request of the port (seen), the traced ones and
    the probability in force; each span's tracestate states the same threshold."""
    from parallax_contracts import agent_metrics as am
    from tests.agent.helpers import OtlpReceiver

    srv = _server(tmp_path, "t")
    port = srv.port()
    rx = OtlpReceiver()
    n = 200
    try:
        agent = Agent(tmp_path, [port], ["--sample-fixed", str(P), "--otlp", rx.url])
        try:
            s = socket.create_connection(("127.0.0.1", port), 5)
            for i in range(n):
                s.sendall(f"GET /r/{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                assert read_response(s).startswith(b"HTTP/1.1 200")
            s.close()
            agent.wait_metric(
                f'parallax_agent_requests_seen_total{{port="{port}"}}', lambda v: v >= n, 10
            )
        finally:
            assert agent.stop() == 0  # flushes spans and metrics
    finally:
        srv.stop()
        rx.close()
    spans = rx.spans()
    assert {sp.trace_state for sp in spans} == {f"ot=th:{sampling.th_hex(TH)}"}
    last = {name: ms[-1] for name, ms in rx.metrics().items()}

    def by_port(metric: Any) -> dict[int, int]:
        return {
            next(a.value.int_value for a in d.attributes if a.key == am.SERVER_PORT): d.as_int
            for d in metric.sum.data_points
        }

    assert by_port(last[am.REQUESTS_SEEN.name])[port] == n
    # named by the port's owner, even before any of its records passed
    named = {
        a.value.string_value
        for d in last[am.REQUESTS_SEEN.name].sum.data_points
        for a in d.attributes
        if a.key == am.SERVICE_NAME
    }
    assert len(named) == 1, named
    assert by_port(last[am.REQUESTS_TRACED.name])[port] == len(spans)
    prob = last[am.SAMPLING_PROBABILITY.name].gauge.data_points[-1].as_double
    assert prob == pytest.approx(P, abs=1e-6)
