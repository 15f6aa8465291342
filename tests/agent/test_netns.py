"""A server in a network namespace of its own, as every pod is: the agent (the DaemonSet's,
in the host's pid namespace but not the pod's network) finds its listener and follows it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.helpers import Agent, Proc, netns_ask, netns_client, netns_server

pytestmark = pytest.mark.ebpf


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[tuple[Proc, int]]:
    """(server, port): py_server in a network namespace of its own."""
    srv, port = netns_server(tmp_path / "pod.jsonl")
    try:
        yield srv, port
    finally:
        srv.stop()


def test_server_in_its_own_network_namespace_is_traced(
    tmp_path: Path, pod: tuple[Proc, int]
) -> None:
    srv, port = pod
    clients = [netns_client(srv.p.pid, port)]  # a connection older than the agent: seeded
    old = clients[0]
    agent = None
    try:
        netns_ask(old, "/before")
        agent = Agent(tmp_path, [port])
        new = netns_client(srv.p.pid, port)
        clients.append(new)
        ids = {netns_ask(new, f"/new{i}"): f"/new{i}" for i in range(3)}
        ids[netns_ask(old, "/after")] = "/after"
        recs = agent.wait_for(lambda r: r["trace_id"] in ids, count=4)
        assert sorted(r["path"] for r in recs) == sorted(ids.values()), agent.records()
        for r in recs:
            assert r["path"] == ids[r["trace_id"]] and r["pid"] == srv.p.pid, r
            assert r["local_port"] == port and r["peer_addr"] == "127.0.0.1", r
            assert r["ttfb_us"] is not None and r["status"] == 200, r
        assert not [r for r in agent.records() if r["path"] == "/before"]
    finally:
        for c in clients:
            c.kill()
            c.wait(5)
        if agent is not None:
            agent.stop()
