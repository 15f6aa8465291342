"""Real packet loss between two network namespaces, for the agent's retransmit counts.

Two namespaces joined by a veth pair: the server's (10.77.X.1) and the client's (10.77.X.2).
In the client's namespace an nftables input chain drops a share of the packets *arriving*
from the server (``numgen random mod 100 < P``): the server's kernel sends them again, as
over a lossy path to a user. (A drop on the sender's own output is a local send failure
that TCP re-sends silently; there is no netem on this kernel.) The server — a threaded
HTTP/1.1 server answering one request per connection (``Connection: close``, the server
closes first) — runs in the server's namespace and is traced by the agent; every request
comes on a new connection, so every SYN-ACK is a first request's. The kernel's own count is
``nstat`` in the server's namespace, where nothing else runs: ``TcpRetransSegs`` (every
segment sent again, SYN-ACKs included) and ``TcpExtTCPSynRetrans`` (the SYN-ACKs), the
difference over a run.

    python -m tests.agent.netloss --loss 5 --requests 600   # root: the figures, one line each

prints, per run, the agent's sum of per-request ``retransmits`` (its records) against the
kernel's count; tests/agent/test_netloss.py runs the same.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from parallax_contracts import agent_metrics as am
from parallax_contracts import trace_context

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
TOOLS = ("ip", "nft", "nstat")
# the agent's own counts of what it could not record, and of the requests its kernel
# program saw and kept (a failure's message shows them: which side lost a request)
LOSS_COUNTERS = tuple(
    s.name
    for s in (
        am.P_EVENT_ERRORS,
        am.P_UNANSWERED,
        am.P_LOST_EVENTS,
        am.P_SHED_RECORDS,
        am.P_LOST_EXCHANGES,
        am.P_HTTP1_UNFRAMED,
        am.P_BPF_MISSED_RUNS,
        am.P_UNFOLLOWED_READS,
        am.P_CONN_EVICTIONS,
        am.P_TRACEPARENT_MISSED,
        am.P_UNPARSED,
        am.P_LISTEN_DROPS,
        am.P_REQUESTS_SEEN,
        am.P_REQUESTS_TRACED,
    )
)


def missing_tools() -> str | None:
    """Why the harness cannot run here (root and the tools), or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, nftables)"
    gone = [t for t in TOOLS if shutil.which(t) is None]
    if gone:
        return (
            f"{', '.join(gone)} not found (Debian packages iproute2, nftables: make setup"
            " installs them)"
        )
    return None


def _run(*argv: str, stdin: str | None = None) -> str:
    p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


@dataclass
class Counts:
    retrans_segs: int  # TcpRetransSegs: every segment sent again
    synack: int  # TcpExtTCPSynRetrans: SYN (-ACK) segments sent again

    def __sub__(self, o: Counts) -> Counts:
        return Counts(self.retrans_segs - o.retrans_segs, self.synack - o.synack)


