"""``python -m bench.http2`` (part of ``make bench-agent``): what tracing a request costs over
HTTP/2 and gRPC beside HTTP/1, side by side in one run.

Three cases, each a streamed response of 8 tokens with no wait (the per-write costs show):

* ``HTTP/1.1``: Hypercorn serving demo/llm_app.py's ``/v1/stream`` (SSE, chunked) to an
  httpx HTTP/1.1 client, 10 keep-alive connections;
* ``h2c``: the same Hypercorn process and route over HTTP/2 with prior knowledge, 10
  concurrent streams on one connection (httpx, HTTP/2);
* ``gRPC``: tests/agent/servers/grpc_server.py (grpcio, server streaming, 8 messages) called
  by a grpcio (asyncio) client, 10 concurrent calls on one channel.

The load is paced (each of the 10 workers waits out ``10 / rate`` between its requests; one
Python client process, so the rates are modest). For each case, ``--repeats`` rounds of an
untraced run then a traced one (a fresh agent, ``--cpu-budget 0``: every request traced),
rounds interleaved. Per request, medians over the rounds: BPF ns (``kernel.bpf_stats_enabled``:
every program of the agent), the agent's user-space CPU (total, and marginal: the idle
agent's subtracted), the server's CPU untraced → traced, and the records / requests.

    python -m bench.http2 [--seconds 5] [--repeats 3] [--rate 200] [--no-write]
                          [--cases http1,h2c,grpc] [--drain-ms MS]

``--cases``: some of the three only; ``--drain-ms``: the agent's shortest drain period (its
hidden flag). Hypercorn ends an h2 connection after 1,000 streams: keep ``--seconds`` ×
``--rate`` under that for h2c.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import report
from bench.agent import (
    AgentProc,
    _cpu_ns,
    _median,
    _range,
    _wait_port,
    measure_traced,
    terminate_all,
)
from demo.stack import free_port

ROOT = Path(__file__).resolve().parent.parent
TOKENS = 8
PATH = f"/v1/stream?first_token_ms=0&token_gap_ms=0&tokens={TOKENS}"
HYPERCORN = """
import asyncio, sys
from hypercorn.asyncio import serve
from hypercorn.config import Config
from demo.llm_app import LlmApp, Pacing, bind
sock = bind("127.0.0.1", int(sys.argv[1]))
c = Config()
c.bind = [f"fd://{sock.fileno()}"]
c.accesslog = c.errorlog = None
asyncio.run(serve(LlmApp(Pacing(0, 0, 1)), c))
"""
# The paced client: prints {"requests": n, "p50_us": ...} when done.
CLIENT = """
import asyncio, json, statistics, sys, time
kind, port, seconds, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
path, tokens, workers = sys.argv[5], int(sys.argv[6]), 10
lat = []
async def paced(one):
    end = time.monotonic() + seconds
    nxt = time.monotonic()
    while time.monotonic() < end:
        t = time.monotonic()
        await one()
        lat.append(time.monotonic() - t)
        nxt += workers / rate
        await asyncio.sleep(max(0.0, nxt - time.monotonic()))
async def main():
    if kind == "grpc":
        import grpc
        ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.enable_http_proxy", 0)])
        call = ch.unary_stream("/parallax.test.Tokens/Stream")
        req = f"n={tokens},first_ms=0,gap_ms=0".encode()
        async def one():
            async for _ in call(req):
                pass
        await asyncio.gather(*(paced(one) for _ in range(workers)))
        await ch.close()
        return
    import httpx
    h2 = kind == "h2c"
    limits = httpx.Limits(max_connections=1 if h2 else workers)
    async with httpx.AsyncClient(http1=not h2, http2=h2, trust_env=False, limits=limits) as c:
        async def one():
            r = await c.get(f"http://127.0.0.1:{port}{path}")
            assert r.status_code == 200
        await asyncio.gather(*(paced(one) for _ in range(workers)))
