"""Store benchmark: ``make bench-store`` (``python -m bench.store``) — the figures behind the
capacity arithmetic of docs/store.md ("A ClickHouse cluster").

1. **Bytes and rows per request on disk.** Generated requests — an agent SERVER span and the
   browser's beacon entry for each, with varied ids, addresses, routes and timings, sent
   through the collector's own parsers (OTLP/protobuf, beacon JSON), written with its insert
   path into an embedded store (chDB, the ClickHouse engine), paired by its pairer — then
   merged (``OPTIMIZE … FINAL``: the steady state of a day's partition) and measured from
   ``system.parts`` per table. Two kinds of request: a short answer (one body write) and a
   streamed one (200 token writes: the 256-chunk arrays of both sides fill).
2. **The pairer's look-ups in the store**: with several collectors, a trace's span and entry
   usually arrive through different ones, and the side not in a collector's memory is
   looked up in the trace-id tables (``pairing.lookups.present``, 5,000 ids a query). Its
   cost against the rows of the look-back window (10,000 requests/s × 900 s = 9 million per
   side), merged and in many parts.
3. **Pairing through the store**: the collector's CPU per pair when the other side is only
   in the store (the multi-collector case), against pairing from memory.

Writes its section of docs/benchmarks.md (bench.report.write_section("store", …)).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import report
from bench.collector import add_attributes

ROOT = Path(__file__).resolve().parent.parent
RATE = 10_000  # requests/s the generated traffic is spread at (instants' deltas as at that rate)
ROUTES = [("chat-api", "/v1/chat"), ("chat-api", "/v1/complete"), ("web", "/api/items/{id}")]


def bodies(n: int, chunks: int, seed: int) -> tuple[list[bytes], list[bytes]]:
    """OTLP bodies (512 spans each) and beacon bodies (20 entries, one session each) for
    ``n`` requests, one span and one entry each, spread over the last n / RATE seconds."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    rnd = random.Random(seed)
    now_ns = time.time_ns() - 5 * 10**9
    reqs = []
    for i in range(n):
        t1 = now_ns - int((n - i) * 1e9 / RATE)
        ttfb = int(rnd.lognormvariate(10.0, 0.5))  # µs, ≈ 22 ms median
        gaps = [int(rnd.lognormvariate(10.2, 0.3)) for _ in range(chunks - 1)]
        offs = [ttfb]
        for g in gaps:
            offs.append(offs[-1] + g)
        reqs.append((rnd.randbytes(16), rnd.randbytes(8), rnd.randbytes(8), t1, ttfb, offs))
    spans_out = []
    for i in range(0, n, 512):
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        host = f"node-{i // 512 % 12}"
        for k, v in (
            ("service.name", "chat-api"),
            ("host.name", host),
            ("k8s.node.name", host),
            ("k8s.namespace.name", "prod"),
            ("k8s.pod.name", f"chat-api-7d9f8c6b5-{i // 512 % 40:05d}"),
        ):
            kv = rs.resource.attributes.add()
            kv.key, kv.value.string_value = k, v
        kv = rs.resource.attributes.add()
        kv.key, kv.value.int_value = "process.pid", 4000 + i // 512 % 7
        ss = rs.scope_spans.add()
        for tid, parent, sid, t1, _ttfb, offs in reqs[i : i + 512]:
            _service, route = ROUTES[rnd.randrange(len(ROUTES))]
            path = route.replace("{id}", str(rnd.randrange(10**6)))
            sp = ss.spans.add()
            sp.trace_id, sp.span_id, sp.parent_span_id = tid, sid, parent
            sp.kind = Span.SpanKind.SPAN_KIND_SERVER
            sp.name = f"POST {route}"
            sp.start_time_unix_nano = t1
            sp.end_time_unix_nano = t1 + offs[-1] * 1000 + 200
            add_attributes(
                sp.attributes,
                (
                    ("parallax.source", "ebpf"),
                    ("http.request.method", "POST"),
                    ("url.path", path),
                    ("http.route", route),
                    ("server.address", "10.0.3.17"),
                    ("server.port", 8000),
                    (
                        "client.address",
                        f"10.{rnd.randrange(4)}.{rnd.randrange(256)}.{rnd.randrange(256)}",
                    ),
                    ("client.port", rnd.randrange(30000, 60000)),
                    ("http.response.status_code", 200),
                    ("parallax.arrival_unix_ns", t1 - rnd.randrange(20_000, 2_000_000)),
                    ("parallax.ttfb_us", offs[0]),
                    ("parallax.ttft_us", offs[0] + rnd.randrange(50, 500)),
                    ("parallax.recv_queue_us", rnd.randrange(5, 3000)),
                    ("parallax.duration_us", offs[-1]),
                    ("parallax.chunks", len(offs)),
                    ("parallax.bytes_in", rnd.randrange(300, 4000)),
                    ("parallax.bytes_out", 40 * len(offs) + rnd.randrange(200)),
                    ("parallax.srtt_us", rnd.randrange(200, 40_000)),
                    ("parallax.retransmits", 0),
                ),
                offs[:256],
            )
        spans_out.append(req.SerializeToString())
    beacons_out = []
    for i in range(0, n, 20):
        group = reqs[i : i + 20]
        origin_ms = group[0][3] / 1e6 - 1000.0
        entries = []
        for tid, parent, _sid, t1, _ttfb, offs in group:
            start = t1 / 1e6 - origin_ms - rnd.uniform(5, 60)
            t0 = start + rnd.uniform(0.1, 2)
            net = rnd.lognormvariate(3.0, 0.6)
            arrivals = [round(t0 + net + o / 1000 + rnd.uniform(0, 3), 1) for o in offs]
            entries.append(
                {
                    "trace_id": tid.hex(),
                    "span_id": parent.hex(),
                    "kind": "fetch",
                    "method": "POST",
                    "url": "https://chat.example.com/v1/chat",
                    "status": 200,
                    "start_ms": round(start, 1),
                    "request_start_ms": round(t0, 1),
                    "response_start_ms": arrivals[0],
                    "first_chunk_ms": arrivals[0],
                    "chunk_ms": arrivals[:256],
                    "chunks": len(arrivals),
                    "rendered_ms": round(arrivals[0] + rnd.uniform(4, 30), 1),
                    "response_end_ms": arrivals[-1],
                    "protocol": "h2",
                }
            )
        doc = {
            "v": 1,
            "site": "chat",
            "session": f"session-{seed}-{i}",
            "page": "/chat",
            "time_origin": origin_ms,
            "entries": entries,
        }
        beacons_out.append(json.dumps(doc).encode())
    return spans_out, beacons_out


