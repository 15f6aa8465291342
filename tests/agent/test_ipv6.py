"""IPv6, dual-stack and IPv4 peers: a server listening on ``::`` takes an IPv6 client and an
IPv4 one (its socket then holds a v4-mapped address), a server on 127.0.0.1 an IPv4 one, each
client from an address other than the server's. Each record names both ends as they
connected, with the BTF tracepoints (``px_state_btf`` reads the addresses from the socket, at
offsets from the kernel's BTF) and with the classic programs (the tracepoint's record has
them)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from parallax_contracts import trace_context
from tests.agent.helpers import PY, Agent, Proc, agent_progs, http_request

pytestmark = pytest.mark.ebpf


@pytest.mark.parametrize(
    ("tp_btf", "hooks"),
    [(True, "socket"), (False, "socket"), (True, "syscalls")],
    ids=["tp_btf", "classic", "tp_btf-syscall-hooks"],
)
def test_ipv6_v4_mapped_and_ipv4_peers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tp_btf: bool, hooks: str
) -> None:
    if not tp_btf:
        monkeypatch.setenv("PARALLAX_AGENT_NO_TP_BTF", "1")
    extra = ["--io-hooks", "syscalls"] if hooks == "syscalls" else []
    dual = Proc([PY, "-m", "tests.agent.netloss", "serve", "--host", "::"])
    v4 = Proc([PY, "-m", "tests.agent.netloss", "serve", "--host", "127.0.0.1"])
    try:
        p6, p4 = dual.port(), v4.port()
        agent = Agent(tmp_path, [p6, p4], extra)
        try:
            names = {str(p["name"]) for p in agent_progs(agent)}
            assert ("px_state_btf" in names) == tp_btf, names
            # (server port, server address, client address)
            cases = [
                (p6, "::1", "::1"),
                (p6, "127.0.0.1", "127.0.0.2"),
                (p4, "127.0.0.1", "127.0.0.3"),
            ]
            ids: dict[str, tuple[int, str, str, int]] = {}
            for port, local, peer in cases * 2:
                ctx = trace_context.generate()
                head = f"GET /r?n=10 HTTP/1.1\r\nHost: t\r\ntraceparent: {ctx.header()}\r\n"
                with socket.create_connection((local, port), 5, (peer, 0)) as s:
                    resp = http_request(port, (head + "Connection: close\r\n\r\n").encode(), s)
                    ids[ctx.trace_id] = (port, local, peer, s.getsockname()[1])
                assert resp.startswith(b"HTTP/1.1 200"), resp[:80]
            recs = agent.wait_for(lambda r: r["trace_id"] in ids, count=len(ids))
            assert len(recs) == len(ids), agent.records()
            for r in recs:
                port, local, peer, peer_port = ids[r["trace_id"]]
                # a v4-mapped peer is named by its IPv4 address
                assert (r["local_addr"], r["local_port"]) == (local, port), r
                assert (r["peer_addr"], r["peer_port"]) == (peer, peer_port), r
                assert r["status"] == 200, r
        finally:
            assert agent.stop() == 0
    finally:
        dual.stop()
        v4.stop()
