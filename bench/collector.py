"""Collector benchmark: ``make bench-collector`` (``python -m bench.collector``).

A real collector (subprocess, embedded chDB in a tmp dir) receives offered loads from a
separate load-generator process: OTLP/protobuf requests of 500 spans and beacons of 50
entries, one span and one entry per trace (so every entry pairs). Measured:

- the collector's CPU (utime + stime from /proc) per 1,000 spans and per 1,000 entries,
  each at a steady load of that kind alone;
- the highest sustained combined rate: offered rates step up; a step is sustained when the
  generator delivered ≥ 95 % of the offered rate and the collector's queue did not grow
  (queued rows after the step ≤ two batches);
- p99 ingest latency (request sent → 2xx received, in the generator) per step;
- bytes on disk per million rows (system.parts, after the run).

Writes its section of docs/benchmarks.md via bench.report.write_section("collector", …).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from bench import report

SPANS_PER_REQ = 500
ENTRIES_PER_REQ = 50
TICK = os.sysconf("SC_CLK_TCK")


def add_attributes(
    attrs: Any, items: Iterable[tuple[str, str | int]], offsets: Iterable[int] = ()
) -> None:
    """OTLP KeyValues on a protobuf ``attributes`` field, as the agent exports them (strings
    and ints; ``offsets``, when given, as ``parallax.chunk_offsets_us``)."""
    for key, val in items:
        kv = attrs.add()
        kv.key = key
        if isinstance(val, str):
            kv.value.string_value = val
        else:
            kv.value.int_value = val
    offsets = list(offsets)
    if offsets:
        kv = attrs.add()
        kv.key = "parallax.chunk_offsets_us"
        for off in offsets:
            kv.value.array_value.values.add().int_value = off


# --- load generator (runs in its own process) ----------------------------------------
def _bodies(
    n_traces: int, seed: int, resource: Iterable[tuple[str, str]] = ()
) -> tuple[list[bytes], list[bytes]]:
    """OTLP bodies and beacon bodies covering ``n_traces`` traces, one span + one entry each;
    ``resource``: more Resource attributes (strings) after service.name and host.name."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    rnd = os.urandom
    now_ns = time.time_ns()
    origin_ms = now_ns / 1e6 - 60_000
    spans_out, beacons_out = [], []
    traces = [(rnd(16), rnd(8)) for _ in range(n_traces)]
    for i in range(0, n_traces, SPANS_PER_REQ):
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        for k, v in (("service.name", "bench-app"), ("host.name", "node-1"), *resource):
            kv = rs.resource.attributes.add()
            kv.key, kv.value.string_value = k, v
        ss = rs.scope_spans.add()
        for tid, parent in traces[i : i + SPANS_PER_REQ]:
            sp = ss.spans.add()
            sp.trace_id, sp.span_id, sp.parent_span_id = tid, rnd(8), parent
            sp.kind = Span.SpanKind.SPAN_KIND_SERVER
            sp.name = "GET /api/chat"
            t1 = int((origin_ms + 110) * 1e6)
            sp.start_time_unix_nano, sp.end_time_unix_nano = t1, t1 + 80_000_000
            items: tuple[tuple[str, str | int], ...] = (
                ("parallax.source", "ebpf"),
                ("http.request.method", "GET"),
                ("url.path", "/api/chat"),
                ("server.port", 8000),
                ("http.response.status_code", 200),
                ("parallax.arrival_unix_ns", t1 - 1_000_000),
                ("parallax.ttfb_us", 20_000),
                ("parallax.ttft_us", 25_000),
                ("parallax.recv_queue_us", 500),
                ("parallax.duration_us", 80_000),
                ("parallax.chunks", 8),
            )
            add_attributes(sp.attributes, items, range(25_000, 80_000, 7_000))
        spans_out.append(req.SerializeToString())
    for i in range(0, n_traces, ENTRIES_PER_REQ):
        entries = [
            {
                "trace_id": tid.hex(),
                "span_id": parent.hex(),
                "kind": "fetch",
                "method": "GET",
                "url": "https://app.example/api/chat",
                "status": 200,
                "start_ms": 100.0,
                "request_start_ms": 101.5,
                "response_start_ms": 150.25,
                "first_chunk_ms": 160.0,
                "chunk_ms": [160.0 + 7 * j for j in range(8)],
                "rendered_ms": 175.0,
                "response_end_ms": 215.0,
            }
            for tid, parent in traces[i : i + ENTRIES_PER_REQ]
        ]
        doc = {
            "v": 1,
            "site": "bench",
            "session": f"session-{seed}-{i}",
            "page": "/",
            "time_origin": origin_ms,
            "entries": entries,
        }
        beacons_out.append(json.dumps(doc).encode())
    return spans_out, beacons_out


