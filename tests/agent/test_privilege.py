"""The agent with only the DaemonSet's capabilities (deploy/k8s/agent-daemonset.yaml).

In a module of its own: while an agent with full root holds the libc uretprobe, the kernel
refuses (EACCES) the same probe to a later agent without CAP_SYS_ADMIN — not a deployment
case (one agent per node; two reduced agents, as in a rolling update, coexist: checked by
hand), but the other modules' root agents must be gone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

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


def _daemonset_caps() -> list[str]:
    """setpriv to the DaemonSet's capabilities, less CAP_SYS_RESOURCE (which this sandbox
    cannot grant)."""
    caps = "-all,+bpf,+perfmon,+sys_ptrace"
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
        # the BTF sk_data_ready (agent/tpbtf.py) loads with these capabilities too
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
        with tls_connect(port) as c:  # the first TLS connection: the probes go on now
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
