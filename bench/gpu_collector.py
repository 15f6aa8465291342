"""The collector's GPU side: ``python -m bench.gpu_collector``.

1. **POST /v1/metrics ingest**: a real collector (subprocess, embedded chDB) takes OTLP/HTTP
   protobuf metric requests as the agent sends them — one node's export: 8 GPUs × the 8
   device series and 16 GPU processes × the 3 per-process series, 112 points — from a
   separate process, as fast as 8 keep-alive connections go. Measured: points written per
   second, the collector's CPU per point and per request (utime + stime from /proc, its
   idle CPU subtracted), request latency.
2. **The SLA checker's GPU queries** (collector/sla/gpu_source.py) on a 5-minute window of
   ``server_spans`` in the embedded store: spans without GPU columns only (the cost a store
   without GPUs pays), then with a share of GPU spans and their GPUs' clock readings.

Writes its section of docs/benchmarks.md (``<!-- bench:gpu-collector -->``).

    python -m bench.gpu_collector [--seconds 8] [--spans 2000000] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

from bench import report
from bench.collector import Target, _Conn, _proc_cpu_s
from parallax_contracts import agent_metrics as gm

GPUS, PROCS = 8, 16
CONNS = 8


def node_export(t_ns: int, node: int) -> bytes:
    """One agent's export: every device series per GPU, every process series per pid."""
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    for k, v in (("service.name", "parallax-agent"), ("host.name", f"node-{node}")):
        kv = rm.resource.attributes.add()
        kv.key, kv.value.string_value = k, v
    sm = rm.scope_metrics.add()
    sm.scope.name = "parallax.agent.gpu"
    for m in gm.DEVICE:
        metric = sm.metrics.add()
        metric.name, metric.unit = m.name, m.unit
        for g in range(GPUS):
            p = metric.gauge.data_points.add()
            p.time_unix_nano, p.as_double = t_ns, 1000.0 + g
            for k, v in ((gm.HW_ID, f"GPU-{node:04d}-{g:04d}"), (gm.HW_NAME, "NVIDIA H200")):
                kv = p.attributes.add()
                kv.key, kv.value.string_value = k, v
    for m in gm.PROCESS:
        metric = sm.metrics.add()
        metric.name, metric.unit = m.name, m.unit
        metric.sum.aggregation_temporality = (
            AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
        )
        metric.sum.is_monotonic = True
        for pid in range(PROCS):
            p = metric.sum.data_points.add()
            p.start_time_unix_nano, p.time_unix_nano, p.as_double = t_ns - 10**10, t_ns, 5.0
            kv = p.attributes.add()
            kv.key, kv.value.int_value = gm.PROCESS_PID, 1000 + pid
    out: bytes = req.SerializeToString()
    return out


POINTS = len(gm.DEVICE) * GPUS + len(gm.PROCESS) * PROCS


