"""A server in a network namespace of its own, as every pod is: the agent (the DaemonSet's,
in the host's pid namespace but not the pod's network) finds its listener and follows it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from parallax_contracts import trace_context
from tests.agent.helpers import PY, ROOT, Agent, Proc

pytestmark = pytest.mark.ebpf

# A client inside the server's namespace: one keep-alive connection; each stdin line is a
# request path (with a traceparent after a space), answered by the status line on stdout.
CLIENT = r"""
import socket, sys
port = int(sys.argv[1])
s = socket.create_connection(("127.0.0.1", port), 5)
for line in sys.stdin:
    path, tp = line.split()
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\ntraceparent: {tp}\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    head, _, body = buf.partition(b"\r\n\r\n")
    n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < n:
        body += s.recv(65536)
    print(head.split(b"\r\n")[0].decode(), flush=True)
"""


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[tuple[Proc, int]]:
    """(server, port): py_server in a network namespace of its own."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")):
        pytest.skip("needs root, unshare and nsenter to make a network namespace")
    log = tmp_path / "pod.jsonl"
    srv = Proc(
        [
            "unshare",
            "--net",
            "sh",
            "-c",
            f"ip link set lo up && exec {PY} -m tests.agent.servers.py_server --timing-log {log}",
        ]
    )
    try:
        port = srv.port()
        assert os.stat(f"/proc/{srv.p.pid}/ns/net").st_ino != os.stat("/proc/self/ns/net").st_ino
        yield srv, port
    finally:
        srv.stop()


def _client(pid: int, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-c", CLIENT, str(port)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _ask(client: subprocess.Popen[str], path: str) -> str:
    assert client.stdin is not None and client.stdout is not None
    ctx = trace_context.generate()
    client.stdin.write(f"{path} {ctx.header()}\n")
    client.stdin.flush()
    assert " 200 " in client.stdout.readline()
    return ctx.trace_id


def test_server_in_its_own_network_namespace_is_traced(
    tmp_path: Path, pod: tuple[Proc, int]
) -> None:
    srv, port = pod
    old = _client(srv.p.pid, port)  # a connection older than the agent: seeded from /proc
    _ask(old, "/before")
    agent = Agent(tmp_path, [port])
    try:
        new = _client(srv.p.pid, port)
        ids = {_ask(new, f"/new{i}"): f"/new{i}" for i in range(3)}
        ids[_ask(old, "/after")] = "/after"
        recs = agent.wait_for(lambda r: r["trace_id"] in ids, count=4)
        assert sorted(r["path"] for r in recs) == sorted(ids.values()), agent.records()
        for r in recs:
            assert r["path"] == ids[r["trace_id"]] and r["pid"] == srv.p.pid, r
            assert r["local_port"] == port and r["peer_addr"] == "127.0.0.1", r
            assert r["ttfb_us"] is not None and r["status"] == 200, r
        assert not [r for r in agent.records() if r["path"] == "/before"]
        for c in (new, old):
            assert c.stdin is not None
            c.stdin.close()
            c.wait(5)
    finally:
        old.kill()
        agent.stop()