class NetLoss:
    """The two namespaces, the veth pair between them, the loss rule and the kernel's
    counts. A context manager: everything is removed at its end."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.srv_ns, self.cli_ns = f"pxl{tag}s", f"pxl{tag}c"
        self.srv_if, self.cli_if = f"pxl{tag}s", f"pxl{tag}c"
        octet = os.getpid() % 200 + 20
        self.srv_ip, self.cli_ip = f"10.77.{octet}.1", f"10.77.{octet}.2"
        self.port = 0
        self.loss = 0

    def __enter__(self) -> NetLoss:
        try:
            _run("ip", "netns", "add", self.srv_ns)
            _run("ip", "netns", "add", self.cli_ns)
            _run("ip", "link", "add", self.srv_if, "type", "veth", "peer", "name", self.cli_if)
            for ns, ifname, ip in (
                (self.srv_ns, self.srv_if, self.srv_ip),
                (self.cli_ns, self.cli_if, self.cli_ip),
            ):
                _run("ip", "link", "set", ifname, "netns", ns)
                _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", ifname)
                _run("ip", "-n", ns, "link", "set", ifname, "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        for ns in (self.cli_ns, self.srv_ns):  # (deleting a namespace deletes its veth end)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)

    def in_ns(self, ns: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", ns, *argv]

    def set_loss(self, percent: int) -> None:
        """Drop ``percent`` % of the server's packets on their arrival in the client's
        namespace (0: no rule)."""
        self.loss = percent
        rules = "flush ruleset\n"
        if percent:
            rules += (
                "table inet pxloss {\n chain input {\n"
                "  type filter hook input priority 0; policy accept;\n"
                f"  ip saddr {self.srv_ip} tcp sport {self.port}"
                f" numgen random mod 100 < {percent} drop\n }}\n}}\n"
            )
        _run(*self.in_ns(self.cli_ns, ["nft", "-f", "-"]), stdin=rules)

    def counts(self) -> Counts:
        """The server namespace's counters now (nstat: absolute values, its history file
        left alone)."""
        out = _run(
            *self.in_ns(self.srv_ns, ["nstat", "-asz", "TcpRetransSegs", "TcpExtTCPSynRetrans"])
        )
        rows = [ln.split() for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]
        got = {r[0]: int(r[1]) for r in rows if len(r) >= 2}
        return Counts(got.get("TcpRetransSegs", 0), got.get("TcpExtTCPSynRetrans", 0))

    @contextmanager
    def server(self, dual_stack: bool = False) -> Iterator[subprocess.Popen[str]]:
        """The HTTP server in the server's namespace; ``self.port`` is its port.
        ``dual_stack``: it listens on ``::`` (IPv4 clients then reach an IPv6 socket, their
        addresses v4-mapped)."""
        host = "::" if dual_stack else self.srv_ip
        argv = [PY, "-m", "tests.agent.netloss", "serve", "--host", host]
        p = subprocess.Popen(
            self.in_ns(self.srv_ns, argv), cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        try:
            assert p.stdout is not None
            line = p.stdout.readline()
            if not line.strip().isdigit():
                raise RuntimeError("the netloss server did not start")
            self.port = int(line)
            yield p
        finally:
            p.terminate()
            p.wait(10)

    def clients(self, n: int, concurrency: int, sizes: list[int]) -> dict[str, Any]:
        """``n`` requests from the client's namespace, each on a new connection: their
        trace ids, failures, the wall time."""
        argv = [PY, "-m", "tests.agent.netloss", "client", "--host", self.srv_ip]
        argv += ["--port", str(self.port), "-n", str(n), "-c", str(concurrency)]
        argv += ["--sizes", ",".join(map(str, sizes))]
        out = subprocess.run(
            self.in_ns(self.cli_ns, argv),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        result: dict[str, Any] = json.loads(out.stdout)
        return result


# -- the server and the client (each run in its namespace) ------------------------------
class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        q = parse_qs(urlsplit(self.path).query)
        n = int(q.get("n", ["200"])[0])
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(n))
        self.end_headers()
        self.wfile.write(b"x" * n)


class _DualStack(ThreadingHTTPServer):
    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def serve(host: str) -> None:
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.request_queue_size = 256
    cls = _DualStack if ":" in host else ThreadingHTTPServer
    srv = cls((host, 0), _Handler)
    print(srv.server_address[1], flush=True)
    srv.serve_forever()


def client(host: str, port: int, n: int, concurrency: int, sizes: list[int]) -> None:
    ids: list[str] = []
    ports: dict[str, int] = {}  # trace id -> the client's port (a failure's clue)
    failed: list[str] = []
    lock = threading.Lock()
    todo = iter(range(n))

    def one(i: int) -> None:
        ctx = trace_context.generate()
        size = sizes[i % len(sizes)]
        req = (
            f"GET /r?n={size} HTTP/1.1\r\nHost: {host}\r\ntraceparent: {ctx.header()}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        lport = 0
        try:
            with socket.create_connection((host, port), timeout=60) as s:
                lport = s.getsockname()[1]
                s.sendall(req)
                got = b""
                while d := s.recv(65536):
                    got += d
            ok = got.startswith(b"HTTP/1.1 200") and got.endswith(b"x" * min(size, 16))
        except OSError as e:
            ok, got = False, str(e).encode()
        with lock:
            (ids if ok else failed).append(ctx.trace_id if ok else got[:80].decode("latin-1"))
            ports[ctx.trace_id] = lport

    def worker() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            one(i)

    t0 = time.monotonic()
    ts = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out = {"ids": ids, "ports": ports, "failed": failed, "wall_s": time.monotonic() - t0}
    json.dump(out, sys.stdout)


# -- a run with the agent -----------------------------------------------------------------
@dataclass
class Result:
    loss: int
    requests: int
    recorded: int
    agent: int  # the sum of the records' retransmits
    kernel: Counts
    wait_us: list[int]  # the records' retransmit waits (those timed)
    with_retrans: int  # records with retransmits
    untimed: int  # records with retransmits and no wait
    wall_s: float
    missing: list[str]  # trace ids of answered requests without a record (a failure's clue)
    # of those, the client's port, and what the agent recorded on a connection from that
    # port over the run (its trace id, status, retransmits): none, or a record whose trace
    # id is not the request's
    missing_ports: dict[str, tuple[int, list[str]]]
    # the kernel's skipped runs of the agent's programs so far (bpf_missed_runs), nonzero
    missed_runs: dict[str, int]
    # the agent's LOSS_COUNTERS at the run's end, nonzero (shown when a count falls short)
    counted: dict[str, float]

    def line(self) -> str:
        k = self.kernel
        waits = sorted(self.wait_us)

        def q(f: float) -> str:
            return f"{waits[min(len(waits) - 1, int(f * len(waits)))] / 1000:.1f}"

        spread = f"; waits ms: median {q(0.5)}, P90 {q(0.9)}, max {q(1.0)}" if waits else ""
        return (
            f"loss {self.loss} %: {self.recorded}/{self.requests} requests recorded in"
            f" {self.wall_s:.1f} s; retransmits: agent {self.agent}, kernel {k.retrans_segs}"
            f" (TcpRetransSegs; {k.synack} of them SYN-ACKs, TcpExtTCPSynRetrans);"
            f" {self.with_retrans} requests with retransmits, {len(waits)} timed,"
            f" {self.untimed} not{spread}"
            + (f"; not recorded: {', '.join(self.missing[:5])}" if self.missing else "")
            + "".join(
                f"; {tid} from port {port}: on that port {seen or 'no record'}"
                for tid, (port, seen) in list(self.missing_ports.items())[:5]
            )
            + (f"; runs the kernel skipped: {self.missed_runs}" if self.missed_runs else "")
            + (f"; the agent counted: {self.counted}" if self.short() else "")
        )

    def short(self) -> bool:
        """Whether a request went unrecorded or a retransmit uncounted."""
        return bool(self.missing) or self.agent != self.kernel.retrans_segs


def _missed_runs(agent: Any) -> dict[str, int]:
    """The agent's programs whose runs the kernel skipped (nested on another BPF program)."""
    head = 'parallax_agent_bpf_missed_runs_total{program="'
    got = {k[len(head) : -2]: int(v) for k, v in agent.metrics().items() if k.startswith(head)}
    return {k: v for k, v in got.items() if v}


