"""OTLP/HTTP metric requests (protobuf or JSON) → ``gpu_samples`` and ``request_counts`` rows.

Stored: the GPU device series and the per-process GPU series of the contract
(``parallax_contracts.agent_metrics`` DEVICE and PROCESS), gauges and sums alike, one row per
data point, in ``gpu_samples``; the agent's request counts per port and its sampling
probability (SAMPLING) in ``request_counts`` (``Parsed.more``). Everything else that is
well-formed is counted as ignored, by reason, never dropped without a count:

- ``gen_ai_histogram``: the GenAI server histograms (TTFT, time per output token). The agent
  derives them from the same records it sends as spans, whose per-request ``ttft_us`` and
  chunk offsets the store already holds at full resolution; fixed-bucket histograms of them
  would add nothing the SLA checker reads. They exist for other backends (docs/collector.md).
- ``other_metric``: a metric the contract does not name (an SDK's own instruments).
- ``wrong_kind``: a contract name sent as a histogram or summary.
- ``no_recorded_value``: a point flagged as having no value (staleness marker).

Rejected (counted by reason, answered as partial success): a point without a time or older
than the retention or a day ahead; without a value or with NaN/±inf; a device series point
without ``hw.id``, a per-process one without a pid; a request count without a
``server.port`` (``missing_port``: it could not be told from another port's) or below 0.

Metric volume is small (a GPU's eight series every 10 s), so the protobuf runtime's parser is
used as it is: no compiled fast path as for spans.
"""

from __future__ import annotations

import math
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, DataPointFlags

from collector.ingest import otlp_common
from collector.ingest.common import Parsed, outside_window
from collector.ingest.otlp_common import any_value, as_int, as_str
from collector.store import schema
from collector.store.rows import CountRow, GpuSampleRow
from parallax_contracts import agent_metrics as gm

DEVICE = frozenset(m.name for m in gm.DEVICE)
PROCESS = frozenset(m.name for m in gm.PROCESS)
GEN_AI = frozenset(m.name for m in gm.GEN_AI)
SAMPLING = frozenset(m.name for m in gm.SAMPLING)
_COUNTERS = frozenset((gm.REQUESTS_SEEN.name, gm.REQUESTS_TRACED.name))
_TEMPORALITY = {
    AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA: "delta",
    AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE: "cumulative",
}
_NO_VALUE = DataPointFlags.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK
# Point attributes that have a column; the rest go to ``attributes`` as strings.
_CONSUMED = frozenset((gm.HW_ID, gm.HW_NAME, gm.PROCESS_PID, gm.SERVICE_NAME))
_U32 = 2**32


def parse(body: bytes, json_body: bool, received_ns: int, oldest_ns: int, now_ns: int) -> Parsed:
    """Rows for gpu_samples, and for request_counts in ``out.more``."""
    req = otlp_common.decode(body, json_body, ExportMetricsServiceRequest())
    out = Parsed()
    samples: list[GpuSampleRow] = []
    counts: list[CountRow] = []
    for rm in req.resource_metrics:
        res = {kv.key: any_value(kv.value) for kv in rm.resource.attributes}
        host = str(res.get("host.name") or "")
        service = str(res.get(gm.SERVICE_NAME) or "unknown_service")
        res_pid = as_int(res.get(gm.PROCESS_PID))
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                points = getattr(m, kind).data_points if kind is not None else ()
                if m.name in SAMPLING:
                    _counts(m, kind, points, host, counts, out)
                    continue
                if m.name not in DEVICE and m.name not in PROCESS:
                    why = "gen_ai_histogram" if m.name in GEN_AI else "other_metric"
                    out.ignored_reasons[why] += len(points)
                    continue
                if kind == "gauge":
                    temporality = ""
                elif kind == "sum":
                    temporality = _TEMPORALITY.get(m.sum.aggregation_temporality, "")
                else:
                    out.ignored_reasons["wrong_kind"] += len(points)
                    continue
                device = m.name in DEVICE
                for p in points:
                    if p.flags & _NO_VALUE:
                        out.ignored_reasons["no_recorded_value"] += 1
                        continue
                    row = _row(p, m.name, device, temporality, host, service, res_pid, out)
                    if row is not None:
                        samples.append(row)
    out.rows = [r for r in samples if _in_window(r.time, oldest_ns, now_ns, out)]
    kept: list[tuple[Any, ...]] = [r for r in counts if _in_window(r.time, oldest_ns, now_ns, out)]
    if kept:
        out.more[schema.REQUEST_COUNTS] = kept
    out.ignored = sum(out.ignored_reasons.values())
    return out


