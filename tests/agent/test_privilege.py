"""The agent with only the DaemonSet's capabilities (deploy/k8s/parallax.yaml, from the chart).

Without CAP_SYS_ADMIN the kernel makes no uprobe through perf_event_open, so bcc writes the
libc accept uretprobes as tracefs events (agent/tracefs.remove_stale_uprobes).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from agent.kernel import tracefs
from parallax_contracts import trace_context
from tests.agent.helpers import (
    PY,
    Agent,
    Proc,
    agent_progs,
    http_request,
    netns_ask,
    netns_client,
    netns_server,
    tls_cert,
    tls_connect,
    wait_log,
)

pytestmark = pytest.mark.ebpf


def _daemonset_caps(dac_read_search: bool = True) -> list[str]:
    """setpriv to the DaemonSet's capabilities, less CAP_SYS_RESOURCE (which this sandbox
    cannot grant)."""
    caps = "-all,+bpf,+perfmon,+sys_ptrace" + (",+dac_read_search" if dac_read_search else "")
    return [
        "setpriv",
        "--reuid",
        "0",
        f"--inh-caps={caps}",
        f"--ambient-caps={caps}",
        f"--bounding-set={caps}",
    ]


def test_accept_times_with_the_daemonsets_capabilities(tmp_path: Path) -> None:
    """Only CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE (the DaemonSet's, less CAP_SYS_RESOURCE,
    which this sandbox cannot grant): the kernel refuses to resolve another process's
    /proc/<pid>/root link for a probe without CAP_SYS_ADMIN, so the agent opens the libc
    itself and names it /proc/self/fd/<n> — accept times still come."""
    setpriv = _daemonset_caps()
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp_path / "t")])
    port = srv.port()
    agent = Agent(tmp_path, [port], wrapper=setpriv)
    try:
        eff = int(
            next(
                ln.split()[1]
                for ln in Path(f"/proc/{agent.p.pid}/status").read_text().splitlines()
                if ln.startswith("CapEff:")
            ),
            16,
        )
        assert not eff & (1 << 21)  # CAP_SYS_ADMIN really dropped
        ctx = trace_context.generate()
        head = f"GET /plain HTTP/1.1\r\ntraceparent: {ctx.header()}\r\nConnection: close\r\n\r\n"
        http_request(port, head.encode())
        [r] = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id)
        assert r["accept_queue_us"] is not None
        assert "no accept times" not in agent.err.read_text()
        # the BTF sk_data_ready (agent/kernel/tpbtf.py) loads with these capabilities too
        assert "px_sdr_btf" in {p["name"] for p in agent_progs(agent)}
        assert r["recv_queue_us"] is not None
    finally:
        rc = agent.stop()
        srv.stop()
    assert rc == 0


def test_a_pods_server_with_the_daemonsets_capabilities(tmp_path: Path) -> None:
    """A server in a network namespace of its own (a pod's): with only the DaemonSet's
    capabilities the agent reads that namespace's TCP tables and follows its requests."""
    srv, port = netns_server(tmp_path / "pod.jsonl")
    agent = client = None
    try:
        agent = Agent(tmp_path, [port], wrapper=_daemonset_caps())
        client = netns_client(srv.p.pid, port)
        ids = {netns_ask(client, f"/pod{i}") for i in range(3)}
        recs = agent.wait_for(lambda r: r["trace_id"] in ids, count=3)
        assert sorted(r["path"] for r in recs) == ["/pod0", "/pod1", "/pod2"], agent.records()
        assert all(r["pid"] == srv.p.pid and r["local_port"] == port for r in recs)
    finally:
        if client is not None:
            client.kill()
            client.wait(5)
        rc = agent.stop() if agent is not None else 0
        srv.stop()
    assert rc == 0


@pytest.mark.parametrize("dac_read_search", [True, False], ids=["granted", "without"])
def test_a_server_under_another_uid_with_the_daemonsets_capabilities(
    tmp_path: Path, dac_read_search: bool
) -> None:
    """Pods under the restricted Pod Security Standard run as non-root: the agent finds the
    holder of a traced port through /proc/<pid>/fd, which is its owner's alone (mode 0500)
    — with CAP_DAC_READ_SEARCH (the DaemonSet grants it) the server is traced; without it
    nothing is, which is why it is granted."""
    logs = Path(tempfile.mkdtemp(prefix="px-uid1000-"))  # (pytest's tmp_path is root's alone)
    logs.chmod(0o777)
    srv = Proc(
        ["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups",
         PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(logs / "t")]
    )  # fmt: skip
    port = srv.port()
    agent = Agent(tmp_path, [port], wrapper=_daemonset_caps(dac_read_search))
    try:
        assert Path(f"/proc/{srv.p.pid}/status").read_text().count("1000") >= 2  # really uid 1000
        ids = []
        for _ in range(3):
            ctx = trace_context.generate()
            ids.append(ctx.trace_id)
            head = (
                f"GET /plain HTTP/1.1\r\ntraceparent: {ctx.header()}\r\nConnection: close\r\n\r\n"
            )
            assert http_request(port, head.encode()).startswith(b"HTTP/1.1 200")
        recs = agent.wait_for(
            lambda r: r["trace_id"] in ids, 3, timeout=5 if dac_read_search else 2
        )
    finally:
        assert agent.stop() == 0
        srv.stop()
    assert len(recs) == (3 if dac_read_search else 0)


def test_uprobe_events_left_by_a_killed_agent_are_removed(tmp_path: Path) -> None:
    """A killed agent cannot remove the tracefs uprobe events bcc made for it: the next
    agent removes those whose maker is gone, and only those (an event of a live process,
    or of another tool, stays)."""
    base = tracefs.find()
    assert base is not None
    dead = subprocess.Popen(["true"])
    dead.wait()
    libc = "/usr/lib/x86_64-linux-gnu/libc.so.6"
    if not Path(libc).exists():
        pytest.skip(f"{libc} missing")
    events = {
        f"r__proc_self_fd_7_0x0_bcc_{dead.pid}": "stale",
        f"px_tls_r_{os.getpid()}_1a0_bcc_{dead.pid}": "stale (a TLS probe's)",
        f"r__proc_self_fd_7_0x0_bcc_{os.getpid()}": "live",
        "px_test_other_tool": "another tool's",
    }
    for name in events:
        assert tracefs.write_probe_events(f"r:uprobes/{name} {libc}:0x0", base)
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp_path / "t")])
    port = srv.port()
    try:
        agent = Agent(tmp_path, [port], wrapper=_daemonset_caps())
        assert agent.stop() == 0
        left = (base / "uprobe_events").read_text()
        assert [n for n in events if f"/{n} " in left] == list(events)[2:], left
    finally:
        srv.stop()
        for name in events:
            tracefs.write_probe_events(f"-:uprobes/{name}", base)


