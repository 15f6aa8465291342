"""The main loop's bookkeeping without a kernel: SYN-ACK retransmit labels stay within the
bounded port-label set, and the service-name cache follows a pid reused by another process
(real processes; the reuse forced through ns_last_pid, which needs root)."""

from __future__ import annotations

import os
import time

import pytest

from agent import connections
from agent.export.outputs import RecordQueue
from agent.identity import processes
from agent.kernel.clock import MonoClock
from agent.protocols.exchange import Exchange
from agent.protocols.http1 import Conn
from agent.protocols.table import PROTOCOLS
from tests.agent.helpers import PY, Proc


def test_synack_labels_are_bounded_like_the_other_port_metrics() -> None:
    a = processes.Processes([], [])
    listening = range(20000, 20000 + processes.MAX_PORT_LABELS + 36)
    a._listen_ports = set(listening)
    a._listen_checked = time.monotonic()  # no /proc rescan: these ports count as listening
    per_port = {p: 1 for p in listening} | {7: 5}  # port 7: not a listener
    labels = a.by_port_label(per_port)
    assert len(labels) == processes.MAX_PORT_LABELS + 1
    assert labels["other"] == 36 + 5
    assert sum(labels.values()) == sum(per_port.values())
    assert a.by_port_label({20000: 3}) == {"20000": 3}  # a labelled port keeps its label


def _sleeper(service: str) -> list[str]:
    return [PY, "-c", f"print(1, flush=True); import time; time.sleep(30)  # {service}"]


@pytest.mark.serial  # another worker's forks would take the pid it waits for
@pytest.mark.skipif(os.geteuid() != 0, reason="ns_last_pid needs root")
def test_a_reused_pid_gets_its_own_service_name() -> None:
    a = processes.Processes([], [])  # every process traced: no rescan drops the pid
    first = Proc(_sleeper("svc-first"), env={"OTEL_SERVICE_NAME": "svc-first"})
    second: Proc | None = None
    try:
        first.port()  # started (its environment is in place)
        pid = first.p.pid
        assert a.identity(pid, 8080)[1] == "svc-first"
        first.stop()
        env = {"OTEL_SERVICE_NAME": "svc-second"}
        second = Proc.with_pid(_sleeper("svc-second"), pid, env)
        if second is None:
            pytest.skip("another process kept taking the pid")
        second.port()
        time.sleep(processes.SVC_CHECK_S + 0.05)
        assert a.identity(pid, 8080)[1] == "svc-second"
    finally:
        first.stop()
        if second is not None:
            second.stop()


class _Aggs:
    """px_aggs as the sweep reads it, counting the lookups (every socket: no aggregate)."""

    def __init__(self) -> None:
        self.looked: list[int] = []

    def Key(self, sk: int) -> int:  # noqa: N802  (bcc's table API)
        return sk

    def __getitem__(self, sk: int) -> object:
        self.looked.append(sk)
        raise KeyError(sk)


def test_the_sweep_bounds_its_map_lookups_and_goes_round() -> None:
    """Thousands of Content-Length responses open at once: each sweep (every 50 ms) looks up
    at most SWEEP_LOOKUPS of them in the kernel's map, and the next sweeps take the rest."""
    a = connections.Connections(
        4096, MonoClock(), RecordQueue(10), lambda *_: ("", ""), lambda _: None, lambda: None
    )
    aggs = _Aggs()
    n = connections.SWEEP_LOOKUPS * 2 + 88
    for sk in range(1, n + 1):
        cut = Conn()
        cut.active = Exchange("GET", "/dl", "HTTP/1.1", None, False, t1=1)
        cut.active.content_length = 1 << 30
        st = connections.ConnState(cut, PROTOCOLS[0], 1)
        a._open_cl[(sk, 0)] = st  # t_last_event 0: idle for long
    a.sweep(aggs)
    assert len(aggs.looked) == connections.SWEEP_LOOKUPS
    a.sweep(aggs)
    a.sweep(aggs)
    assert len(aggs.looked) == 3 * connections.SWEEP_LOOKUPS
    assert set(aggs.looked) == set(range(1, n + 1))  # every response looked at, none starved