asyncio.run(main())
print(json.dumps({"requests": len(lat), "p50_us": statistics.median(lat) * 1e6 if lat else 0}))
"""


@dataclass
class Case:
    name: str
    kind: str  # the client: http1, h2c, grpc
    port: int
    pid: int
    runs: list[dict[str, float]] = field(default_factory=list)
    untraced: list[dict[str, float]] = field(default_factory=list)
    breakdown: dict[str, tuple[float, float]] = field(default_factory=dict)


def load(case: Case, seconds: float, rate: float) -> dict[str, float]:
    """One paced client run against the case, with the server's CPU over it."""
    cpu0 = _cpu_ns(case.pid)
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            CLIENT,
            case.kind,
            str(case.port),
            str(seconds),
            str(rate),
            PATH,
            str(TOKENS),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    res: dict[str, float] = json.loads(p.stdout.strip().splitlines()[-1])
    res["rps"] = res["requests"] / seconds
    res["server_us_per_req"] = (_cpu_ns(case.pid) - cpu0) / 1e3 / max(1.0, res["requests"])
    return res


def traced_run(
    case: Case, tmp: Path, seconds: float, rate: float, idle: float, flags: tuple[str, ...]
) -> None:
    tmp.mkdir()
    agent = AgentProc(case.port, tmp, flags)
    try:
        time.sleep(1.5)  # the first rescan has found the server
        # (0.3 s after the load: the agent drains its ring on a timer — its CPU for these)
        res, case.breakdown = measure_traced(
            agent.p.pid, idle, lambda: load(case, seconds, rate), settle_s=0.3
        )
    finally:
        agent.stop()
    time.sleep(1.0)
    jsonl = tmp / "agent.jsonl"
    lines = jsonl.read_text().splitlines() if jsonl.exists() else []
    res["records"] = len(lines)
    # a check that the figures are of what they claim: every record a whole stream
    res["whole"] = sum(1 for x in lines if json.loads(x)["chunks"] >= TOKENS)
    case.runs.append(res)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.http2",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rate", type=float, default=200, help="requests/s per case")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--cases", default="http1,h2c,grpc", help="the cases to run, by client kind")
    ap.add_argument("--drain-ms", type=float, help="the agent's shortest drain period")
    a = ap.parse_args(argv)
    flags: tuple[str, ...] = ("--cpu-budget", "0")
    if a.drain_ms is not None:
        flags += ("--drain-ms", str(a.drain_ms))
    if os.geteuid() != 0:
        print("bench.http2: needs root (make setup)", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="px-bench-h2-"))
    hport = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HYPERCORN, str(hport)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        ),
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.agent.servers.grpc_server",
                "--timing-log",
                str(tmp / "grpc.jsonl"),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        ),
    ]
    started = time.monotonic()
    try:
        assert procs[1].stdout is not None
        gport = int(procs[1].stdout.readline())
        for port in (hport, gport):
            _wait_port(port)
        cases = [
            Case("Hypercorn HTTP/1.1", "http1", hport, procs[0].pid),
            Case("Hypercorn h2c", "h2c", hport, procs[0].pid),
            Case("grpcio server stream", "grpc", gport, procs[1].pid),
        ]
        cases = [c for c in cases if c.kind in a.cases.split(",")]
        for c in cases:  # warm-up
            load(c, 1, a.rate)
        agent = AgentProc(hport, tmp, flags)
        try:
            time.sleep(1.5)
            cpu0, t0 = _cpu_ns(agent.p.pid), time.monotonic()
            time.sleep(5)
            idle = (_cpu_ns(agent.p.pid) - cpu0) / 1e9 / (time.monotonic() - t0)
        finally:
            agent.stop()
        for i in range(a.repeats):
            for c in cases:
                c.untraced.append(load(c, a.seconds, a.rate))
                traced_run(c, tmp / f"{c.kind}-{i}", a.seconds, a.rate, idle, flags)
                u, t = c.untraced[-1], c.runs[-1]
                print(
                    f"round {i + 1} {c.name}: BPF {t['bpf_ns_per_req']:.0f} ns/req, agent"
                    f" {t['cpu_us_per_req']:.1f} µs/req (marginal"
                    f" {t['marginal_us_per_req']:.1f}), server {u['server_us_per_req']:.0f} →"
                    f" {t['server_us_per_req']:.0f} µs/req, {t['records']:.0f} records"
                    f" ({t['whole']:.0f} whole) of {t['requests']:.0f}",
                    file=sys.stderr,
                )
    finally:
        terminate_all(procs)
    md = summary(cases, a, idle, time.monotonic() - started)
    print(md)
    if not a.no_write:
        report.write_section("http2", md)
    return 0


