"""Kernel timings against the servers' own clocks: Python http.server, an async SSE app under
uvicorn (demo/llm_app.py), and Node's http — plus the accept- and receive-queue waits.

One agent for the module (bcc compiles once). Each server records CLOCK_MONOTONIC when its
read returned and before each write; the agent's figures must agree within 1 ms.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.stack import free_port
from parallax_contracts import trace_context
from tests.agent.helpers import (
    PY,
    Agent,
    Proc,
    attempts,
    check_node_timing,
    gaps,
    get_head,
    http_request,
    server_record,
    timing_log,
    wait_port,
)

pytestmark = pytest.mark.ebpf
TOL_US = 1000


class Stack:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[Proc] = []
        self.logs: dict[str, Path] = {}
        self.ports: dict[str, int] = {}

    def start(self, name: str, argv: list[str], fixed_port: int | None = None) -> None:
        p = Proc(argv)
        self.procs.append(p)
        if fixed_port is None:
            self.ports[name] = p.port()
        else:
            wait_port(fixed_port)
            self.ports[name] = fixed_port

    def stop(self) -> None:
        for p in self.procs:
            p.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Agent]]:
    tmp = tmp_path_factory.mktemp("timing")
    s = Stack(tmp)
    for name in ("py", "node", "llm", "acc", "rcv"):
        s.logs[name] = tmp / f"{name}.jsonl"
    try:
        s.start(
            "py", [PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(s.logs["py"])]
        )
        if shutil.which("node"):
            s.start(
                "node", ["node", "tests/agent/servers/node_server.mjs", "0", str(s.logs["node"])]
            )
        llm_port = free_port()
        s.start(
            "llm",
            [
                PY,
                "-m",
                "demo.llm_app",
                "--port",
                str(llm_port),
                "--timing-log",
                str(s.logs["llm"]),
                "--first-token-ms",
                "60",
                "--token-gap-ms",
                "25",
                "--tokens",
                "8",
            ],
            fixed_port=llm_port,
        )
        s.start(
            "acc",
            [
                PY,
                "-m",
                "tests.agent.servers.raw_server",
                "--timing-log",
                str(s.logs["acc"]),
                "--accept-delay-ms",
                "300",
            ],
        )
        s.start(
            "rcv",
            [
                PY,
                "-m",
                "tests.agent.servers.raw_server",
                "--timing-log",
                str(s.logs["rcv"]),
                "--read-delay-ms",
                "300",
            ],
        )
        agent = Agent(tmp, list(s.ports.values()))
        # warm-up (JIT, imports, first-request paths), so the servers' clocks measure
        # steady-state handling like the kernel does
        for name in ("py", "node"):
            if name in s.ports:
                for _ in range(3):
                    http_request(
                        s.ports[name], get_head("/warm?n=10") + get_head("/stream?n=2&gap_ms=1")
                    )
        http_request(s.ports["llm"], get_head("/v1/complete"))
    except Exception:
        s.stop()
        raise
    yield s, agent
    rc = agent.stop()
    # nothing from other processes on the node (tests of other parts run alongside),
    # not even from the moment between attach and the filters being written
    stray = [r for r in agent.records() if r["local_port"] not in s.ports.values()]
    assert not stray, stray[:3]
    s.stop()
    assert rc == 0, f"agent exit {rc}: {agent.err.read_text()[-2000:]}"


def test_python_keepalive_three_requests(stack: tuple[Stack, Agent]) -> None:
    def check() -> None:
        s, agent = stack
        port = s.ports["py"]
        ctxs = [trace_context.generate() for _ in range(3)]
        uid = ctxs[0].span_id[:8]
        with socket.create_connection(("127.0.0.1", port), 5) as c:
            for i, ctx in enumerate(ctxs):
                resp = http_request(
                    port, get_head(f"/ka{i}-{uid}?n=100&secret=1", ctx.header()), sock=c
                )
                assert resp.startswith(b"HTTP/1.1 200")
        recs = agent.wait_for(lambda r: r["local_port"] == port and r["path"].endswith(uid), 3)
        assert [r["path"] for r in recs] == [f"/ka{i}-{uid}" for i in range(3)]  # query dropped
        for r, ctx in zip(recs, ctxs, strict=True):
            assert r["trace_id"] == ctx.trace_id and r["parent_span_id"] == ctx.span_id
            assert r["status"] == 200 and r["method"] == "GET"
            srv = server_record(s.logs["py"], ctx.header())
            want = (srv["t_writes_ns"][0] - srv["t_read_ns"]) / 1000
            assert abs(r["ttfb_us"] - want) <= TOL_US, (r, srv)
            assert r["bytes_out"] > 100 and r["chunks"] == 1
        # the connection's first request carries the accept-queue wait, later ones do not
        assert recs[0]["accept_queue_us"] is not None
        assert recs[1]["accept_queue_us"] is None and recs[2]["accept_queue_us"] is None
        assert all(r["recv_queue_us"] is not None and r["arrival_unix_ns"] for r in recs)

    attempts(check)


def test_python_chunked_stream(stack: tuple[Stack, Agent]) -> None:
    def check() -> None:
        s, agent = stack
        port = s.ports["py"]
        ctx = trace_context.generate()
        resp = http_request(
            port, get_head("/stream?n=6&gap_ms=40", ctx.header(), "Connection: close\r\n")
        )
        assert resp.endswith(b"0\r\n\r\n")
        [r] = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id)
        srv = server_record(s.logs["py"], ctx.header())
        t_read, writes = srv["t_read_ns"], srv["t_writes_ns"]
        assert abs(r["ttfb_us"] - (writes[0] - t_read) / 1000) <= TOL_US
        body = writes[1:]  # the header write carries no body here
        assert r["chunks"] == len(body) == 6
        assert abs(r["ttft_us"] - (body[0] - t_read) / 1000) <= TOL_US
        for got, want in zip(gaps(r["chunk_offsets_us"]), gaps(body), strict=True):
            assert abs(got - want / 1000) <= TOL_US
        assert r["client_aborted"] is False and r["duration_us"] >= 5 * 40_000

    attempts(check)


def test_node_plain_and_stream_keepalive(stack: tuple[Stack, Agent]) -> None:
    def check() -> None:
        s, agent = stack
        if "node" not in s.ports:
            pytest.skip("node not installed")
        port = s.ports["node"]
        a, b = trace_context.generate(), trace_context.generate()
        with socket.create_connection(("127.0.0.1", port), 5) as c:
            http_request(port, get_head("/plain?n=300", a.header()), sock=c)
            http_request(port, get_head("/stream?n=5&gap_ms=30", b.header()), sock=c)
        for ctx, path in ((a, "/plain"), (b, "/stream")):
            tid = ctx.trace_id
            [r] = agent.wait_for(lambda r: r["trace_id"] == tid)  # noqa: B023  (used at once)
            assert r["path"] == path and r["service"] == "node_server.mjs"  # what node runs
            srv = server_record(s.logs["node"], ctx.header())
            check_node_timing(r, srv, TOL_US)

    attempts(check)


def test_uvicorn_sse(stack: tuple[Stack, Agent]) -> None:
    def check() -> None:
        s, agent = stack
        port = s.ports["llm"]
        ctx = trace_context.generate()
        resp = http_request(
            port, get_head("/v1/stream", ctx.header(), "Accept: text/event-stream\r\n")
        )
        assert b"text/event-stream" in resp
        [r] = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id)
        srv = server_record(s.logs["llm"], ctx.header())
        assert r["path"] == "/v1/stream" and r["status"] == 200
        assert abs(r["ttfb_us"] - (srv["t_headers_ns"] - srv["t_start_ns"]) / 1000) <= TOL_US
        writes = srv["t_writes_ns"]
        assert abs(r["ttft_us"] - (writes[0] - srv["t_start_ns"]) / 1000) <= TOL_US
        assert r["chunks"] >= len(writes)
        got = gaps(r["chunk_offsets_us"][: len(writes)])
        for g, w in zip(got, gaps(writes), strict=True):
            assert abs(g - w / 1000) <= TOL_US
        assert r["ttft_us"] >= 55_000  # the first-token wait shows

    attempts(check)


def test_uvicorn_chunked_post(stack: tuple[Stack, Agent]) -> None:
    s, agent = stack
    port = s.ports["llm"]
    ctx = trace_context.generate()
    body = b'{"prompt": "private words the agent must not keep"}'
    head = (
        f"POST /v1/chat HTTP/1.1\r\nHost: t\r\ntraceparent: {ctx.header()}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Authorization: Bearer secret-token\r\nCookie: session=secret\r\n\r\n"
    ).encode()
    resp = http_request(port, head + body)
    assert resp.startswith(b"HTTP/1.1 200")
    [r] = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id)
    assert r["method"] == "POST" and r["path"] == "/v1/chat"
    assert r["bytes_in"] == len(head) + len(body) and r["chunks"] >= 8
    text = agent.jsonl.read_text() + agent.err.read_text()
    for secret in ("secret-token", "session=secret", "private words"):
        assert secret not in text  # privacy: never exported or logged


def test_uvicorn_websocket_exchanges(stack: tuple[Stack, Agent]) -> None:
    from websockets.sync.client import connect

    def check() -> None:
        s, agent = stack
        port = s.ports["llm"]
        ctx = trace_context.generate()
        with connect(
            f"ws://127.0.0.1:{port}/v1/ws?traceparent={ctx.header()}&tokens=3", open_timeout=5
        ) as ws:
            for _ in range(2):
                ws.send("hello")
                while ws.recv(timeout=5) != "[DONE]":
                    pass
                # idle, with a client ping: the server's pong (a control frame) must not
                # stretch the exchange that came before it
                time.sleep(0.3)
                ws.ping().wait(5)
            ws.send("again")  # a third exchange, ended by the close
            while ws.recv(timeout=5) != "[DONE]":
                pass
            time.sleep(0.3)  # idle before the close: the close reply is no token either
        recs = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id, 4)
        up = [r for r in recs if not r["ws_seq"]]
        ex = sorted((r for r in recs if r["ws_seq"]), key=lambda r: r["ws_seq"])
        assert len(up) == 1 and up[0]["status"] == 101 and up[0]["path"] == "/v1/ws"
        assert [r["ws_seq"] for r in ex] == [1, 2, 3]
        logs = [x for x in timing_log(s.logs["llm"]) if x.get("traceparent") == ctx.header()]
        for r in ex:
            srv = next(x for x in logs if x["ws_seq"] == r["ws_seq"])
            assert abs(r["ttft_us"] - (srv["t_writes_ns"][0] - srv["t_start_ns"]) / 1000) <= 2000
            # the exchange ends at its last data frame ([DONE]), not at a pong or the close
            last_us = (srv["t_writes_ns"][-1] - srv["t_start_ns"]) / 1000
            assert abs(r["duration_us"] - last_us) <= 2000, (r["duration_us"], last_us)
            assert r["chunks"] == len(srv["t_writes_ns"]), r

    attempts(check)


def test_accept_queue_wait(stack: tuple[Stack, Agent]) -> None:
    def check() -> None:
        s, agent = stack
        port = s.ports["acc"]
        path = "/acc-" + trace_context.new_span_id()
        # the server is already blocked in accept(): the first connection is taken at once, the
        # second waits in the accept queue while the server sleeps before its next accept()
        with (
            socket.create_connection(("127.0.0.1", port), 5) as c1,
            socket.create_connection(("127.0.0.1", port), 5) as c2,
        ):
            c1.sendall(get_head("/acc-first"))
            c2.sendall(get_head(path))
            http_request(port, b"", sock=c1)
            http_request(port, b"", sock=c2)
        [r] = agent.wait_for(lambda r: r["local_port"] == port and r["path"] == path)
        assert r["accept_queue_us"] >= 150_000, r  # the server slept ≤ 300 ms before accept()
        srv = server_record(s.logs["acc"], lambda x: x["path"] == path)
        assert abs(r["ttfb_us"] - (srv["t_writes_ns"][0] - srv["t_read_ns"]) / 1000) <= TOL_US
        assert r["ttfb_us"] < 50_000

    attempts(check)


def test_receive_queue_wait_not_in_ttfb(stack: tuple[Stack, Agent]) -> None:
    def check() -> None:
        s, agent = stack
        port = s.ports["rcv"]
        path = "/rcv-" + trace_context.new_span_id()
        http_request(port, get_head(path))
        [r] = agent.wait_for(lambda r: r["local_port"] == port and r["path"] == path)
        assert r["recv_queue_us"] >= 250_000, r  # the app read 300 ms after the bytes arrived
        assert r["ttfb_us"] < 50_000
        srv = server_record(s.logs["rcv"], lambda x: x["path"] == path)
        assert abs(r["ttfb_us"] - (srv["t_writes_ns"][0] - srv["t_read_ns"]) / 1000) <= TOL_US
        assert json.dumps(r)  # a plain JSON object

    attempts(check)