def run(
    net: NetLoss,
    agent: Any,
    loss: int,
    n: int,
    concurrency: int,
    sizes: list[int],
    wait_s: float = 20.0,
) -> Result:
    """One run at ``loss`` % against a traced server: the clients, then the agent's records
    of their trace ids (waited for up to ``wait_s``) against the kernel's count over the
    same span."""
    net.set_loss(loss)
    before = net.counts()
    out = net.clients(n, concurrency, sizes)
    ids = set(out["ids"])
    # the last sockets end (their FIN acknowledged) and the agent's records come out
    deadline = time.monotonic() + wait_s
    recs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        recs = [r for r in agent.records() if r["trace_id"] in ids]
        if len(recs) >= len(ids):
            break
        time.sleep(0.2)
    time.sleep(1.5)  # (a socket whose FIN is still being sent again)
    recs = [r for r in agent.records() if r["trace_id"] in ids]
    net.set_loss(0)
    after = net.counts()
    rt = [r for r in recs if r["retransmits"]]
    missing = sorted(ids - {r["trace_id"] for r in recs})
    by_port: dict[int, list[str]] = {}
    if missing:
        for r in agent.records():
            by_port.setdefault(r["peer_port"], []).append(
                f"{r['trace_id']} {r['status']} rtx {r['retransmits']}"
            )
    return Result(
        loss=loss,
        requests=n - len(out["failed"]),
        recorded=len(recs),
        agent=sum(r["retransmits"] for r in recs),
        kernel=after - before,
        wait_us=[r["retransmit_wait_us"] for r in rt if r["retransmit_wait_us"] is not None],
        with_retrans=len(rt),
        untimed=sum(1 for r in rt if r["retransmit_wait_us"] is None),
        wall_s=out["wall_s"],
        missing=missing,
        missed_runs=_missed_runs(agent),
        counted={k: v for k, v in agent.metrics().items() if k.startswith(LOSS_COUNTERS) and v},
        missing_ports={t: (out["ports"][t], by_port.get(out["ports"][t], [])) for t in missing[:5]},
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    s = sub.add_parser("serve")
    s.add_argument("--host", required=True)
    c = sub.add_parser("client")
    c.add_argument("--host", required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("-n", type=int, default=100)
    c.add_argument("-c", type=int, default=16)
    c.add_argument("--sizes", default="200")
    ap.add_argument("--loss", type=int, default=5)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--sizes", default="200,20000", help="response sizes, in turn")
    ap.add_argument("--dual-stack", action="store_true", help="the server listens on ::")
    a = ap.parse_args()
    if a.cmd == "serve":
        serve(a.host)
        return 0
    if a.cmd == "client":
        client(a.host, a.port, a.n, a.c, [int(x) for x in a.sizes.split(",")])
        return 0
    why = missing_tools()
    if why:
        print(f"netloss: {why}", file=sys.stderr)
        return 2
    import tempfile

    from tests.agent.helpers import Agent

    sizes = [int(x) for x in a.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp, NetLoss() as net, net.server(a.dual_stack):
        agent = Agent(Path(tmp), [net.port], ["--cpu-budget", "0"])
        try:
            for loss in (0, a.loss):
                print(run(net, agent, loss, a.requests, a.concurrency, sizes).line(), flush=True)
        finally:
            agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
