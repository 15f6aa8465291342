"""An agent with non-default options: --head-window 256, and as on a kernel before 6.3:
without sock:sock_{send,recv}_length and sock:sk_data_ready (forced off with
--disable-tracepoint), the fd↔socket link falls back to the accept() peer address matched
with the handshake's 4-tuple, and t_arr to tcp_probe."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from parallax_contracts import trace_context
from tests.agent.helpers import PY, Agent, Proc, http_request

pytestmark = pytest.mark.ebpf
OFF = ["sock:sock_send_length", "sock:sock_recv_length", "sock:sk_data_ready"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Agent]]:
    tmp = tmp_path_factory.mktemp("degraded")
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp / "t.jsonl")])
    port = srv.port()
    extra = [x for tp in OFF for x in ("--disable-tracepoint", tp)] + ["--head-window", "256"]
    try:
        agent = Agent(tmp, [port], extra)
    except Exception:
        srv.stop()
        raise
    yield port, agent
    rc = agent.stop()
    srv.stop()
    assert rc == 0


def test_degradations_are_announced(setup: tuple[int, Agent]) -> None:
    _, agent = setup
    err = agent.err.read_text()
    ready = next(ln for ln in err.splitlines() if "attached" in ln)
    for tp in OFF:
        assert tp in ready
    # each degradation logged once
    assert (
        sum(
            ln.startswith("parallax-agent: degraded:") and "sock:sk_data_ready" in ln
            for ln in err.splitlines()
        )
        == 1
    )


def test_requests_still_timed_by_the_tuple_link(setup: tuple[int, Agent]) -> None:
    port, agent = setup
    ctxs = [trace_context.generate() for _ in range(2)]
    for ctx in ctxs:
        head = f"GET /deg?n=20 HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n"
        http_request(port, (head + "Connection: close\r\n\r\n").encode())
    for ctx in ctxs:
        tid = ctx.trace_id
        [r] = agent.wait_for(lambda r: r["trace_id"] == tid)  # noqa: B023
        assert r["path"] == "/deg" and r["status"] == 200
        assert r["ttfb_us"] is not None and r["accept_queue_us"] is not None
        assert r["arrival_unix_ns"]  # from tcp_probe segments with data


def test_traceparent_beyond_the_window_is_missed_not_guessed(setup: tuple[int, Agent]) -> None:
    port, agent = setup
    ctx = trace_context.generate()
    head = (
        f"GET /wide HTTP/1.1\r\nHost: x\r\nX-Pad: {'a' * 400}\r\n"
        f"traceparent: {ctx.header()}\r\nConnection: close\r\n\r\n"
    )
    assert http_request(port, head.encode()).startswith(b"HTTP/1.1 200")
    [r] = agent.wait_for(lambda r: r["path"] == "/wide")
    assert r["traceparent_missed"] is True
    assert r["trace_id"] != ctx.trace_id and r["parent_span_id"] is None


def test_per_syscall_tracepoints_when_raw_tracepoints_are_off(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The fallback for kernels or architectures without the raw syscall path: the same
    records from the per-syscall tracepoints (keep-alive, a stream, close)."""
    tmp = tmp_path_factory.mktemp("persyscall")
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp / "t.jsonl")])
    port = srv.port()
    agent = Agent(
        tmp, [port], ["--io-hooks", "syscalls", "--disable-tracepoint", "raw_syscalls:sys_enter"]
    )
    try:
        ready = next(ln for ln in agent.err.read_text().splitlines() if "attached" in ln)
        assert "raw_syscalls:sys_enter" in ready
        ctx = trace_context.generate()
        head = f"GET /stream?n=5&gap_ms=10 HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n"
        http_request(port, (head + "Connection: close\r\n\r\n").encode())
        [r] = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id)
        assert r["chunks"] == 5 and r["ttfb_us"] is not None and r["partial"] is False
    finally:
        rc = agent.stop()
        srv.stop()
    assert rc == 0
