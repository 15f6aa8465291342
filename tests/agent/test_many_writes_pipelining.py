"""Two framing limits against the real kernel and Python's http.server: a response of more
than 256 body writes (the kernel keeps the first 256 write timestamps, then only counts and
sums), and pipelined requests (several complete requests in one client write, answered in
order on a keep-alive connection).

One agent per kernel path (socket hooks, syscall tracepoints). The server records
CLOCK_MONOTONIC when its read of each request line returned and before each write; the
agent's figures must agree within 1 ms.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from parallax_contracts import trace_context
from tests.agent.helpers import PY, Agent, Proc, attempts, http_request, timing_log, tracepoints

pytestmark = pytest.mark.ebpf
TOL_US = 1000
KEPT = 256  # body-write timestamps the kernel keeps per response (bpf/agent.c PX_CHUNKS)


# both kernel paths: the socket hooks this kernel runs, and the syscall tracepoints older
# kernels get (the hidden --io-hooks flag forces them); the write aggregation is shared, the
# read and write capture differ
@pytest.fixture(scope="module", params=["auto", "syscalls"])
def env(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[int, Agent, Path]]:
    tmp = tmp_path_factory.mktemp(f"writes-{request.param}")
    log = tmp / "t.jsonl"
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(log)])
    port = srv.port()
    try:
        agent = Agent(tmp, [port], ["--io-hooks", request.param])
    except Exception:
        srv.stop()
        raise
    try:
        # the parameter took effect: syscall tracepoints attached only on that path
        sys_tps = any("sys_e" in t for t in tracepoints(agent))
        assert sys_tps == (request.param == "syscalls"), tracepoints(agent)
        # warm-up: the server's first requests take its slow paths (imports, allocations)
        http_request(port, b"GET /warm?n=10 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    except Exception:
        agent.stop()
        srv.stop()
        raise
    yield port, agent, log
    rc = agent.stop()
    srv.stop()
    assert rc == 0, agent.err.read_text()[-2000:]
    assert "Traceback" not in agent.err.read_text()


def _server_recs(log: Path, pred: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    return [r for r in timing_log(log) if pred(r)]


def _read_responses(c: socket.socket, n: int) -> list[bytes]:
    """``n`` Content-Length framed responses from one connection (they may share a read)."""
    buf, out = b"", list[bytes]()
    while len(out) < n:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            length = int(buf[:end].lower().split(b"content-length:")[1].split(b"\r\n")[0])
            if len(buf) >= end + 4 + length:
                out.append(buf[: end + 4 + length])
                buf = buf[end + 4 + length :]
                continue
        d = c.recv(65536)
        assert d, f"connection closed after {len(out)} responses"
        buf += d
    return out


def test_more_than_256_body_writes(env: tuple[int, Agent, Path]) -> None:
    port, agent, log = env
    n_writes = 300

    def check() -> None:
        ctx = trace_context.generate()
        req = (
            f"GET /stream?n={n_writes}&gap_ms=0.2 HTTP/1.1\r\nHost: t\r\n"
            f"traceparent: {ctx.header()}\r\nConnection: close\r\n\r\n"
        ).encode()
        resp = http_request(port, req, timeout=10)
        assert resp.endswith(b"0\r\n\r\n") and resp.count(b"token-") == n_writes
        [r] = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id)
        [srv] = _server_recs(log, lambda x: x["traceparent"] == ctx.header())
        t_read, writes = srv["t_read_ns"], srv["t_writes_ns"]
        body = writes[1:]  # the first write is the head alone (no body bytes)
        assert len(body) == n_writes
        assert r["chunks"] == n_writes, r["chunks"]  # counted beyond the kept timestamps
        offs = r["chunk_offsets_us"]
        assert len(offs) == KEPT, len(offs)
        assert offs == sorted(offs)
        # the kept timestamps are the FIRST 256 writes: the first and the 256th line up with
        # the server's clock (the 256th is ≥ 255 gaps of 0.2 ms from the first)
        for i in (0, KEPT // 2, KEPT - 1):
            assert abs(offs[i] - (body[i] - t_read) / 1000) <= TOL_US, (i, offs[i])
        assert abs(r["ttft_us"] - (body[0] - t_read) / 1000) <= TOL_US
        assert abs(r["ttfb_us"] - (writes[0] - t_read) / 1000) <= TOL_US
        # every byte written counts, the 44 writes past the kept timestamps included
        assert r["bytes_out"] == len(resp), (r["bytes_out"], len(resp))
        # the record ends at the last write (the terminator just after the last chunk),
        # not at the 256th
        last_us = (body[-1] - t_read) / 1000
        assert last_us - TOL_US <= r["duration_us"] <= last_us + TOL_US, (r, last_us)
        assert r["duration_us"] - offs[-1] >= (n_writes - KEPT) * 200 - TOL_US
        assert r["status"] == 200 and r["path"] == "/stream" and r["client_aborted"] is False

    attempts(check)


def test_pipelined_requests_in_one_write(env: tuple[int, Agent, Path]) -> None:
    port, agent, log = env

    def check() -> None:
        uid = trace_context.new_span_id()[:8]
        ctxs = [trace_context.generate() for _ in range(3)]
        post_body = b"pipelined-body-" + uid.encode()
        reqs = [
            # the first is slow: the two behind it wait in the server's buffer
            f"GET /p0-{uid}?n=20&delay_ms=60 HTTP/1.1\r\nHost: t\r\n"
            f"traceparent: {ctxs[0].header()}\r\n\r\n".encode(),
            # a body between two heads: the cutter must skip it to find the third request
            f"POST /p1-{uid}?n=30 HTTP/1.1\r\nHost: t\r\ntraceparent: {ctxs[1].header()}\r\n"
            f"Content-Length: {len(post_body)}\r\n\r\n".encode()
            + post_body,
            f"GET /p2-{uid}?n=40 HTTP/1.1\r\nHost: t\r\n"
            f"traceparent: {ctxs[2].header()}\r\n\r\n".encode(),
        ]
        with socket.create_connection(("127.0.0.1", port), 5) as c:
            c.settimeout(5)
            c.sendall(b"".join(reqs))  # one write: the server's one read takes all three
            resps = _read_responses(c, len(reqs))
        for resp, n in zip(resps, (20, 30, 40), strict=True):
            assert resp.startswith(b"HTTP/1.1 200") and resp.endswith(b"x" * n)
        recs = agent.wait_for(lambda r: r["path"].endswith(uid), 3)
        assert [r["path"] for r in recs] == [f"/p{i}-{uid}" for i in range(3)], recs
        assert [r["method"] for r in recs] == ["GET", "POST", "GET"]
        for r, ctx, req, resp in zip(recs, ctxs, reqs, resps, strict=True):
            # each response matched to its own request (the trace ids say which)
            assert r["trace_id"] == ctx.trace_id and r["parent_span_id"] == ctx.span_id
            assert r["status"] == 200 and r["chunks"] == 1
            assert r["bytes_in"] == len(req), (r["bytes_in"], len(req))
            assert r["bytes_out"] == len(resp), (r["bytes_out"], len(resp))
        # the three were read by one read(): one start, one connection, one accept-queue figure
        assert len({r["start_unix_ns"] for r in recs}) == 1
        assert recs[0]["accept_queue_us"] is not None
        assert recs[1]["accept_queue_us"] is None and recs[2]["accept_queue_us"] is None
        # ttfb runs from that read to each response's head: the 60 ms the first request slept
        # shows in all three, in order
        ttfb = [r["ttfb_us"] for r in recs]
        assert 55_000 <= ttfb[0] <= ttfb[1] <= ttfb[2] < 5_000_000, ttfb
        srv = sorted(
            _server_recs(log, lambda x: str(x["path"]).endswith(uid)), key=lambda x: x["t_read_ns"]
        )
        assert [x["path"] for x in srv] == [r["path"] for r in recs]
        t_read0 = srv[0]["t_read_ns"]  # the server's clock after the one read
        for r, x in zip(recs, srv, strict=True):
            assert abs(r["ttfb_us"] - (x["t_writes_ns"][0] - t_read0) / 1000) <= TOL_US, (r, x)

    attempts(check)
