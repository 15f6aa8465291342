"""Listen-queue drops per listening port (sock_diag), checked against the kernel's own
node-wide counter and across a network namespace (a pod's)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.kernel.sockdiag import Listener, ListenerStats


def _listen_drops() -> int:
    """TcpExt ListenDrops: the node-wide count of what sk_drops counts per listener."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        if names.startswith("TcpExt:"):
            return int(values.split()[names.split().index("ListenDrops")])
    raise AssertionError("no TcpExt in /proc/net/netstat")


def _flood(port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        c = socket.socket()
        c.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            c.connect(("127.0.0.1", port))
        out.append(c)
    return out


def _mine(stats: ListenerStats, port: int, pids: list[int] | None = None) -> list[Listener]:
    return [x for x in stats.read(pids) if x.port == port]


def test_drops_of_a_full_accept_queue_are_counted_on_its_port() -> None:
    full, idle = socket.socket(), socket.socket()
    stats = ListenerStats()
    clients: list[socket.socket] = []
    try:
        for s in (full, idle):
            s.bind(("127.0.0.1", 0))
            s.listen(1)  # never accepted: the queue holds backlog + 1
        fport, iport = full.getsockname()[1], idle.getsockname()[1]
        before = _listen_drops()
        clients = _flood(fport, 12)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(x.drops for x in _mine(stats, fport)):
            time.sleep(0.05)
        (f,) = _mine(stats, fport)
        after = _listen_drops()
        assert f.drops > 0 and f.queued == 2 and f.backlog == 1, f
        # other listeners on the node may drop too, never fewer than ours
        assert after - before >= f.drops
        (i,) = _mine(stats, iport)
        assert i.drops == 0 and i.queued == 0
        assert f.netns == os.stat("/proc/self/ns/net").st_ino
    finally:
        for c in [full, idle, *clients]:
            c.close()
        stats.close()


SERVER = """
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(0)
port = s.getsockname()[1]
cs = []
for _ in range(8):
    c = socket.socket(); c.setblocking(False)
    try: c.connect(("127.0.0.1", port))
    except BlockingIOError: pass
    cs.append(c)
print(port, flush=True)
time.sleep(60)
"""


@pytest.fixture
def other_netns() -> Iterator[tuple[int, int]]:
    """(pid, port) of a process with a full listener in a network namespace of its own."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("ip")):
        why = "needs root, unshare and ip (iproute2) to make a network namespace"
        if os.environ.get("PARALLAX_REQUIRE_EBPF") == "1":  # CI: root and setup's packages
            pytest.fail(why + ": CI has them, so this is a broken set-up, not a skip")
        pytest.skip(why)
    p = subprocess.Popen(
        [
            "unshare",
            "--net",
            "sh",
            "-c",
            f'ip link set lo up && exec {sys.executable} -c "$0"',
            SERVER,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        port = int(p.stdout.readline())
        yield p.pid, port
    finally:
        p.kill()
        p.wait(5)


def test_listeners_in_a_traced_process_network_namespace(other_netns: tuple[int, int]) -> None:
    pid, port = other_netns
    stats = ListenerStats()
    try:
        assert _mine(stats, port) == [] or all(
            x.netns == os.stat("/proc/self/ns/net").st_ino for x in _mine(stats, port)
        ), "the agent's own namespace does not see the pod's listener"
        deadline = time.monotonic() + 5
        got: list[Listener] = []
        while time.monotonic() < deadline:
            got = [x for x in _mine(stats, port, [pid]) if x.netns != stats.own_netns]
            if got and got[0].drops:
                break
            time.sleep(0.05)
        assert len(got) == 1 and got[0].drops > 0 and got[0].backlog == 0, got
        assert got[0].netns == os.stat(f"/proc/{pid}/ns/net").st_ino
        # the namespace's socket is released once its processes are gone
        assert len(stats._socks) == 2
        stats.read([])
        assert len(stats._socks) == 1
    finally:
        stats.close()


def test_without_cap_sys_admin_a_namespace_counts_as_one(other_netns: tuple[int, int]) -> None:
    """The DaemonSet grants no CAP_SYS_ADMIN (setns): the pod's namespace-wide ListenDrops
    are reported instead, as port 0. Run in a child without the capability."""
    pid, _ = other_netns
    code = (
        "import json, sys; from agent.kernel.sockdiag import ListenerStats; s = ListenerStats(); "
        "print(json.dumps([(x.port, x.drops) for x in s.read([int(sys.argv[1])]) "
        "if x.netns != s.own_netns]))"
    )
    deadline = time.monotonic() + 5
    while True:
        out = subprocess.run(
            [
                "setpriv",
                "--bounding-set=-sys_admin",
                "--inh-caps=-sys_admin",
                sys.executable,
                "-c",
                code,
                str(pid),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        got = json.loads(out)
        if (got and got[0][1] > 0) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(got) == 1 and got[0][0] == 0 and got[0][1] > 0, got


FULL_SERVER = """
import socket, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
time.sleep(120)
"""


@pytest.mark.ebpf
def test_the_agent_exports_drops_per_traced_port(tmp_path: Path) -> None:
    """End to end: a traced server that never accepts; the agent's /metrics shows the drops
    on its port."""
    from tests.agent.helpers import Agent

    srv = subprocess.Popen([sys.executable, "-c", FULL_SERVER], stdout=subprocess.PIPE, text=True)
    agent = None
    clients: list[socket.socket] = []
    try:
        assert srv.stdout is not None
        port = int(srv.stdout.readline())
        agent = Agent(tmp_path, [port])
        clients = _flood(port, 12)
        name = f'parallax_agent_listen_drops_total{{port="{port}"}}'
        value = agent.wait_metric(name, lambda v: v > 0, timeout=10)
        assert value > 0, agent.metrics()
    finally:
        for c in clients:
            c.close()
        if agent is not None:
            assert agent.stop() == 0
        srv.kill()
        srv.wait(5)