def summary(cases: list[Case], a: argparse.Namespace, idle: float, took: float) -> str:
    lines = [
        "## HTTP/2 and gRPC beside HTTP/1 (`python -m bench.http2`, part of `make bench-agent`)",
        "",
        f"Machine: {report.machine()}. Commit {report.git_rev()}. Command:"
        f" `python -m bench.http2 --seconds {a.seconds:g} --repeats {a.repeats}"
        f" --rate {a.rate:g}"
        + (f" --cases {a.cases}" if a.cases != "http1,h2c,grpc" else "")
        + (f" --drain-ms {a.drain_ms:g}" if a.drain_ms is not None else "")
        + f"` ({took:.0f} s).",
        "",
        f"Each request a stream of {TOKENS} tokens with no wait: Hypercorn serving"
        " demo/llm_app.py's `/v1/stream` over HTTP/1.1 (10 keep-alive connections) and over"
        " h2c (10 concurrent streams on one connection), and a grpcio server-streaming call"
        f" of {TOKENS} messages (10 concurrent calls on one channel); one paced Python client"
        f" process, {a.rate:g} requests/s a case, {a.seconds:g} s a run. {a.repeats} rounds; in"
        " each, every case untraced then traced (a fresh agent, `--cpu-budget 0`: every"
        " request traced). Medians over the rounds, ranges min–max. BPF ns/req: every"
        " program of the agent over the run, per request. Agent CPU: its user-space run time"
        " per request (total / marginal: the idle agent's subtracted). *Whole* = records with"
        f" all {TOKENS} chunks.",
        "",
        "| Case | req/s | BPF ns/req | BPF range | agent CPU µs/req (total / marginal)"
        " | server CPU µs/req untraced → traced | p50 µs untraced → traced"
        " | records (whole) / requests |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        t = {k: [r[k] for r in c.runs] for k in c.runs[0]}
        u = {k: [r[k] for r in c.untraced] for k in c.untraced[0]}
        lines.append(
            f"| {c.name} | {_median(t['rps']):.0f} | {_median(t['bpf_ns_per_req']):.0f}"
            f" | {_range(t['bpf_ns_per_req'])} | {_median(t['cpu_us_per_req']):.1f} /"
            f" {_median(t['marginal_us_per_req']):.1f} | {_median(u['server_us_per_req']):.0f}"
            f" → {_median(t['server_us_per_req']):.0f} | {_median(u['p50_us']):.0f} →"
            f" {_median(t['p50_us']):.0f} | {sum(t['records']):.0f} ({sum(t['whole']):.0f}) /"
            f" {sum(t['requests']):.0f} |"
        )
    lines += [
        "",
        f"Idle agent (same flags, no load): {idle:.4f} cores. Per program in the last traced"
        " run of each case (ns per request, runs per request):",
        "",
    ]
    for c in cases:
        top = sorted(c.breakdown.items(), key=lambda kv: -kv[1][0])[:6]
        lines.append(
            f"- {c.name}: "
            + ", ".join(f"`{k}` {ns:.0f} ns ×{runs:.2f}" for k, (ns, runs) in top if runs)
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