async def _offer(base: str, seconds: float) -> dict[str, Any]:
    """Closed loop: each connection posts the next node's export as soon as it is answered
    (a distinct time per request, so no two requests carry the same points)."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    lat: list[float] = []
    errors: dict[str, int] = {}
    t0 = time.time_ns() - 3600 * 10**9
    seq = iter(range(10**9))
    end = time.perf_counter() + seconds

    async def worker() -> None:
        conn = _Conn(host, int(port))
        while time.perf_counter() < end:
            i = next(seq)
            body = node_export(t0 + i * 10**6, i % 100)
            t = time.perf_counter()
            try:
                code = await conn.post("/v1/metrics", "application/x-protobuf", body)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                code = -1
            if code == 200:
                lat.append(time.perf_counter() - t)
            else:
                errors[str(code)] = errors.get(str(code), 0) + 1
        conn.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONNS)))
    lat.sort()
    return {
        "requests": len(lat),
        "elapsed": time.perf_counter() - start,
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[int(len(lat) * 0.99)],
        "errors": errors,
    }


def _gen(conn: Any, base: str, seconds: float) -> None:
    conn.send(asyncio.run(_offer(base, seconds)))


def ingest(seconds: float) -> dict[str, Any]:
    from demo.stack import free_port

    tmp = Path(tempfile.mkdtemp(prefix="parallax-bench-gpu-"))
    target = Target(tmp / "data", free_port(), free_port())
    try:
        c0 = target.cpu_s()
        time.sleep(5.0)
        idle = (target.cpu_s() - c0) / 5.0
        written0 = target.metric("parallax_collector_rows_written_total")
        parent, child = mp.Pipe()
        gen = mp.get_context("spawn").Process(target=_gen, args=(child, target.base, seconds))
        cpu0, wall0 = target.cpu_s(), time.monotonic()
        gen.start()
        res: dict[str, Any] = parent.recv()
        gen_cpu = _proc_cpu_s(gen.pid)
        gen.join()
        while target.metric("parallax_collector_queue_rows") > 0:
            time.sleep(0.2)
        wall = time.monotonic() - wall0
        res["cpu_s"] = target.cpu_s() - cpu0 - idle * wall
        res["points"] = target.metric("parallax_collector_rows_written_total") - written0
        res["gen_cpu_s"] = gen_cpu
        res["idle_cpu_per_s"] = idle
    finally:
        target.stop()
    return res


# --- the SLA checker's GPU queries ---------------------------------------------------
def _fill(c: Any, db: str, spans: int, gpu_share: float, start: datetime) -> None:
    from collector.store import schema

    schema.migrate(c, db)
    every = max(1, round(1 / gpu_share)) if gpu_share else 0
    gpu_cols = (
        f"if(number % {every} = 0, 97.0, NULL), if(number % {every} = 0, 60.0, NULL), "
        f"if(number % {every} = 0, 0.9, NULL), if(number % {every} = 0, 12.0, NULL), "
        f"if(number % {every} = 0, 40, NULL), "
        f"if(number % {every} = 0, concat('GPU-', toString(number % 8)), '')"
        if every
        else "NULL, NULL, NULL, NULL, NULL, ''"
    )
    c.command(
        f"""INSERT INTO {db}.server_spans (time, end_time, trace_id, span_id, service, route,
 ttft_us, duration_us, gpu_prefill_sm_util_pct, gpu_decode_sm_util_pct, gpu_sample_coverage,
 gpu_inflight_mean, gpu_prefill_launches, gpu_uuid)
SELECT toDateTime64('{start:%Y-%m-%d %H:%M:%S}', 9, 'UTC') + (number * 7919 % 298000) / 1000.0,
  toDateTime64('{start:%Y-%m-%d %H:%M:%S}', 9, 'UTC') + (number * 7919 % 298000) / 1000.0 + 2,
  hex(number), hex(number * 31), 'app', concat('/r/', toString(number % 200)),
  500000, 2000000, {gpu_cols}
FROM numbers({spans})"""  # noqa: S608 — our constants
    )
    if every:  # the 8 GPUs' clock gauges every 10 s over the window
        c.command(
            f"""INSERT INTO {db}.gpu_samples (time, host, hw_id, metric, value)
SELECT toDateTime64('{start:%Y-%m-%d %H:%M:%S}', 9, 'UTC') - 15 + intDiv(number, 24) * 10,
  'n', concat('GPU-', toString(intDiv(number % 24, 3))),
  ['{gm.GPU_SM_CLOCK.name}', '{gm.GPU_SM_CLOCK_MAX.name}',
   '{gm.GPU_CLOCK_EVENT_REASONS.name}'][number % 3 + 1],
  [1500.0, 1980.0, 4.0][number % 3 + 1]