def test_tls_probes_with_the_daemonsets_capabilities(tmp_path: Path) -> None:
    """The TLS probes (pid-filtered uprobes on the libssl a server maps, opened by the agent
    through /proc/<pid>/root) attach with only the DaemonSet's capabilities: a TLS server's
    requests are recorded from their plaintext."""
    cert, key = tls_cert(tmp_path)
    tls = ["--tls-cert", str(cert), "--tls-key", str(key)]
    srv = Proc(
        [PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp_path / "t"), *tls]
    )
    port = srv.port()
    agent = Agent(tmp_path, [port], wrapper=_daemonset_caps())
    try:
        with tls_connect(port) as c:  # (the probes went on at the agent's start)
            http_request(0, b"GET /plain HTTP/1.1\r\nHost: x\r\n\r\n", sock=c)
        wait_log(agent, f"TLS: probes on pid {srv.p.pid} in libssl.so.3")
        ctx = trace_context.generate()
        with tls_connect(port) as c:
            head = f"GET /tls HTTP/1.1\r\nHost: x\r\ntraceparent: {ctx.header()}\r\n\r\n"
            assert http_request(0, head.encode(), sock=c).startswith(b"HTTP/1.1 200")
        [r] = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id)
        assert r["path"] == "/tls" and r["tls"] is True and r["ttfb_us"] is not None
    finally:
        rc = agent.stop()
        srv.stop()
    assert rc == 0
