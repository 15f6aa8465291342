"""The main loop's bookkeeping without a kernel: SYN-ACK retransmit labels stay within the
bounded port-label set, and the service-name cache follows a pid reused by another process
(real processes; the reuse forced through ns_last_pid, which needs root)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agent import run
from agent.httpcut import Conn
from tests.agent.helpers import PY, Proc


def test_synack_labels_are_bounded_like_the_other_port_metrics() -> None:
    a = run.Agent(run.RunConfig())
    listening = range(20000, 20000 + run.MAX_PORT_LABELS + 36)
    a._listen_ports = set(listening)
    a._listen_checked = time.monotonic()  # no /proc rescan: these ports count as listening
    per_port = {p: 1 for p in listening} | {7: 5}  # port 7: not a listener
    labels = a._by_port_label(per_port)
    assert len(labels) == run.MAX_PORT_LABELS + 1
    assert labels["other"] == 36 + 5
    assert sum(labels.values()) == sum(per_port.values())
    assert a._by_port_label({20000: 3}) == {"20000": 3}  # a labelled port keeps its label


def _sleeper(service: str) -> list[str]:
    return [PY, "-c", f"print(1, flush=True); import time; time.sleep(30)  # {service}"]


def _spawn_with_pid(service: str, pid: int, tries: int = 50) -> Proc | None:
    for _ in range(tries):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        p = Proc(_sleeper(service), env={"OTEL_SERVICE_NAME": service})
        if p.p.pid == pid:
            return p
        p.stop()
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="ns_last_pid needs root")
def test_a_reused_pid_gets_its_own_service_name() -> None:
    a = run.Agent(run.RunConfig())  # every process traced: no rescan drops the pid
    first = Proc(_sleeper("svc-first"), env={"OTEL_SERVICE_NAME": "svc-first"})
    second: Proc | None = None
    try:
        first.port()  # started (its environment is in place)
        pid = first.p.pid
        assert a._info(run.ConnState(Conn(), pid)).service == "svc-first"
        first.stop()
        second = _spawn_with_pid("svc-second", pid)
        if second is None:
            pytest.skip("another process kept taking the pid")
        second.port()
        time.sleep(run.SVC_CHECK_S + 0.05)
        assert a._info(run.ConnState(Conn(), pid)).service == "svc-second"
    finally:
        first.stop()
        if second is not None:
            second.stop()