FROM numbers({24 * 34})"""  # noqa: S608
        )


def sla_queries(spans: int) -> list[dict[str, Any]]:
    import clickhouse_connect

    from collector.sla import gpu_source

    d = Path(tempfile.mkdtemp(prefix="parallax-bench-gpusla-"))
    c = clickhouse_connect.get_client(dsn=f"chdb://{d / 'chdb'}")
    now = (datetime.now(UTC) - timedelta(hours=1)).replace(second=0, microsecond=0)
    start = now - timedelta(minutes=5)
    out = []
    for db, share in (("nogpu", 0.0), ("gpu10", 0.1)):
        _fill(c, db, spans, share, start)
        c.command(f"OPTIMIZE TABLE {db}.server_spans FINAL")

        def rows(sql: str) -> list[Any]:
            return list(c.query(sql).result_rows)

        times, found = [], {}
        for _ in range(5):
            t = time.perf_counter()
            found = gpu_source.read(rows, db, start, now)
            times.append(time.perf_counter() - t)
        clocked = sum(1 for g in found.values() if g.decode.clock_readings)
        out.append(
            {
                "db": db,
                "share": share,
                "best_s": min(times),
                "median_s": sorted(times)[2],
                "routes": len(found),
                "clocked": clocked,
            }
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--spans", type=int, default=2_000_000)
    ap.add_argument("--no-write", action="store_true", help="print, do not edit docs")
    args = ap.parse_args()
    load0 = " / ".join(f"{x:.1f}" for x in __import__("os").getloadavg())
    ing = ingest(args.seconds)
    sla = sla_queries(args.spans)
    pts_s = ing["points"] / ing["elapsed"]
    us_pt = 1e6 * ing["cpu_s"] / ing["points"]
    node_us_per_s = us_pt * POINTS / 10  # one node exporting every 10 s
    lines = [
        "## Collector: GPU metrics and the GPU side of the SLA (`python -m bench.gpu_collector`)",
        "",
        f"Machine: {report.machine()} · commit {report.git_rev()} · load average at start {load0}.",
        "",
        f"**POST /v1/metrics** — a real collector (embedded chDB), OTLP/HTTP protobuf requests "
        f"of one node's export ({GPUS} GPUs × {len(gm.DEVICE)} device series + {PROCS} GPU "
        f"processes × {len(gm.PROCESS)} process series = {POINTS} points), {CONNS} keep-alive "
        f"connections from another process, closed loop, {args.seconds:g} s "
        "(the generator shares the 2 cores):",
        "",
        "| Figure | Value |",
        "|---|---|",
        f"| points written per second | {pts_s:,.0f} ({ing['requests'] / ing['elapsed']:,.0f}"
        " requests/s) |",
        f"| collector CPU per point (HTTP, parse, spool, insert, merges; idle subtracted) | "
        f"{us_pt:.1f} µs ({us_pt * POINTS / 1000:.2f} ms per request) |",
        f"| request latency P50 / P99 | {ing['p50_ms']:.1f} / {ing['p99_ms']:.1f} ms |",
        f"| errors | {ing['errors'] or 'none'} |",
        "",
        f"An agent exports once every 10 s: one {GPUS}-GPU node costs the collector about "
        f"{node_us_per_s:.0f} µs of CPU per second ({POINTS / 10:.1f} points/s); at this rate "
        f"one collector core takes about {1e6 / max(node_us_per_s, 1e-9):,.0f} such nodes.",
        "",
        f"**The SLA checker's GPU queries** (collector/sla/gpu_source.py: the per-route GPU "
        f"sums, then the clock join) over a 5-minute window of {args.spans:,} spans across 200 "
        "routes in the embedded store, merged to one part; best and median of 5:",
        "",
        "| Spans with GPU columns | Best | Median | Routes with GPU figures | with clocks |",
        "|---|---|---|---|---|",
        *(
            f"| {100 * r['share']:.0f} % | {1000 * r['best_s']:.0f} ms | "
            f"{1000 * r['median_s']:.0f} ms | {r['routes']} | {r['clocked']} |"
            for r in sla
        ),
        "",
        "Without GPU spans only the GPU columns' null maps and the time column of the window "
        "are read (PREWHERE) and the clock join is skipped.",
    ]
    md = "\n".join(lines)
    print(md)
    if not args.no_write:
        report.write_section("gpu-collector", md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
