"""``python -m bench.holdback``: what the write-to-wire holdback measure (bpf/agent/hold.h)
adds per request, side by side in one run.

The agent with the measure compiled out (``PARALLAX_AGENT_NO_HOLDS=1``) and with it — its
departure hook as a raw tracepoint (``PARALLAX_AGENT_HOLD_RAW_TP=1``) and as a BTF one —
rounds interleaved, each against two http.server instances (tests/agent/servers/py_server.py)
answering ``/stream?n=8&gap_ms=0`` — a head and 8 small chunked body writes per response, as
a token stream writes — over one keep-alive connection: one server with TCP_NODELAY (no
write held: the common cost, two 4-byte reads per body write and the departure hook's gate
on every packet) and one without (Nagle holds the writes behind the first: queueing, the
departure's header parse, the timing). BPF ns per request over all of the agent's programs
(kernel.bpf_stats_enabled: run_time_ns of each), and for the two programs the measure
touches (``sock_send_length``, ``px_hold_xmit``). Writes its section of docs/benchmarks.md.

    python -m bench.holdback [--requests 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agent.kernel.holdback import NO_HOLDS, RAW_XMIT
from bench import report
from bench.agent import AgentProc, bpf_breakdown, busy_loops, stop_all
from tests.agent.helpers import PY, Proc, get_head, read_response

PATH = "/stream?n=8&gap_ms=0"
WARM = 50  # requests before each measured run (their records count in the held writes)
STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
_SEND = "sock_send_length"  # bcc names the classic program after its tracepoint
_XMIT = "px_hold_xmit"  # either hook (the BTF one's name is px_hold_xmit_bt, cut to 15)
KINDS = ("off", "raw", "btf")  # the measure compiled out; its departure hook raw, or BTF
_ENV = {"off": {NO_HOLDS: "1"}, "raw": {RAW_XMIT: "1"}, "btf": {}}


def _drive(port: int, n: int) -> float:
    """``n`` requests on one keep-alive connection; the seconds they took."""
    with socket.create_connection(("127.0.0.1", port), 5) as s:
        t0 = time.monotonic()
        for _ in range(n):
            s.sendall(get_head(PATH))
            if not read_response(s).startswith(b"HTTP/1.1 200"):
                raise RuntimeError("bad response")
        return time.monotonic() - t0


def _stats(pid: int) -> dict[str, tuple[int, int]]:
    return bpf_breakdown(pid)


def _delta(
    a: dict[str, tuple[int, int]], b: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    return {k: (b[k][0] - a.get(k, (0, 0))[0], b[k][1] - a.get(k, (0, 0))[1]) for k in b}


def _short(name: str) -> str:
    """A program's name without bcc's prefix; both departure hooks as one."""
    name = name.replace("sock__", "")
    return _XMIT if name.startswith(_XMIT) else name


def _prog(d: dict[str, tuple[int, int]], name: str) -> tuple[int, int]:
    hits = [v for k, v in d.items() if name in k]
    return (sum(v[0] for v in hits), sum(v[1] for v in hits))


def measure(
    ports: dict[str, int], tmp: Path, kind: str, n: int, rnd: int
) -> dict[str, dict[str, float]]:
    """One agent (of a kind in KINDS) over both servers: per server, BPF ns/request (all the
    agent's programs, and the two the measure touches) and the held writes it recorded."""
    os.environ.update(_ENV[kind])
    run = tmp / f"{kind}{rnd}"
    run.mkdir()
    agent = AgentProc(ports["nodelay"], run, ("--port", str(ports["nagle"])))
    out: dict[str, dict[str, float]] = {}
    try:
        for name in ("nodelay", "nagle"):
            _drive(ports[name], WARM)  # the connection and the server's code paths
            STATS.write_text("1")  # (again: a concurrent bench may have restored it)
            before = _stats(agent.p.pid)
            _drive(ports[name], n)
            after = _stats(agent.p.pid)
            d = _delta(before, after)
            total = sum(v[0] for v in d.values())
            out[name] = {
                "bpf_ns": total / n,
                "send_ns": _prog(d, _SEND)[0] / n,
                "xmit_ns": _prog(d, _XMIT)[0] / n,
                "xmit_runs": _prog(d, _XMIT)[1] / n,
                # each program's ns/req: where the measure's work lands, and what it moves
                **{f"prog:{_short(k)}": v[0] / n for k, v in d.items()},
            }
    finally:
        agent.stop()
        for k in _ENV[kind]:
            os.environ.pop(k, None)
    held = 0
    jsonl = run / "agent.jsonl"
    if jsonl.exists():
        for line in jsonl.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("local_port") == ports["nagle"]:
                held += rec.get("wire_hold_writes") or 0
    out["nagle"]["held_writes"] = held
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.holdback", description=__doc__)
    ap.add_argument("--requests", type=int, default=2000, help="per server and round")
    ap.add_argument("--rounds", type=int, default=3, help="off/raw/btf triples, interleaved")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument(
        "--busy",
        action="store_true",
        help="a nice-19 busy loop on every CPU throughout (the vCPUs never halt: no program "
        "runs on a CPU just woken from idle)",
    )
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.holdback: needs root (eBPF)", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="px-holdback-"))
    stats_path = STATS
    prev = stats_path.read_text().strip()
    stats_path.write_text("1")
    procs: dict[str, Proc] = {}
    loops = busy_loops() if a.busy else []
    runs: dict[str, list[dict[str, dict[str, float]]]] = {k: [] for k in KINDS}
    try:
        for name, extra in (("nodelay", ["--nodelay"]), ("nagle", [])):
            procs[name] = Proc(
                [PY, "-m", "tests.agent.servers.py_server", "--timing-log", "/dev/null", *extra]
            )
        ports = {name: p.port() for name, p in procs.items()}
        for r in range(a.rounds):
            for kind in KINDS:
                runs[kind].append(measure(ports, tmp, kind, a.requests, r))
                print(f"round {r + 1} {kind}: {runs[kind][-1]}", flush=True)
    finally:
        for p in procs.values():
            p.stop()
        stop_all(loops)
        stats_path.write_text(prev)
        shutil.rmtree(tmp, ignore_errors=True)

    md = _section(runs, a.requests, a.rounds, a.busy)
    print(md)
    if not a.no_write:
        report.write_section("holdback", md)
    return 0


def _section(
    runs: dict[str, list[dict[str, dict[str, float]]]], n: int, rounds: int, busy: bool
) -> str:
    def med(kind: str, server: str, key: str) -> float:
        return statistics.median(r[server][key] for r in runs[kind])

    rows = [
        "| Server | BPF ns/req, measure off | on, raw hook | on, BTF hook | added: raw | "
        "added: BTF | `sock_send_length` (off → on) | departure hook ns/req, raw → BTF "
        "(runs/req) | held writes per request |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for server, label in (("nodelay", "TCP_NODELAY (none held)"), ("nagle", "Nagle (writes held)")):
        off, raw, btf = (med(k, server, "bpf_ns") for k in KINDS)
        per_req = statistics.median(r["nagle"]["held_writes"] for r in runs["btf"])
        held = f"{per_req / (n + WARM):.1f}" if server == "nagle" else "—"
        rows.append(
            f"| {label} | {off:,.0f} | {raw:,.0f} | {btf:,.0f} | **{raw - off:+,.0f}** | "
            f"**{btf - off:+,.0f}** | {med('off', server, 'send_ns'):,.0f} → "
            f"{med('btf', server, 'send_ns'):,.0f} | {med('raw', server, 'xmit_ns'):,.0f} → "
            f"{med('btf', server, 'xmit_ns'):,.0f} ({med('btf', server, 'xmit_runs'):.1f}) | "
            f"{held} |"
        )
    per_round = ", ".join(
        f"{k} " + "/".join(f"{r['nagle']['bpf_ns']:,.0f}" for r in runs[k]) for k in KINDS
    )
    # By program, for the Nagle server: the programs over 100 ns/req in any kind
    names = sorted({k for k in runs["btf"][0]["nagle"] if k.startswith("prog:")})
    by_prog = []
    for key in names:
        meds = [statistics.median(r["nagle"].get(key, 0.0) for r in runs[k]) for k in KINDS]
        if max(meds) >= 100:
            by_prog.append(f"`{key[5:]}` " + " / ".join(f"{m:,.0f}" for m in meds))
    return "\n".join(
        [
            "## Write-to-wire holdback (`python -m bench.holdback`)",
            "",
            f"Machine: {report.machine()}. Commit {report.git_rev()}. Command: "
            f"`python -m bench.holdback --requests {n} --rounds {rounds}"
            + (" --busy" if busy else "")
            + "`.",
            "",
            f"Per request: `{PATH}` (a head and 8 small body writes) over one keep-alive "
            "connection from a Python client; the agent with the measure compiled out "
            "(`PARALLAX_AGENT_NO_HOLDS=1`), with it and its departure hook on "
            "net:net_dev_queue as a raw tracepoint (`PARALLAX_AGENT_HOLD_RAW_TP=1`: helper "
            "reads of the skb), and as a BTF tracepoint (direct loads; the agent's default "
            f"where the kernel loads it); rounds interleaved, medians of {rounds}. BPF ns/req "
            "counts every run of the agent's programs during the requests "
            "(kernel.bpf_stats_enabled), the client's packets included: the departure hook "
            "runs for every packet on the node (ACKs too) and stops at one array load while "
            "no followed socket holds a write.",
            "",
            *rows,
            "",
            f"Nagle server, BPF ns/req per round: {per_round}.",
            "",
            "Nagle server, BPF ns/req by program (medians; off / raw / btf): "
            + "; ".join(by_prog)
            + ".",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
