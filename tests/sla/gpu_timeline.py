"""Scripted GPU timelines written into a real store: per request its kernel timings (a
server span with the agent's ``parallax.gpu.*`` columns, or without them) and its pair, and
per GPU its clock readings in ``gpu_samples`` — the rows the SLA checker's GPU rules read."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from parallax_contracts import agent_metrics as gm


@dataclass
class Req:
    """One request: t1, its windows (ms), its queue wait (ms), its GPU attributes or None."""

    t1: datetime
    ttft_ms: float
    decode_ms: float
    queue_ms: float = 1.0
    gpu: dict[str, Any] | None = None  # column name (gpu_*) → value


@dataclass
class Reading:
    """One export of a GPU's clock gauges (one timestamp, as the SDK stamps a collection)."""

    t: datetime
    hw: str
    clock: float
    clock_max: float
    reasons: int | None = 0  # None: the agent sent no reason series


@dataclass
class Timeline:
    route: str
    service: str = "llm"
    reqs: list[Req] = field(default_factory=list)
    readings: list[Reading] = field(default_factory=list)


def _insert(client: Any, table: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    names = list(rows[0])
    client.insert(table, [[r[n] for n in names] for r in rows], column_names=names)


def write(client: Any, db: str, timelines: list[Timeline]) -> None:
    """Spans, pairs and samples of every timeline."""
    spans, pairs, samples = [], [], []
    for tl in timelines:
        for r in tl.reqs:
            tid, sid = secrets.token_hex(16), secrets.token_hex(8)
            dur = r.ttft_ms + r.decode_ms
            span = {
                "time": r.t1,
                "end_time": r.t1 + timedelta(milliseconds=dur),
                "trace_id": tid,
                "span_id": secrets.token_hex(8),
                "parent_span_id": sid,
                "source": "ebpf",
                "service": tl.service,
                "route": tl.route,
                "ttfb_us": 20_000,
                "ttft_us": round(r.ttft_ms * 1000),
                "duration_us": round(dur * 1000),
                "recv_queue_us": round(r.queue_ms * 1000),
            }
            span.update(r.gpu or {})
            spans.append(span)
            pairs.append(
                {
                    "time": r.t1,
                    "version": 1,
                    "paired_at": r.t1,
                    "site": "test",
                    "service": tl.service,
                    "route": tl.route,
                    "kind": "fetch",
                    "trace_id": tid,
                    "span_id": sid,
                    "hops": 1,
                    "user_ttfb_ms": 25.0,
                    "server_ttfb_ms": 20.0,
                    "server_ttft_ms": r.ttft_ms,
                    "server_duration_ms": dur,
                    "queue_ms": r.queue_ms,
                    "recv_queue_ms": r.queue_ms,
                    "server_timed": True,
                }
            )
        for g in tl.readings:
            series = [(gm.GPU_SM_CLOCK.name, g.clock), (gm.GPU_SM_CLOCK_MAX.name, g.clock_max)]
            if g.reasons is not None:
                series.append((gm.GPU_CLOCK_EVENT_REASONS.name, float(g.reasons)))
            for name, value in series:
                samples.append(
                    {"time": g.t, "host": "node-7", "hw_id": g.hw, "metric": name, "value": value}
                )
    # One insert per table: every span row gets every column any span has (absent: NULL;
    # the UUID list, the one GPU column that is not Nullable: '').
    cols = sorted({k for s in spans for k in s} | {"gpu_uuid"})
    rows = [{k: s.get(k) for k in cols} | {"gpu_uuid": s.get("gpu_uuid") or ""} for s in spans]
    _insert(client, f"{db}.server_spans", rows)
    _insert(client, f"{db}.pairs", pairs)
    _insert(client, f"{db}.gpu_samples", samples)
