"""The CPU budget (--cpu-budget): over it the agent pauses tracing in the kernel and counts
the requests it skips; back under, it resumes and frames the next requests correctly."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from demo.stack import free_port
from parallax_contracts import trace_context
from tests.agent.helpers import PY, Agent, Proc, http_request, read_response, tracepoints, wait_log

pytestmark = pytest.mark.ebpf


def _wrk(port: int, seconds: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["wrk", "-t1", "-c4", f"-d{seconds}s", f"http://127.0.0.1:{port}/plain?n=10"],
        stdout=subprocess.PIPE,
        text=True,
    )


def _requests(wrk: subprocess.Popen[str], seconds: int) -> int:
    out, _ = wrk.communicate(timeout=seconds + 30)
    assert wrk.returncode == 0, out
    m = re.search(r"(\d+) requests in", out)
    assert m, out
    return int(m[1])


def _wrk_requests(port: int, seconds: int) -> int:
    return _requests(_wrk(port, seconds), seconds)


def _pauses(m: dict[str, float]) -> float:
    return sum(v for k, v in m.items() if k.startswith("parallax_agent_pauses_total{"))


def _paused_hooks(agent: Agent) -> set[str] | None:
    """The agent's tracepoints at a moment it is paused (the paused gauge read on both
    sides of the listing: a pause lasts at least a second), or None if it is not."""
    m0 = agent.metrics()
    if m0.get("parallax_agent_paused") != 1:
        return None
    hooks = tracepoints(agent)
    m1 = agent.metrics()  # still the same pause: paused, and no pause begun since
    return hooks if m1.get("parallax_agent_paused") == 1 and _pauses(m1) == _pauses(m0) else None


def _resumed_for_good(agent: Agent, timeout: float = 40.0) -> bool:
    """Tracing on, and still on 1.5 s later with no pause in between: right after a load
    the agent may resume and pause again on the backlog it is still working through (a
    request sent in that window would rightly go untraced)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m0 = agent.metrics()
        if m0.get("parallax_agent_paused") == 0:
            time.sleep(1.5)
            m1 = agent.metrics()
            if m1.get("parallax_agent_paused") == 0 and _pauses(m1) == _pauses(m0):
                return True
        time.sleep(0.2)
    return False


def test_over_budget_sheds_counts_and_recovers(tmp_path: Path) -> None:
    srv = Proc(
        [
            PY,
            "-m",
            "tests.agent.servers.py_server",
            "--timing-log",
            str(tmp_path / "t"),
            "--nodelay",
        ]
    )
    port = srv.port()
    agent = Agent(tmp_path, [port], ["--cpu-budget", "0.05"])  # the least allowed
    try:
        # a keep-alive connection that lives through the pause
        s = socket.create_connection(("127.0.0.1", port), 5)
        s.sendall(b"GET /before HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(s).startswith(b"HTTP/1.1 200")
        # py_server writes on blocking sockets: the write-start hook comes within a second
        # (so that its detach and re-attach are seen below)
        wait_log(agent, "timing write starts")
        assert "tcp_sendmsg_locked" in tracepoints(agent)
        # thousands of requests a second: far more than 0.05 cores of agent work — on a
        # quiet machine; on a busy one the server answers fewer, so load until it is over
        # (at most three rounds)
        sent = 0
        pauses = float("nan")
        hooks: set[str] | None = None
        for _ in range(3):
            wrk = _wrk(port, 4)
            deadline = time.monotonic() + 4
            while hooks is None and time.monotonic() < deadline:
                hooks = _paused_hooks(agent)  # looked at while the load runs
                time.sleep(0.1)
            sent += _requests(wrk, 4)
            pauses = agent.wait_metric(
                'parallax_agent_pauses_total{reason="cpu_budget"}', lambda v: v >= 1
            )
            if pauses >= 1 and hooks is not None:
                break
        assert pauses >= 1, "the agent never went over its budget"
        # While paused, the hooks whose programs would only return at the pause flag are
        # off the node; sock_recv_length stays (it counts the shed requests).
        assert hooks is not None, "never seen paused while over budget"
        assert "sock_send_length" not in hooks and "sk_data_ready" not in hooks, hooks
        assert "tcp_sendmsg_locked" not in hooks, hooks
        assert "sock_recv_length" in hooks and "inet_sock_set_state" in hooks, hooks
        shed = agent.wait_metric("parallax_agent_shed_requests_total", lambda v: v > 0)
        assert 0 < shed <= sent
        # idle again: tracing resumes (after at most an 8 s hold); a request on the
        # keep-alive connection that lived through the pause is recorded whole, with its
        # own arrival (not one from inside the pause), and so is one on a new connection
        assert _resumed_for_good(agent), "tracing did not resume"
        assert {"sock_send_length", "sk_data_ready", "tcp_sendmsg_locked"} <= tracepoints(agent)
        for path, sock in (("/after", s), ("/fresh", None)):
            ctx = trace_context.generate()
            head = f"GET {path} HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n\r\n"
            assert http_request(port, head.encode(), sock).startswith(b"HTTP/1.1 200")
            [r] = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id)  # noqa: B023
            assert r["path"] == path and r["status"] == 200 and r["ttfb_us"] is not None
            assert r["recv_queue_us"] is not None and r["recv_queue_us"] < 200_000
        s.close()
        # nothing recorded twice or invented: at most one record per request sent
        assert len(agent.records()) <= sent + 3
    finally:
        rc = agent.stop()
        srv.stop()
    assert rc == 0


