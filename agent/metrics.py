"""Prometheus metrics and the /healthz and /readyz endpoints of the agent."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from parallax_contracts import agent_metrics as am

TTFB_BUCKETS = 32  # the kernel's log2 µs buckets (bpf/agent/sample.h PX_TTFB_BUCKETS)


def _counter(s: am.PromSeries, r: CollectorRegistry) -> Counter:
    return Counter(s.name, s.doc, s.labels, registry=r)


def _gauge(s: am.PromSeries, r: CollectorRegistry) -> Gauge:
    return Gauge(s.name, s.doc, s.labels, registry=r)


class KernelCounter(Collector):
    """A counter the kernel (or /proc, or sock_diag) keeps: its cumulative value is set at
    the scrape, and it is exposed as a counter (``rate()`` applies; a decrease is a reset,
    e.g. a listener reopened)."""

    def __init__(self, s: am.PromSeries, r: CollectorRegistry) -> None:
        self.series = s
        self.values: dict[tuple[str, ...], float] = {}
        r.register(self)

    def labels(self, *values: str) -> _KernelCounterChild:
        return _KernelCounterChild(self, tuple(values))

    def set(self, value: float) -> None:
        self.values[()] = value

    def collect(self) -> list[Metric]:
        s = self.series
        fam = CounterMetricFamily(s.name, s.doc, labels=list(s.labels))
        for lv, v in sorted(self.values.items()):
            fam.add_metric(list(lv), v)
        return [fam]


class _KernelCounterChild:
    def __init__(self, parent: KernelCounter, values: tuple[str, ...]) -> None:
        self._parent, self._values = parent, values

    def set(self, value: float) -> None:
        self._parent.values[self._values] = value


class _Scaled:
    """A reading in its source's unit (NVML's MHz) set into a series in the base unit."""

    def __init__(self, gauge: Gauge, scale: float) -> None:
        self._gauge, self._scale = gauge, scale

    def labels(self, *values: str) -> _Scaled:
        return _Scaled(self._gauge.labels(*values), self._scale)

    def set(self, value: float) -> None:
        self._gauge.set(value * self._scale)


class RequestCounts(Collector):
    """Every request, sampled or not, per port label — the kernel's exact counts and server
    TTFB histogram (bpf/agent/sample.h), taken at the scrape (``per_label`` is set by the
    scrape's refresh): (seen, kept, log2 µs buckets, sum µs) per label."""

    def __init__(self) -> None:
        self.per_label: dict[str, tuple[int, int, list[int], int]] = {}

    def collect(self) -> list[Metric]:
        seen = CounterMetricFamily(am.P_REQUESTS_SEEN.name, am.P_REQUESTS_SEEN.doc, labels=["port"])
        kept = CounterMetricFamily(
            am.P_REQUESTS_TRACED.name, am.P_REQUESTS_TRACED.doc, labels=["port"]
        )
        ttfb = HistogramMetricFamily(am.P_REQUEST_TTFB.name, am.P_REQUEST_TTFB.doc, labels=["port"])
        for label, (n_seen, n_kept, buckets, sum_us) in sorted(self.per_label.items()):
            seen.add_metric([label], n_seen)
            kept.add_metric([label], n_kept)
            cum, out = 0, []
            for i, n in enumerate(buckets[: TTFB_BUCKETS - 1]):
                cum += n
                out.append((f"{(1 << i) / 1e6:g}", cum))  # bucket i: TTFB < 2^i µs
            out.append(("+Inf", cum + buckets[TTFB_BUCKETS - 1]))
            ttfb.add_metric([label], out, sum_us / 1e6)
        return [seen, kept, ttfb]


log = logging.getLogger("parallax.agent")


class GpuMetrics:
    """The GPU side's series (agent.gpu): parallax_contracts.agent_metrics' device series
    under Prometheus names, the GPU processes' totals, the GPU stage's counts."""

    def __init__(self, r: CollectorRegistry) -> None:
        # keyed by the reading (agent.gpu.side sets them in NVML's units)
        self.device: dict[str, Gauge | _Scaled] = {
            "utilization_ratio": _gauge(am.P_GPU_UTILIZATION, r),
            "memory_used_bytes": _gauge(am.P_GPU_MEMORY_USED, r),
            "memory_total_bytes": _gauge(am.P_GPU_MEMORY_TOTAL, r),
            "sm_clock_mhz": _Scaled(_gauge(am.P_GPU_SM_CLOCK, r), 1e6),
            "sm_clock_max_mhz": _Scaled(_gauge(am.P_GPU_SM_CLOCK_MAX, r), 1e6),
            "power_watts": _gauge(am.P_GPU_POWER, r),
            "power_limit_watts": _gauge(am.P_GPU_POWER_LIMIT, r),
            "clock_event_reasons": _gauge(am.P_GPU_CLOCK_EVENT_REASONS, r),
        }
        self.launches = KernelCounter(am.P_GPU_LAUNCHES, r)
        self.host_wait = KernelCounter(am.P_GPU_HOST_WAIT, r)
        self.processes = _gauge(am.P_GPU_PROCESSES, r)
        self.records = _counter(am.P_GPU_RECORDS, r)
        self.hold_expired = _counter(am.P_GPU_HOLD_EXPIRED, r)
        self.nvml_errors = _counter(am.P_NVML_ERRORS, r)


class SocketMetrics:
    """The listening sockets' counts the kernel keeps (read at the scrape)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.listen_overflows = KernelCounter(am.P_LISTEN_OVERFLOWS, r)
        self.listen_drops = KernelCounter(am.P_LISTEN_DROPS, r)
        self.synack_retransmits = KernelCounter(am.P_SYNACK_RETRANSMITS, r)


class UnrecordedMetrics:
    """Why requests the agent saw, or should have seen, have no record: one counter each."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.lost_exchanges = _counter(am.P_LOST_EXCHANGES, r)
        self.h2_desync = _counter(am.P_H2_DESYNC, r)
        self.h2_lost_streams = _counter(am.P_H2_LOST_STREAMS, r)
        self.http1_unframed = _counter(am.P_HTTP1_UNFRAMED, r)
        self.unanswered = _counter(am.P_UNANSWERED, r)
        self.bpf_missed_runs = KernelCounter(am.P_BPF_MISSED_RUNS, r)  # (the kernel's count)
        self.unfollowed_reads = KernelCounter(am.P_UNFOLLOWED_READS, r)  # (ditto)


class GenAiMetrics:
    """The GenAI server histograms under Prometheus names (seconds, semconv's buckets),
    observed by agent.export.genai from the records of LLM streams. Label sets are bounded:
    past MAX_SERIES distinct ones, a new route is counted as ``other``."""

    MAX_SERIES = 1000

    def __init__(self, r: CollectorRegistry) -> None:
        self.by_metric: dict[str, Histogram] = {}
        for contract, series in (
            (am.GEN_AI_TTFT, am.P_GEN_AI_TTFT),
            (am.GEN_AI_TPOT, am.P_GEN_AI_TPOT),
            (am.GEN_AI_DURATION, am.P_GEN_AI_DURATION),
        ):
            self.by_metric[contract.name] = Histogram(
                series.name,
                series.doc,
                series.labels,
                registry=r,
                buckets=_BUCKETS[contract.name],
            )
        self._seen: set[tuple[str, ...]] = set()

    def observe(self, metric: str, value: float, attrs: dict[str, str | int]) -> None:
        values = tuple(str(attrs.get(a, "")) for a in am.GEN_AI_ATTRIBUTES)
        if values not in self._seen:
            if len(self._seen) >= self.MAX_SERIES:
                route = am.GEN_AI_ATTRIBUTES.index("http.route")
                values = (*values[:route], "other", *values[route + 1 :])
            else:
                self._seen.add(values)
        self.by_metric[metric].labels(*values).observe(value)


_BUCKETS = {
    am.GEN_AI_TTFT.name: am.GEN_AI_TTFT_BUCKETS,
    am.GEN_AI_TPOT.name: am.GEN_AI_TPOT_BUCKETS,
    am.GEN_AI_DURATION.name: am.GEN_AI_DURATION_BUCKETS,
}


class Metrics:
    """The agent's /metrics: every series of parallax_contracts.agent_metrics.PROMETHEUS."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.events = _counter(am.P_EVENTS, r)
        self.requests = _counter(am.P_REQUESTS, r)
        self.lost = KernelCounter(am.P_LOST_EVENTS, r)
        self.shed = _counter(am.P_SHED_RECORDS, r)
        self.map_fill = _gauge(am.P_MAP_ENTRIES, r)
        self.unparsed = _counter(am.P_UNPARSED, r)
        self.tls_unprobed = _counter(am.P_TLS_UNPROBED, r)
        self.head_too_large = _counter(am.P_HEAD_TOO_LARGE, r)
        self.traceparent_missed = _counter(am.P_TRACEPARENT_MISSED, r)
        self.sockets = SocketMetrics(r)
        self.evicted = _counter(am.P_CONN_EVICTIONS, r)
        self.unrecorded = UnrecordedMetrics(r)
        self.shed_requests = _counter(am.P_SHED_REQUESTS, r)
        self.pauses = _counter(am.P_PAUSES, r)
        self.sampling_probability = _gauge(am.P_SAMPLING_PROBABILITY, r)
        self.sampling_probability.set(1.0)
        self.request_counts = RequestCounts()
        r.register(self.request_counts)
        self.paused = _gauge(am.P_PAUSED, r)
        self.event_errors = _counter(am.P_EVENT_ERRORS, r)
        self.otlp_failed = _counter(am.P_OTLP_FAILED, r)
        self.connections = _gauge(am.P_CONNECTIONS, r)
        self.gpu = GpuMetrics(r)
        self.genai = GenAiMetrics(r)
        self.ready = False
        # Called before each /metrics answer (serialised by scrape_lock): the values that
        # cost a read of the kernel's maps, /proc or netlink are taken when someone asks
        # (a scraper, every 15-60 s) rather than every second whether anyone asks or not.
        self.before_scrape: Callable[[], None] | None = None
        self.scrape_lock = threading.Lock()

    def refresh(self) -> None:
        """Bring the values up to date (before_scrape); a failure leaves the last ones."""
        if self.before_scrape is None:
            return
        with self.scrape_lock:
            try:
                self.before_scrape()
            except Exception as e:  # noqa: BLE001  (a scrape must still answer)
                log.warning("metrics refresh failed: %s", e)


class _Handler(BaseHTTPRequestHandler):
    metrics: Metrics

    def do_GET(self) -> None:
        if self.path.startswith("/metrics"):
            self.metrics.refresh()
            body = generate_latest(self.metrics.registry)
            self._send(200, body, CONTENT_TYPE_LATEST)
        elif self.path.startswith("/healthz"):
            self._send(200, b"ok\n")
        elif self.path.startswith("/readyz"):
            ok = self.metrics.ready
            self._send(200 if ok else 503, b"ready\n" if ok else b"attaching\n")
        else:
            self._send(404, b"not found\n")

    def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(metrics: Metrics, addr: str) -> ThreadingHTTPServer:
    host, _, port = addr.rpartition(":")
    handler = type("H", (_Handler,), {"metrics": metrics})
    number = int(port) if port.isascii() and port.isdigit() and len(port) <= 5 else -1
    if not 0 <= number <= 65535:
        raise ValueError(f"bad port {port!r}")  # (bind() raises OverflowError, uncaught)
    srv = ThreadingHTTPServer((host.strip("[]") or "127.0.0.1", number), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, name="metrics", daemon=True).start()
    return srv


def listen_overflows() -> int:
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return 0
    for i in range(0, len(lines) - 1, 2):
        if lines[i].startswith("TcpExt:"):
            names, values = lines[i].split(), lines[i + 1].split()
            if "ListenOverflows" in names:
                return int(values[names.index("ListenOverflows")])
    return 0