class _Conn:
    """One keep-alive HTTP/1.1 connection on asyncio streams. The load generator shares the
    2 cores with the collector; httpx spent about 2 ms of CPU per request here, as much as
    the collector spent on the rows, so a lean client leaves the collector its share."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, ctype: str, body: bytes) -> int:
        if self.writer is None or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        try:
            self.writer.write(head + body)
            await self.writer.drain()
            status_line = await self.reader.readuntil(b"\r\n")
            headers = await self.reader.readuntil(b"\r\n\r\n")
            n = 0
            for line in headers.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    n = int(line[15:])
            if n:
                await self.reader.readexactly(n)
            if b"connection: close" in headers.lower():
                self.close()
            return int(status_line.split(b" ", 2)[1])
        except (OSError, asyncio.IncompleteReadError, ValueError):
            self.close()
            raise

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _offer(
    base: str,
    spans: list[bytes],
    beacons: list[bytes],
    span_rate: float,
    entry_rate: float,
    seconds: float,
) -> dict[str, Any]:
    lat: list[float] = []
    errors: dict[str, int] = {}
    sent = {"spans": 0, "entries": 0}
    host, port = base.removeprefix("http://").rsplit(":", 1)
    queue: asyncio.Queue[tuple[float, str, bytes] | None] = asyncio.Queue()

    async def worker() -> None:
        conn = _Conn(host, int(port))
        while (item := await queue.get()) is not None:
            t, kind, body = item  # t: when it was due (latency includes waiting for a connection)
            ctype, path = (
                ("application/x-protobuf", "/v1/traces")
                if kind == "spans"
                else ("text/plain", "/v1/beacons")
            )
            try:
                code = str(await asyncio.wait_for(conn.post(path, ctype, body), 30))
            except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as e:
                conn.close()
                code = type(e).__name__
            if code == "200":
                lat.append(time.perf_counter() - t)
                sent[kind] += SPANS_PER_REQ if kind == "spans" else ENTRIES_PER_REQ
            else:
                errors[code] = errors.get(code, 0) + 1
        conn.close()

    plan = []
    for kind, rate, bodies, per in (
        ("spans", span_rate, spans, SPANS_PER_REQ),
        ("entries", entry_rate, beacons, ENTRIES_PER_REQ),
    ):
        if rate <= 0:
            continue
        n = int(rate * seconds / per)
        plan += [(j * per / rate, kind, bodies[j % len(bodies)]) for j in range(n)]
    plan.sort(key=lambda p: p[0])
    workers = [asyncio.create_task(worker()) for _ in range(32)]
    start = time.perf_counter()
    for at, kind, body in plan:
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        while queue.qsize() > 256:  # the collector is not keeping up; do not pile on forever
            await asyncio.sleep(0.005)
        queue.put_nowait((time.perf_counter(), kind, body))
    for _ in workers:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    elapsed = time.perf_counter() - start
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan")
    return {
        "spans": sent["spans"],
        "entries": sent["entries"],
        "elapsed": elapsed,
        "p99_ms": p99 * 1000,
        "p50_ms": lat[len(lat) // 2] * 1000 if lat else float("nan"),
        "errors": errors,
    }


def _gen_main(conn: Any, base: str) -> None:
    while True:
        msg = conn.recv()
        if msg is None:
            return
        n_traces, seed, span_rate, entry_rate, seconds = msg
        spans, beacons = _bodies(n_traces, seed)
        conn.send("ready")
        conn.recv()
        conn.send(asyncio.run(_offer(base, spans, beacons, span_rate, entry_rate, seconds)))


def _load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def _stages(data_dir: Path, n: int = 20_000) -> dict[str, float]:
    """CPU per span + entry pair of each stage, measured in this process (its own chDB)."""
    code = (
        "import json, os, sys, time\n"
        "from pathlib import Path\n"
        "from bench.collector import _bodies\n"
        "from collector.ingest import otlp, beacons\n"
        "from collector.metrics import Metrics\n"
        "from collector.pairing.pairer import Pairer\n"
        "from collector.store import schema\n"
        "from collector.store.client import Store\n"
        "import gc\n"
        "from collector.service import GC_THRESHOLD0\n"
        "n = int(sys.argv[2]); st = Store('chdb://' + sys.argv[1]); st.migrate(7)\n"
        "spans, bcs = _bodies(n, 7); now = time.time_ns(); res = {}\n"
        # As the service runs: the start-up objects frozen, the young-generation threshold
        # raised; and one insert per table first (the driver imports pandas on its first).
        "gc.collect(); gc.freeze(); gc.set_threshold(GC_THRESHOLD0, 20, 10)\n"
        "w = _bodies(10, 8)\n"
        "wr = otlp.parse(w[0][0], False, now, 0, now).rows\n"
        "st.insert(schema.SPANS, list(zip(*wr)), schema.column_names(schema.SPAN_COLUMNS))\n"
        "def cpu():\n    t = os.times(); return t.user + t.system\n"
        "t = cpu(); sr = [r for b in spans for r in otlp.parse(b, False, now, 0, now).rows]\n"
        "res['parse + validate spans (OTLP protobuf)'] = cpu() - t\n"
        "t = cpu(); er = [r for b in bcs for r in beacons.parse(beacons.read(b), now, 0, now)"
        ".rows]\n"
        "res['parse + validate entries (beacon JSON)'] = cpu() - t\n"
        "for name, rows, cols, tab in (('insert spans', sr, schema.SPAN_COLUMNS, schema.SPANS),"
        " ('insert entries', er, schema.ENTRY_COLUMNS, schema.ENTRIES)):\n"
        "    t = cpu()\n"
        "    for i in range(0, n, 5000):\n"
        "        st.insert(tab, list(zip(*rows[i:i+5000])), schema.column_names(cols))\n"
        "    res[name + ' (incl. trace-id view)'] = cpu() - t\n"
        "pa = Pairer(st, Metrics())\n"
        "pa.offer(wr, [r for b in w[1] for r in beacons.parse(beacons.read(b), now, 0, now)"
        ".rows])\n"
        "pa.pair_round(pa._take_due()); t = cpu()\n"
        "for i in range(0, n, 5000):\n"
        "    pa.offer(sr[i:i+5000], er[i:i+5000])\n"
        "    while (b := pa._take_due()):\n"
        "        pa.pair_round(b)\n"
        "res['pairing in memory + insert pairs'] = cpu() - t\n"
        "print(json.dumps({k: v / n * 1e6 for k, v in res.items()}))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(data_dir.resolve()), str(n)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parent.parent,
    )
    if p.returncode != 0:
        return {"(stage measurement failed)": float("nan")}
    out: dict[str, float] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def _proc_cpu_s(pid: int | None) -> float:
    """utime + stime of a process, seconds."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def _thread_groups(pid: int | None) -> dict[str, float]:
    """CPU seconds of a process by thread group, from /proc/<pid>/task/*/stat. Python threads
    are named after the interpreter, or "Unknown" once chDB has run a query on them (it
    renames its callers); chDB's own pools carry their names (MergeMutate: merges)."""
    out = {"python": 0.0, "merges": 0.0, "chdb": 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        f = stat.rsplit(")", 1)[1].split()
        cpu = (int(f[11]) + int(f[12])) / TICK
        if name.startswith("python") or name == "Unknown":
            out["python"] += cpu
        elif name.startswith("MergeMutate"):
            out["merges"] += cpu
        else:
            out["chdb"] += cpu
    return out


# --- the collector under test --------------------------------------------------------
class Target:
    def __init__(self, data_dir: Path, port: int, qport: int, extra: tuple[str, ...] = ()):
        self.data_dir = data_dir
        self.base = f"http://127.0.0.1:{port}"
        self.query = f"http://127.0.0.1:{qport}"
        self.log = (data_dir.parent / "collector.log").open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "collector.cli",
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--admin-listen",
                f"127.0.0.1:{qport}",
                "--data-dir",
                str(data_dir),
                "--rate",
                "0",
                "--log-level",
                "WARNING",
                "--no-plugins",
                *extra,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.query}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SystemExit("collector did not become ready")

    def cpu_s(self) -> float:
        return _proc_cpu_s(self.proc.pid)

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.query}/metrics", timeout=10).text
        total = 0.0
        for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M):
            total += float(m.group(2))
        return total

    def settle(self, timeout_s: float = 60.0) -> float:
        """Seconds until the queue is empty and the pairer's delayed look-ups (5 s for a
        span waiting for its beacon, a 5 s recheck for a one-sided trace) are done, so the
        next step's CPU is its own."""
        t = time.monotonic()
        while time.monotonic() - t < timeout_s:
            if self.metric("parallax_collector_queue_rows") == 0:
                break
            time.sleep(0.2)
        time.sleep(11.0)
        return time.monotonic() - t

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()