def _counts(
    m: Any, kind: str | None, points: Any, host: str, rows: list[CountRow], out: Parsed
) -> None:
    """The agent's request counters (sums) and sampling probability (a gauge) → rows of
    ``request_counts``."""
    counter = m.name in _COUNTERS
    if kind != ("sum" if counter else "gauge"):
        out.ignored_reasons["wrong_kind"] += len(points)
        return
    temporality = _TEMPORALITY.get(m.sum.aggregation_temporality, "") if counter else ""
    for p in points:
        if p.flags & _NO_VALUE:
            out.ignored_reasons["no_recorded_value"] += 1
            continue
        which = p.WhichOneof("value")
        if which is None:
            out.rejected["missing_value"] += 1
            continue
        value = float(p.as_int) if which == "as_int" else p.as_double
        if not math.isfinite(value) or value < 0:
            out.rejected["invalid_value"] += 1
            continue
        if not p.time_unix_nano:
            out.rejected["invalid_time"] += 1
            continue
        attrs = {kv.key: any_value(kv.value) for kv in p.attributes}
        port = as_int(attrs.get(gm.SERVER_PORT))
        if counter and (port is None or not 0 < port < 65536):
            out.rejected["missing_port"] += 1
            continue
        svc = attrs.get(gm.SERVICE_NAME)
        rows.append(
            CountRow(
                time=p.time_unix_nano,
                start_time=(p.start_time_unix_nano or None) if counter else None,
                host=host,
                service=svc[:256] if isinstance(svc, str) else "",
                port=port if port is not None and 0 < port < 65536 else 0,
                metric=m.name,
                value=value,
                temporality=temporality,
            )
        )


def _row(
    p: Any,
    name: str,
    device: bool,
    temporality: str,
    host: str,
    service: str,
    res_pid: int | None,
    out: Parsed,
) -> GpuSampleRow | None:
    """One point's row, or None: rejected (counted here)."""
    which = p.WhichOneof("value")
    if which is None:
        out.rejected["missing_value"] += 1
        return None
    value = float(p.as_int) if which == "as_int" else p.as_double
    if not math.isfinite(value):
        out.rejected["invalid_value"] += 1
        return None
    if not p.time_unix_nano:
        out.rejected["invalid_time"] += 1
        return None
    attrs = {kv.key: any_value(kv.value) for kv in p.attributes}
    hw_id = attrs.get(gm.HW_ID)
    hw_id = hw_id if isinstance(hw_id, str) else ""
    pid = as_int(attrs.get(gm.PROCESS_PID))
    if pid is None and not device:  # a per-process resource may carry it instead
        pid = res_pid
    if device and not hw_id:
        out.rejected["missing_hw_id"] += 1
        return None
    if not device and (pid is None or not 0 < pid < _U32):
        out.rejected["missing_pid"] += 1
        return None
    hw_name = attrs.get(gm.HW_NAME)
    svc = attrs.get(gm.SERVICE_NAME)
    return GpuSampleRow(
        time=p.time_unix_nano,
        start_time=p.start_time_unix_nano or None,
        host=host,
        service=svc if isinstance(svc, str) and svc else service,
        hw_id=hw_id[:256],
        hw_name=hw_name[:256] if isinstance(hw_name, str) else "",
        pid=pid if pid is not None and 0 < pid < _U32 else 0,
        metric=name,
        value=value,
        temporality=temporality,
        attributes={k: as_str(v) for k, v in attrs.items() if k not in _CONSUMED},
    )


def _in_window(t: int, oldest_ns: int, now_ns: int, out: Parsed) -> bool:
    why = outside_window(t, oldest_ns, now_ns)
    if why is not None:
        out.rejected[why] += 1
    return why is None


def response(rejected: int, message: str, json_body: bool) -> tuple[bytes, str]:
    """The OTLP ExportMetricsServiceResponse (partial success when points were rejected)."""
    resp = ExportMetricsServiceResponse()
    return otlp_common.answer(resp, "rejected_data_points", rejected, message, json_body)
