"""Retransmits under real loss (issue 29): per-request retransmits against the kernel's own
count, with tests/agent/netloss.py — two network namespaces joined by a veth pair, an
nftables rule in the client's namespace dropping 5 % of the server's packets on arrival.
A traced server in one namespace, clients in the other, each request on a new connection
(``Connection: close``: the server closes first, so its last bytes and FIN can be sent
again after its close), responses of 200 bytes and 20 kB in turn.

The sum of the records' ``retransmits`` must match ``TcpRetransSegs`` of the server's
namespace over the run (SYN-ACKs included: ``TcpExtTCPSynRetrans``, charged to each
connection's first request) within 3 %; on the same path without loss both are 0.

Measured here (2 shared cores, Linux 6.18), ``python -m tests.agent.netloss --loss 5
--requests 400``, six runs: lossless 0 and 0 each time (400 of 400 recorded); under 5 %
loss agent = kernel every time — 217/217, 249/249, 277/277, 201/201, 233/233, 267/267
(26–56 of them SYN-ACKs), every request with retransmits timed, waits median 0.2–204 ms
(fast retransmits on a µs path, else the 200 ms RTO), P90 ~1,020 ms (a SYN-ACK sent again
after 1 s), max ~1,450 ms. This test (150 lossless, 500 at 5 %): 0/0 and 365/365 (60
SYN-ACKs), 121 requests with retransmits, all timed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from parallax_contracts import agent_metrics as am
from tests.agent import netloss
from tests.agent.helpers import PY, Agent, Proc
from tests.conftest import require_ebpf_strict

pytestmark = pytest.mark.ebpf
SIZES = [200, 20000]
UNFOLLOWED = am.P_UNFOLLOWED_READS.name


def test_per_request_retransmits_add_up_to_the_kernels_count(tmp_path: Path) -> None:
    why = netloss.missing_tools()
    if why:
        if require_ebpf_strict():
            pytest.fail(f"PARALLAX_REQUIRE_EBPF=1 but the loss harness cannot run: {why}")
        pytest.skip(f"loss harness: {why}")
    with netloss.NetLoss() as net, net.server():
        agent = Agent(tmp_path, [net.port], ["--cpu-budget", "0"])
        try:
            clean = netloss.run(net, agent, 0, 150, 24, SIZES)
            lossy = netloss.run(net, agent, 5, 500, 24, SIZES)
        finally:
            rc = agent.stop()
    stop_line = [x for x in agent.err.read_text().splitlines() if "stopped:" in x]
    detail = f"{lossy.line()}; {stop_line}"
    print(clean.line())
    print(lossy.line())
    assert rc == 0
    assert clean.requests == clean.recorded == 150, clean.line()
    assert clean.agent == 0 and clean.kernel.retrans_segs == 0, clean.line()
    assert lossy.requests == lossy.recorded == 500, detail
    # every connection followed: no read counted as on one the agent was not following
    assert not lossy.counted.get(UNFOLLOWED), detail
    k = lossy.kernel.retrans_segs
    assert k >= 40, lossy.line()  # 5 % of ~3 segments per connection, at least
    assert abs(lossy.agent - k) <= 0.03 * k, lossy.line()
    # the waits: a SYN-ACK is sent again after 1 s, data after 200 ms at least or after a
    # few round trips (fast retransmit, tail-loss probe); none is negative or made up
    assert lossy.wait_us and all(w >= 0 for w in lossy.wait_us), lossy.line()
    if lossy.kernel.synack:
        assert max(lossy.wait_us) >= 900_000, lossy.line()


# the agent's programs on the softirq side: the tp_btf ones, and their classic twins
_BTF_SIDE = ("px_state_btf", "px_rtx_btf", "px_synack_btf", "px_reset_btf")
_CLASSIC_SIDE = (
    "tracepoint__sock__inet_sock_set_state",
    "tracepoint__tcp__tcp_retransmit_skb",
    "tracepoint__tcp__tcp_retransmit_synack",
)


@pytest.mark.serial  # it keeps a CPU inside a BPF program: a neighbour's timings would suffer
def test_beside_a_spinning_bpf_program_only_classic_programs_miss(tmp_path: Path) -> None:
    """Another tool's classic tracepoint program spinning on a CPU (tests/agent/bpf_noise.py):
    the kernel skips the classic programs a softirq runs nested on it. With them (the
    fallback: PARALLAX_AGENT_NO_TP_BTF=1) the agent counts those skipped runs
    (parallax_agent_bpf_missed_runs_total) and its retransmits fall short of the kernel's;
    with its tp_btf programs nothing is skipped. In both, a request without a record is
    counted: its connection's reads are on no entry of the kernel's
    (parallax_agent_unfollowed_reads_total); where every request is recorded, the
    retransmits add up.

    Measured here, 500 requests at 5 % loss, two rounds: classic 299/320 and 307/330
    retransmits, 57 and 70 runs skipped, 3 requests not recorded in the second (their
    handshake's end skipped); tp_btf 261/261 and 275/275, none skipped, 500/500. CI once
    saw tp_btf record 298 of 300 (retransmits 173 of 181) with no run skipped: a loss this
    test cannot place yet, before that count existed — the message now carries the agent's
    counts."""
    why = netloss.missing_tools()
    if why:
        if require_ebpf_strict():
            pytest.fail(f"PARALLAX_REQUIRE_EBPF=1 but the loss harness cannot run: {why}")
        pytest.skip(f"loss harness: {why}")
    # a hog on every CPU: wherever a softirq runs, a BPF program is spinning there (with one,
    # a fresh clone's run here saw no skipped run at all: no collision, nothing to compare)
    noise = Proc([PY, "-m", "tests.agent.bpf_noise", str(os.cpu_count() or 1)])
    results: dict[str, netloss.Result] = {}
    try:
        assert noise.p.stdout is not None and noise.p.stderr is not None
        if noise.p.stdout.readline().strip() != "ready":
            noise.p.wait(10)
            pytest.fail(f"tests.agent.bpf_noise did not start: {noise.p.stderr.read()[-2000:]}")
        # (the classic agent's run waits less for records: some are expected to be missing)
        for mode, env, wait_s in (
            ("classic", {"PARALLAX_AGENT_NO_TP_BTF": "1"}, 3.0),
            ("tp_btf", {}, 20.0),
        ):
            (tmp_path / mode).mkdir()
            with netloss.NetLoss() as net, net.server():
                agent = Agent(tmp_path / mode, [net.port], ["--cpu-budget", "0"], env=env)
                try:
                    results[mode] = netloss.run(net, agent, 5, 300, 24, SIZES, wait_s)
                finally:
                    assert agent.stop() == 0
    finally:
        noise.stop()
    classic, btf = results["classic"], results["tp_btf"]
    print(classic.line())
    print(btf.line())
    skipped = sum(classic.missed_runs.get(p, 0) for p in _CLASSIC_SIDE)
    assert skipped > 0, classic.line()  # the noise did collide: the counter says so
    assert classic.agent <= classic.kernel.retrans_segs, classic.line()  # skipped: fewer
    assert not {p: n for p, n in btf.missed_runs.items() if p in _BTF_SIDE}, btf.line()
    for r in (classic, btf):
        # a request not recorded: its connection unfollowed, its reads counted
        assert r.requests - r.recorded <= r.counted.get(UNFOLLOWED, 0), r.line()
    assert btf.requests == 300 and btf.recorded > 0.95 * 300, btf.line()
    k = btf.kernel.retrans_segs
    assert k >= 20 and btf.agent <= k, btf.line()
    if btf.recorded == btf.requests:  # (else the missing ones' retransmits are not known)
        assert abs(btf.agent - k) <= 0.03 * k, btf.line()