def _cpu() -> float:
    """Process CPU seconds (user + system), µs resolution (os.times counts clock ticks)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _store(data_dir: Path) -> Any:
    """A migrated embedded store in ``data_dir`` (in a child: one chDB per process)."""
    from collector.store.client import Store

    st = Store(f"chdb://{data_dir}")
    st.migrate(7)
    return st


_TABLES = ("server_spans", "browser_entries", "pairs", "span_traces", "entry_traces")


def _disk(data_dir: Path, n: int, chunks: int) -> dict[str, Any]:
    """(in a child: one chDB per process) rows and bytes per request, per table."""
    from collector.ingest import beacons, otlp
    from collector.metrics import Metrics
    from collector.pairing.pairer import Pairer
    from collector.store import schema

    st = _store(data_dir)
    spans, bcs = bodies(n, chunks, seed=chunks)
    now = time.time_ns()
    sr = [r for b in spans for r in otlp.parse(b, False, now, 0, now).rows]
    er = [r for b in bcs for r in beacons.parse(beacons.read(b), now, 0, now).rows]
    pa = Pairer(st, Metrics())
    sn, en = schema.column_names(schema.SPAN_COLUMNS), schema.column_names(schema.ENTRY_COLUMNS)
    for i in range(0, n, 10_000):
        st.insert_rows(schema.SPANS, sr[i : i + 10_000], sn)
        st.insert_rows(schema.ENTRIES, er[i : i + 10_000], en)
        pa.offer(sr[i : i + 10_000], er[i : i + 10_000])
        while b := pa._take_due():
            pa.pair_round(b)
    for t in _TABLES:
        st.client().command(f"OPTIMIZE TABLE parallax.{t} FINAL")
    r = st.query(
        "SELECT table, sum(rows), sum(bytes_on_disk), sum(data_uncompressed_bytes) "
        "FROM system.parts WHERE database = 'parallax' AND active GROUP BY table"
    ).result_rows
    return {"n": n, "chunks": chunks, "tables": {t: [int(a), int(b), int(c)] for t, a, b, c in r}}


def _lookups(data_dir: Path, windows: list[int]) -> list[dict[str, Any]]:
    """(in a child) present() over a trace-id table holding ``w`` ids of the window."""
    from collector.pairing.lookups import present
    from collector.store import schema

    st = _store(data_dir)
    c = st.client()
    out = []
    inserted = 0
    for w in windows:
        # Random 32-hex ids over the last 13 minutes (inside the 15-minute window), inserted
        # 100,000 at a time (merges stopped: the parts of a busy window), then merged.
        c.command("SYSTEM STOP MERGES parallax.span_traces")
        while inserted < w:
            k = min(100_000, w - inserted)
            c.command(
                "INSERT INTO parallax.span_traces SELECT lower(hex(randomFixedString(16))), "  # noqa: S608
                f"now64(6) - toIntervalMillisecond(rand() % 800000) FROM numbers({k})"
            )
            inserted += k
        ids = [
            r[0]
            for r in c.query(
                "SELECT trace_id FROM parallax.span_traces ORDER BY rand() LIMIT 2500"
            ).result_rows
        ] + [os.urandom(16).hex() for _ in range(2500)]
        for state, granule in (
            ("parts", 8192),
            ("merged", 8192),
            ("merged", 1024),
            ("merged", 256),
        ):
            table = schema.SPAN_TRACES
            if state == "merged" and granule == 8192:
                c.command("SYSTEM START MERGES parallax.span_traces")
                c.command("OPTIMIZE TABLE parallax.span_traces FINAL")
            elif granule != 8192:
                # The same rows in a table with smaller granules: what a new table version
                # (the mitigation docs/store.md names) would cost per look-up.
                table = f"span_traces_g{granule}"
                c.command(f"DROP TABLE IF EXISTS parallax.{table}")
                c.command(
                    f"CREATE TABLE parallax.{table} AS parallax.span_traces "
                    f"ENGINE = MergeTree PARTITION BY toDate(time) ORDER BY trace_id "
                    f"SETTINGS index_granularity = {granule}"
                )
                c.command(f"INSERT INTO parallax.{table} SELECT * FROM parallax.span_traces")  # noqa: S608
                c.command(f"OPTIMIZE TABLE parallax.{table} FINAL")
            parts = c.query(
                "SELECT count() FROM system.parts WHERE database = 'parallax' "
                "AND table = {t:String} AND active",
                parameters={"t": table},
            ).result_rows[0][0]
            cpu, wall = [], []
            for _ in range(3):
                t0, w0 = _cpu(), time.perf_counter()
                found = present(st, table, ids, 900)
                cpu.append(_cpu() - t0)
                wall.append(time.perf_counter() - w0)
            assert len(found) == 2500, len(found)
            out.append(
                {
                    "window_rows": w,
                    "state": state,
                    "granule": granule,
                    "parts": int(parts),
                    "cpu_s": sorted(cpu)[1],
                    "wall_s": sorted(wall)[1],
                }
            )
    return out


def _reads(data_dir: Path, windows: list[int]) -> list[dict[str, Any]]:
    """(in a child) read_traces() — the found traces' spans read back, 256 ids a query through
    the bloom filter — against ``server_spans`` holding the window's rows (the key and id
    columns random, the rest defaults), merged."""
    from collector.pairing.lookups import read_traces

    st = _store(data_dir)
    c = st.client()
    out = []
    inserted = 0
    for w in windows:
        while inserted < w:
            k = min(100_000, w - inserted)
            c.command(
                "INSERT INTO parallax.server_spans (time, end_time, received, trace_id, span_id, "  # noqa: S608
                "parent_span_id, service, route, duration_us) SELECT t, t, t, "
                "lower(hex(randomFixedString(16))), lower(hex(randomFixedString(8))), "
                "lower(hex(randomFixedString(8))), 'chat-api', ['/v1/chat', '/v1/complete', "
                "'/api/items/{id}'][rand() % 3 + 1], rand() % 100000 FROM (SELECT now64(9) - "
                f"toIntervalMillisecond(rand() % 800000) AS t FROM numbers({k}))"
            )
            inserted += k
        c.command("OPTIMIZE TABLE parallax.server_spans FINAL")
        ids = [
            r[0]
            for r in c.query(
                "SELECT trace_id FROM parallax.server_spans ORDER BY rand() LIMIT 256"
            ).result_rows
        ]
        cpu, wall = [], []
        for _ in range(3):
            t0, w0 = _cpu(), time.perf_counter()
            spans, _ = read_traces(st, ids, 900, (True, False))
            cpu.append(_cpu() - t0)
            wall.append(time.perf_counter() - w0)
        assert len(spans) == 256, len(spans)
        out.append({"window_rows": w, "cpu_s": sorted(cpu)[1], "wall_s": sorted(wall)[1]})
    return out


def _store_pairing(data_dir: Path, n: int) -> dict[str, float]:
    """(in a child) CPU per pair: both sides in memory, against the span only in the store."""
    from collector.ingest import beacons, otlp
    from collector.metrics import Metrics
    from collector.pairing.pairer import Pairer
    from collector.store import schema

    st = _store(data_dir)
    sn, en = schema.column_names(schema.SPAN_COLUMNS), schema.column_names(schema.ENTRY_COLUMNS)
    out = {}
    for mode, seed in (("memory", 1), ("store", 2)):
        spans, bcs = bodies(n, 8, seed=seed)
        now = time.time_ns()
        sr = [r for b in spans for r in otlp.parse(b, False, now, 0, now).rows]
        er = [r for b in bcs for r in beacons.parse(beacons.read(b), now, 0, now).rows]
        for i in range(0, n, 10_000):
            st.insert_rows(schema.SPANS, sr[i : i + 10_000], sn)
            st.insert_rows(schema.ENTRIES, er[i : i + 10_000], en)
        pa = Pairer(st, Metrics(), exclusive=False, recheck_s=0.0)
        t0, th0 = _cpu(), time.thread_time()
        for i in range(0, n, 5_000):
            pa.offer(sr[i : i + 5_000] if mode == "memory" else [], er[i : i + 5_000])
            while b := pa._take_due():
                pa.pair_round(b)
        t1, th1 = _cpu(), time.thread_time()
        out[f"{mode}_process_us"] = (t1 - t0) / n * 1e6
        out[f"{mode}_thread_us"] = (th1 - th0) / n * 1e6
        out[f"{mode}_lookups"] = pa.store_lookups
    return out


def _child(fn: str, *args: str) -> Any:
    p = subprocess.run(
        [sys.executable, "-m", "bench.store", "--child", fn, *args],
        capture_output=True,
        text=True,
        timeout=3600,
        cwd=ROOT,
    )
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def _mib(b: float) -> str:
    return f"{b / 2**20:,.1f} MiB"


def render(
    disk: list[dict[str, Any]],
    lookups: list[dict[str, Any]],
    reads: list[dict[str, Any]],
    pairing: dict[str, float],
) -> str:
    lines = [
        "## Store: bytes per request, the pairer's look-ups (`make bench-store`)",
        "",
        f"Machine: {report.machine()}; commit {report.git_rev()}. Command: `make bench-store` "
        "(`python -m bench.store`). Embedded store (chDB, the ClickHouse 26.9 engine).",
        "",
        "Generated requests — an agent SERVER span (the agent's attributes, k8s resource "
        "attributes, random ids and client addresses, log-normal timings) and its browser "
        f"entry, spread as at {RATE:,} requests/s — through the collector's parsers, insert "
        "path and pairer; then every table merged (`OPTIMIZE … FINAL`, a day partition's "
        "steady state) and read from `system.parts`. Per request, on disk (compressed; one "
        "replica):",
        "",
        "| table | "
        + " | ".join(f"{d['chunks']} body write(s), {d['n']:,} requests" for d in disk)
        + " |",
        "|---|" + "---|" * len(disk),
    ]
    for t in _TABLES:
        cells = []
        for d in disk:
            rows, b, raw = d["tables"].get(t, [0, 0, 0])
            cells.append(
                f"{b / d['n']:,.0f} B ({rows / d['n']:.2f} rows; {raw / max(b, 1):.1f}× compressed)"
            )
        lines.append(f"| `{t}` | " + " | ".join(cells) + " |")
    totals = [sum(v[1] for v in d["tables"].values()) / d["n"] for d in disk]
    lines.append("| **all five** | " + " | ".join(f"**{x:,.0f} B**" for x in totals) + " |")
    lines += [
        "",
        "The pairer's existence look-up (`pairing.lookups.present`, 5,000 ids, half of them "
        "present) against `span_traces` holding the look-back window's ids, in the parts "
        "100,000-row inserts leave (merges stopped) and merged into one, and the same rows in "
        "tables with smaller granules (8,192 rows is the table's; every random id hits a "
        "granule, so a look-up reads most of the window); process CPU and wall time, median "
        "of 3:",
        "",
        "| ids in the window | parts | rows per granule | CPU per query | wall per query | "
        "CPU per id |",
        "|---|---|---|---|---|---|",
    ]
    for r in lookups:
        lines.append(
            f"| {r['window_rows']:,} | {r['parts']} | {r['granule']:,} | "
            f"{r['cpu_s'] * 1e3:,.0f} ms | "
            f"{r['wall_s'] * 1e3:,.0f} ms | {r['cpu_s'] / 5000 * 1e6:,.1f} µs |"
        )
    lines += [
        "",
        "Reading found traces back (`pairing.lookups.read_traces`, 256 ids a query, spans "
        "only: the bloom filter on `trace_id` picks the granules) from `server_spans` holding "
        "the window's rows (ids and key columns random, the rest defaults; merged), median of "
        "3:",
        "",
        "| rows in the window | CPU per query | wall per query | CPU per id |",
        "|---|---|---|---|",
        *(
            f"| {r['window_rows']:,} | {r['cpu_s'] * 1e3:,.0f} ms | {r['wall_s'] * 1e3:,.0f} ms "
            f"| {r['cpu_s'] / 256 * 1e6:,.0f} µs |"
            for r in reads
        ),
        "",
        "Pairing, per pair (one-hop traces, 8 body writes): both sides in the pairer's memory "
        f"(one collector saw both) **{pairing['memory_process_us']:.1f} µs** of process CPU "
        f"({pairing['memory_thread_us']:.1f} µs on the pairing thread); the span only in the "
        f"store (it came through another collector) **{pairing['store_process_us']:.1f} µs** "
        f"({pairing['store_thread_us']:.1f} µs on the pairing thread; chDB's query threads "
        "make the rest — on a server that part is the server's), with the store holding the "
        "first run's rows as well.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--stream-requests", type=int, default=20_000)
    ap.add_argument("--windows", default="1000000,3000000,9000000")
    ap.add_argument("--no-write", action="store_true", help="print, do not edit docs/benchmarks.md")
    a = ap.parse_args(argv)
    if a.child:
        fn, *rest = a.child
        d = Path(rest[0])
        if fn == "disk":
            res: Any = _disk(d, int(rest[1]), int(rest[2]))
        elif fn == "lookups":
            res = _lookups(d, [int(x) for x in rest[1].split(",")])
        elif fn == "reads":
            res = _reads(d, [int(x) for x in rest[1].split(",")])
        else:
            res = _store_pairing(d, int(rest[1]))
        print(json.dumps(res))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        t = Path(tmp)
        disk = [
            _child("disk", str(t / "short"), str(a.requests), "1"),
            _child("disk", str(t / "stream"), str(a.stream_requests), "200"),
        ]
        lookups = _child("lookups", str(t / "lookups"), a.windows)
        reads = _child("reads", str(t / "reads"), a.windows)
        pairing = _child("pairing", str(t / "pairing"), "20000")
    md = render(disk, lookups, reads, pairing)
    print(md)
    if not a.no_write:
        report.write_section("store", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