_DISK = (
    "import json, sys, clickhouse_connect\n"
    "c = clickhouse_connect.get_client(dsn='chdb://' + sys.argv[1])\n"
    "c.command('OPTIMIZE TABLE parallax.server_spans FINAL')\n"
    "c.command('OPTIMIZE TABLE parallax.browser_entries FINAL')\n"
    "c.command('OPTIMIZE TABLE parallax.pairs FINAL')\n"
    'r = c.query("SELECT table, sum(rows), sum(bytes_on_disk) FROM system.parts WHERE '
    "database = 'parallax' AND active GROUP BY table\").result_rows\n"
    "print(json.dumps({t: [int(n), int(b)] for t, n, b in r}))\n"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step-seconds", type=float, default=8.0)
    ap.add_argument(
        "--rates",
        default="5000,10000,20000,30000,40000,50000,60000",
        help="combined offered rates (rows/s, half spans, half entries)",
    )
    ap.add_argument("--no-write", action="store_true", help="print, do not edit docs")
    args = ap.parse_args()
    from demo.stack import free_port

    tmp = Path(tempfile.mkdtemp(prefix="parallax-bench-"))
    target = Target(tmp / "data", free_port(), free_port())
    parent, child = mp.Pipe()
    ctx = mp.get_context("spawn")
    gen = ctx.Process(target=_gen_main, args=(child, target.base), daemon=True)
    gen.start()
    seed = 0

    def run(span_rate: float, entry_rate: float, seconds: float) -> dict[str, Any]:
        nonlocal seed
        seed += 1
        n = int(max(span_rate, entry_rate) * seconds) + SPANS_PER_REQ
        parent.send((n, seed, span_rate, entry_rate, seconds))
        assert parent.recv() == "ready"
        cpu0, q0 = target.cpu_s(), target.metric("parallax_collector_queue_rows")
        th0 = _thread_groups(target.proc.pid)
        gen0 = _proc_cpu_s(gen.pid)
        wall0 = time.monotonic()
        parent.send("go")
        res: dict[str, Any] = parent.recv()
        res["queue_after"] = target.metric("parallax_collector_queue_rows")
        res["cpu_s"] = target.cpu_s() - cpu0
        res["gen_cpu_s"] = _proc_cpu_s(gen.pid) - gen0
        res["queue_before"] = q0
        res["settle_s"] = target.settle()
        res["cpu_total_s"] = target.cpu_s() - cpu0
        th1 = _thread_groups(target.proc.pid)
        res["threads_s"] = {k: th1[k] - th0.get(k, 0.0) for k in th1}
        res["wall_s"] = time.monotonic() - wall0
        return res

    lines: list[str] = []
    load0 = _load()
    c0 = target.cpu_s()
    time.sleep(5.0)
    idle = (target.cpu_s() - c0) / 5.0  # CPU s per s with nothing offered
    stages = _stages(tmp / "stages")
    try:
        run(2000, 2000, 3)  # warm-up: imports, first parts, JIT-less but cache-warm
        spans_only = run(10_000, 0, args.step_seconds)
        entries_only = run(0, 10_000, args.step_seconds)

        def marginal_us(r: dict[str, Any], rows: int) -> float:
            # The collector's idle CPU (timers, merges of nothing) is not a per-row cost.
            return float(max(0.0, r["cpu_total_s"] - idle * r["wall_s"]) / max(1, rows) * 1e6)

        us_span = marginal_us(spans_only, spans_only["spans"])
        us_entry = marginal_us(entries_only, entries_only["entries"])
        steps = []
        best = 0.0
        for rate in (float(r) for r in args.rates.split(",")):
            r = run(rate / 2, rate / 2, args.step_seconds)
            rows = r["spans"] + r["entries"]
            # A short tail (the last requests in flight) is not falling behind.
            window = args.step_seconds if r["elapsed"] <= args.step_seconds + 2 else r["elapsed"]
            achieved = rows / window
            r["us_per_row"] = marginal_us(r, rows)
            sustained = (
                achieved >= 0.95 * rate and r["queue_after"] <= 2 * 20_000 and not r["errors"]
            )
            r.update(rate=rate, achieved=achieved, sustained=sustained)
            steps.append(r)
            print(json.dumps(r), flush=True)
            if sustained:
                best = max(best, achieved)
            else:
                break
    finally:
        parent.send(None)
        gen.join(10)
        target.stop()
    p = subprocess.run(
        [sys.executable, "-c", _DISK, str((tmp / "data" / "chdb").resolve())],
        capture_output=True,
        text=True,
        timeout=300,
    )
    disk = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {}
    shutil.rmtree(tmp, ignore_errors=True)  # the store and spool of this run (GBs over runs)
    lines += [
        "Collector (`make bench-collector` = `python -m bench.collector`): a real collector "
        "on the embedded store, loads offered from a separate process (OTLP/protobuf, 500 "
        "spans per request; beacons of 50 entries; every entry pairs with a span). Machine: "
        f"{report.machine()}; commit {report.git_rev()}.",
        "",
        "| Figure | Value | Goal |",
        "|---|---|---|",
        f"| collector CPU per 1,000 spans (10,000 spans/s offered, incl. write + pairing) "
        f"| {us_span:.0f} ms → {us_span:.1f} µs/span | ≤ 40 µs |",
        f"| collector CPU per 1,000 entries (10,000 entries/s offered, incl. write + pairing) "
        f"| {us_entry:.0f} ms → {us_entry:.1f} µs/entry | ≤ 40 µs |",
        f"| highest sustained combined rate (spans + entries, queue not growing) "
        f"| {best:,.0f} rows/s | ≥ 50,000/s |",
    ]
    if steps:
        ok = [r for r in steps if r["sustained"]]
        at = ok[-1] if ok else steps[0]
        lines.append(
            f"| collector CPU per row, spans + entries paired ({at['rate']:,.0f} rows/s) "
            f"| {at['us_per_row']:.1f} µs/row | ≤ 40 µs |"
        )
        if ok:
            lines.append(
                f"| p99 ingest latency at the highest sustained rate | {ok[-1]['p99_ms']:.1f} ms "
                "| — |"
            )
    for t, (rows, b) in sorted(disk.items()):
        if rows and t in ("server_spans", "browser_entries", "pairs"):
            lines.append(
                f"| bytes on disk per million rows, `{t}` | {b / rows * 1e6 / 2**20:.1f}"
                f" MiB ({rows:,} rows) | — |"
            )
    lines += [
        "",
        "| offered rows/s | delivered rows/s | p50 ingest ms | p99 ingest ms | "
        "queue after step | collector CPU s | collector µs/row | generator CPU s | sustained |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in steps:
        lines.append(
            f"| {r['rate']:,.0f} | {r['achieved']:,.0f} | {r['p50_ms']:.1f} | "
            f"{r['p99_ms']:.1f} | {r['queue_after']:,.0f} | {r['cpu_s']:.1f} | "
            f"{r['us_per_row']:.1f} | {r['gen_cpu_s']:.1f} | "
            f"{'yes' if r['sustained'] else 'no'} {r['errors'] or ''} |"
        )
    split = [("spans only, 10,000/s", spans_only), ("entries only, 10,000/s", entries_only)]
    ok_steps = [r for r in steps if r["sustained"]]
    if ok_steps:
        split.append((f"paired, {ok_steps[-1]['rate']:,.0f} rows/s", ok_steps[-1]))
    lines += [
        "",
        "Where the collector's CPU goes, by thread (`/proc/<pid>/task/*/stat`, µs per row, "
        "the step and its settling; idle not subtracted): Python threads (event loop: HTTP, "
        "parsing, validation, spool write; writer: column encoding and the inserts' calling "
        "thread; pairer; timers) against chDB's own pools (merges = MergeMutate; other = "
        "insert pipelines, schedules).",
        "",
        "| load | Python threads | chDB merges | chDB other | total |",
        "|---|---|---|---|---|",
    ]
    for label, r in split:
        n = max(1, r["spans"] + r["entries"])
        th = r["threads_s"]
        lines.append(
            f"| {label} | {th['python'] / n * 1e6:.1f} | {th['merges'] / n * 1e6:.1f} | "
            f"{th['chdb'] / n * 1e6:.1f} | {sum(th.values()) / n * 1e6:.1f} |"
        )
    lines += [
        "",
        "The generator (plain asyncio keep-alive connections, 32 of them; httpx cost as much "
        "CPU per row as the collector) shares the 2 cores with the collector, so the highest "
        "rate is a floor for a dedicated machine. CPU per row includes the HTTP server, parsing, "
        "validation, the spool write, the column-oriented inserts (and the trace-id "
        "materialized views), chDB's background merges, and pairing: in memory for a trace "
        "whose both sides came to this collector; a trace whose other side is nowhere is "
        "ruled out by the in-memory trace index (the embedded store has no other writer: no "
        "store look-up, no recheck) — the spans-only and entries-only figures are the case "
        "where no row pairs.",
        "",
        f"Load average of the machine (other work running): {load0} at start, "
        f"{_load()} at the end. CPU figures are marginal: the collector's idle CPU "
        f"({idle * 1000:.0f} ms/s, measured before the load) times each step's duration "
        "is subtracted.",
        "",
        "Where the CPU goes (in-process, one thread, 20,000 traces, µs per span + entry pair):",
        "",
        "| stage | µs per pair |",
        "|---|---|",
        *[f"| {k} | {v:.1f} |" for k, v in stages.items()],
        "",
        f"The stages add up to {sum(stages.values()):.1f} µs per pair = "
        f"{sum(stages.values()) / 2:.1f} µs per row; the end-to-end figures above add the HTTP "
        "server, the spool write, chDB's merges and the timers.",
    ]
    ok = [r for r in steps if r["sustained"]]
    if ok:
        top = ok[-1]
        rows = top["spans"] + top["entries"]
        c_us, g_us = top["us_per_row"], top["gen_cpu_s"] / max(1, rows) * 1e6
        lines += [
            "",
            f"Arithmetic: at {top['rate']:,.0f} rows/s the collector used {c_us:.1f} µs and the "
            f"load generator {g_us:.1f} µs of CPU per row; the two share 2 cores, so this "
            f"machine tops out near 2 s / ({c_us:.1f} + {g_us:.1f}) µs ≈ "
            f"{2e6 / (c_us + g_us):,.0f} rows/s, less the other work running. The collector's "
            "CPU is spread over threads (event loop, writer, pairer — which take turns holding "
            "the GIL — and chDB's own, which do not), so one process can use more than one core "
            "but not two.",
        ]
        if top["rate"] < 50_000:
            lines[-1] += (
                " 50,000 rows/s here would need collector + generator ≤ 40 µs per row, and "
                "the GIL-holding part of it under ≈ 20 µs."
            )
    md = "\n".join(lines)
    print(md)
    if not args.no_write:
        report.write_section("collector", "## Collector\n\n" + md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