def test_a_budget_below_the_agents_idle_work_is_refused() -> None:
    p = subprocess.run(
        [PY, "-m", "agent.cli", "run", "--cpu-budget", "0.01"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "parallax-agent: --cpu-budget wants 0 (none) or at least 0.05 cores, got 0.01"
    ]


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0
        self.cpu = 0.0


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


def test_behind_the_ring_pauses_holds_and_backs_off(clock: _Clock) -> None:
    from agent.budget import Shedder

    s = Shedder(0, lambda: clock.t, lambda: clock.cpu)  # no CPU budget: the ring decides
    assert s.step(0.2) is None
    assert s.step(0.6) is True and s.reason == "behind"
    clock.t += 0.5
    assert s.step(0.0) is None  # held for 1 s
    clock.t += 0.6
    assert s.step(0.3) is None  # not drained yet
    assert s.step(0.0) is False
    # behind again soon after: held twice as long
    clock.t += 1
    assert s.step(0.9) is True
    clock.t += 1.5
    assert s.step(0.0) is None
    clock.t += 0.6
    assert s.step(0.0) is False
    # after a calm spell the hold is back to 1 s
    clock.t += 60
    assert s.step(0.9) is True
    clock.t += 1.1
    assert s.step(0.0) is False


def test_cpu_budget_pauses_until_half_refilled(clock: _Clock) -> None:
    from agent.budget import Shedder

    s = Shedder(0.5, lambda: clock.t, lambda: clock.cpu)
    clock.t += 1
    clock.cpu += 0.4  # within 0.5 cores
    assert s.step(None) is None
    clock.t += 1
    clock.cpu += 2.0  # 2 s of CPU in a second (threads): 1 s over
    assert s.step(None) is True and s.reason == "cpu_budget"
    clock.t += 1.1  # hold over, but the bucket at -0.45 s: not yet half full
    assert s.step(None) is None
    clock.t += 1.5  # +0.75: 0.3 of 0.5
    assert s.step(None) is False


def test_a_full_ring_pauses_the_programs_themselves(tmp_path: Path) -> None:
    """A one-page ring fills within a drain period under load: the program that finds no
    room pauses tracing at once (the agent need not get the CPU first); the agent holds
    the pause, drains, resumes, and the next request is recorded whole."""
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp_path / "t")])
    port = srv.port()
    agent = Agent(tmp_path, [port], ["--ringbuf-pages", "1", "--cpu-budget", "0"])
    try:
        sent = _wrk_requests(port, 3)
        full = agent.wait_metric(
            'parallax_agent_pauses_total{reason="ring_full"}', lambda v: v >= 1
        )
        assert full >= 1
        assert agent.wait_metric("parallax_agent_lost_events", lambda v: v > 0) > 0
        assert _resumed_for_good(agent), "tracing did not resume"
        ctx = trace_context.generate()
        head = f"GET /after HTTP/1.1\r\ntraceparent: {ctx.header()}\r\nConnection: close\r\n\r\n"
        assert http_request(port, head.encode()).startswith(b"HTTP/1.1 200")
        [r] = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id)
        assert r["path"] == "/after" and r["ttfb_us"] is not None
        assert len(agent.records()) <= sent + 1
    finally:
        rc = agent.stop()
        srv.stop()
    assert rc == 0


def test_ring_full_counts_as_its_own_reason(clock: _Clock) -> None:
    from agent.budget import Shedder

    s = Shedder(0, lambda: clock.t, lambda: clock.cpu)
    assert s.step(0.1, ring_full=True) is True and s.reason == "ring_full"


def test_default_budget_is_a_share_of_the_node() -> None:
    from agent.budget import default_cores

    # 5 % of the CPUs, never below what the agent's idle work needs to resume, never above
    # the DaemonSet's 500m limit
    assert [default_cores(n) for n in (1, 2, 4, 6, 8, 96)] == [0.05, 0.1, 0.2, 0.3, 0.4, 0.4]
    assert 0.05 <= default_cores() <= 0.4  # this machine's


def test_attach_line_names_the_budget(tmp_path: Path) -> None:
    from agent.budget import default_cores

    agent = Agent(tmp_path, [free_port()])
    try:
        line = next(ln for ln in agent.err.read_text().splitlines() if "attached" in ln)
        assert f"CPU budget {default_cores():g} cores; GPU: " in line, line
    finally:
        agent.stop()
    agent = Agent(tmp_path, [free_port()], ["--cpu-budget", "0"])
    try:
        assert "CPU budget none" in agent.err.read_text()
    finally:
        agent.stop()
