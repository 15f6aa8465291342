"""Data arrival times (t_arr, hence recv_queue_us) through the BTF sk_data_ready program
(bpf/agent.c px_sdr_btf, loaded by agent/kernel/tpbtf.py) and its fallback, the classic program:
the program this kernel runs, and arrivals that a closed socket left unread, which must not
be taken for the request of a later connection that reuses the socket's memory."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.helpers import PY, Agent, Proc, agent_progs, tracepoints

pytestmark = pytest.mark.ebpf


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Agent]]:
    tmp = tmp_path_factory.mktemp("arr")
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp / "t.jsonl")])
    port = srv.port()
    try:
        agent = Agent(tmp, [port])
    except Exception:
        srv.stop()
        raise
    yield port, agent
    rc = agent.stop()
    srv.stop()
    assert rc == 0, agent.err.read_text()[-2000:]


def test_sk_data_ready_runs_as_btf_tracepoint(env: tuple[int, Agent]) -> None:
    _, agent = env
    progs = {str(p["name"]): p for p in agent_progs(agent)}
    assert progs["px_sdr_btf"]["type"] == "tracing", progs.keys()
    # attached once: the BTF program's link, the classic program detached
    links = [
        e
        for e in _perf_list()
        if e.get("pid") == agent.p.pid and e.get("tracepoint") == "sk_data_ready"
    ]
    assert len(links) == 1 and links[0]["fd_type"] == "raw_tracepoint", links
    assert "sk_data_ready" in tracepoints(agent)


def _perf_list() -> list[dict[str, object]]:
    out = subprocess.run(
        ["bpftool", "-j", "perf", "list"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    data: list[dict[str, object]] = json.loads(out)
    return data


def test_unread_arrival_of_a_closed_socket_is_not_a_later_requests(
    env: tuple[int, Agent],
) -> None:
    """The client half-closes while the server works on its request: the FIN arrives (an
    sk_data_ready) after the server's last read, and the server answers and closes without
    reading it. The next accepted socket usually takes the freed one's memory (the
    connection table's key); every request must still get its own arrival time, not that
    FIN's."""
    port, agent = env
    paths = [f"/arr-{i}" for i in range(20)]
    for path in paths:
        with socket.create_connection(("127.0.0.1", port), 5) as s:
            head = f"GET {path}?delay_ms=60 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            s.sendall(head.encode())
            time.sleep(0.02)  # the server has read the request and sleeps 60 ms
            s.shutdown(socket.SHUT_WR)
            s.settimeout(5)
            resp = b""
            while chunk := s.recv(65536):  # the server closes after its response
                resp += chunk
            assert resp.startswith(b"HTTP/1.1 200"), resp[:100]
    recs = agent.wait_for(lambda r: r["path"] in paths, count=len(paths))
    assert sorted(r["path"] for r in recs) == sorted(paths)
    missing = [r["path"] for r in recs if r["recv_queue_us"] is None]
    assert not missing, missing
    for r in recs:
        assert 0 <= r["recv_queue_us"] < 1_000_000, r


def test_classic_sk_data_ready_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel refuses the tp_btf program, bcc's classic one stays attached: the
    same records."""
    monkeypatch.setenv("PARALLAX_AGENT_NO_TP_BTF", "1")
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp_path / "t")])
    port = srv.port()
    try:
        agent = Agent(tmp_path, [port])
        try:
            assert "px_sdr_btf" not in {str(p["name"]) for p in agent_progs(agent)}
            links = [
                e
                for e in _perf_list()
                if e.get("pid") == agent.p.pid and e.get("tracepoint") == "sk_data_ready"
            ]
            assert len(links) == 1 and links[0]["fd_type"] == "tracepoint", links
            paths = [f"/classic-{i}" for i in range(5)]
            for path in paths:
                with socket.create_connection(("127.0.0.1", port), 5) as s:
                    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                    assert s.recv(65536).startswith(b"HTTP/1.1 200")
            recs = agent.wait_for(lambda r: r["path"] in paths, count=len(paths))
            assert len(recs) == len(paths)
            assert all(r["recv_queue_us"] is not None for r in recs), recs
        finally:
            assert agent.stop() == 0
    finally:
        srv.stop()
