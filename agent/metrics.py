"""Prometheus metrics and the /healthz and /readyz endpoints of the agent."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

TTFB_BUCKETS = 32  # the kernel's log2 µs buckets (bpf/agent/sample.h PX_TTFB_BUCKETS)


class RequestCounts(Collector):
    """Every request, sampled or not, per port label — the kernel's exact counts and server
    TTFB histogram (bpf/agent/sample.h), taken at the scrape (``per_label`` is set by the
    scrape's refresh): (seen, kept, log2 µs buckets, sum µs) per label."""

    def __init__(self) -> None:
        self.per_label: dict[str, tuple[int, int, list[int], int]] = {}

    def collect(self) -> list[Metric]:
        seen = CounterMetricFamily(
            "parallax_agent_requests_seen",
            "HTTP requests the kernel saw start on a traced port, sampled or not (exact)",
            labels=["port"],
        )
        kept = CounterMetricFamily(
            "parallax_agent_requests_traced",
            "Of those, requests sampled (traced); traced / seen is the sampled share",
            labels=["port"],
        )
        ttfb = HistogramMetricFamily(
            "parallax_agent_request_ttfb_seconds",
            "Server TTFB (the request's first read to the response head) of every request,"
            " sampled or not (the kernel's log2 buckets)",
            labels=["port"],
        )
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
        self.device = {
            name: Gauge(f"parallax_agent_gpu_{name}", doc, ["gpu"], registry=r)
            for name, doc in (
                ("utilization_ratio", "Share of the last sample period a kernel ran (NVML)"),
                ("memory_used_bytes", "GPU memory in use"),
                ("memory_total_bytes", "GPU memory in all"),
                ("sm_clock_mhz", "Current SM clock"),
                ("sm_clock_max_mhz", "Maximum SM clock"),
                ("power_watts", "Power draw"),
                ("power_limit_watts", "Enforced power limit"),
                ("clock_event_reasons", "NVML clock-event (throttle) reason bitmask"),
            )
        }
        self.launches = Gauge(
            "parallax_agent_gpu_launches",
            "Kernel and graph launches enqueued by a traced service's GPU process (CUDA"
            " driver uprobes; a cumulative count)",
            ["pid"],
            registry=r,
        )
        self.host_wait = Gauge(
            "parallax_agent_gpu_host_wait_seconds",
            "Time a GPU process's host threads were blocked on the GPU (cumulative)",
            ["pid"],
            registry=r,
        )
        self.processes = Gauge(
            "parallax_agent_gpu_processes",
            "GPU processes of the traced services, and those whose CUDA driver carries the"
            " probes (state=probed)",
            ["state"],
            registry=r,
        )
        self.records = Counter(
            "parallax_agent_gpu_records",
            "Records of services with GPU processes given GPU attributes",
            registry=r,
        )
        self.hold_expired = Counter(
            "parallax_agent_gpu_hold_expired",
            "Records released before the GPU data of their windows was read (held too long)",
            registry=r,
        )
        self.nvml_errors = Counter(
            "parallax_agent_nvml_errors",
            'NVML calls that failed unexpectedly ("no new samples" is not counted)',
            registry=r,
        )


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.events = Counter("parallax_agent_events", "Ring-buffer events received", registry=r)
        self.requests = Counter(
            "parallax_agent_requests", "Request records emitted", ["service"], registry=r
        )
        self.lost = Gauge(
            "parallax_agent_lost_events",
            "Events the kernel could not queue (ring full)",
            registry=r,
        )
        self.shed = Counter(
            "parallax_agent_shed_records",
            "Records dropped by the bounded export queue",
            registry=r,
        )
        self.map_fill = Gauge(
            "parallax_agent_map_entries", "Entries in the kernel maps", ["map"], registry=r
        )
        self.unparsed = Counter(
            "parallax_agent_unparsed_connections",
            "Connections whose bytes are not HTTP/1.x (TLS, HTTP/2, other)",
            ["port"],
            registry=r,
        )
        self.tls_unprobed = Counter(
            "parallax_agent_tls_unprobed",
            "TLS connections of traced processes whose TLS library carries no probe (Go's"
            " crypto/tls, a static or stripped OpenSSL, BoringSSL, --tls off): their requests"
            " are not recorded; per executable name",
            ["comm"],
            registry=r,
        )
        self.head_too_large = Counter(
            "parallax_agent_head_too_large",
            "Request heads larger than the capture window",
            registry=r,
        )
        self.traceparent_missed = Counter(
            "parallax_agent_traceparent_missed",
            "Requests whose traceparent may lie beyond the capture window",
            registry=r,
        )
        self.listen_overflows = Gauge(
            "parallax_agent_listen_overflows",
            "Node-wide TCP ListenOverflows (/proc/net/netstat; no per-port tracepoint)",
            registry=r,
        )
        self.listen_drops = Gauge(
            "parallax_agent_listen_drops",
            "Connections dropped by a full accept queue, per listening port (the listener's "
            "sk_drops via sock_diag, summed over IPv4/IPv6 and network namespaces; port 0: a "
            "namespace the agent cannot enter, its ListenDrops)",
            ["port"],
            registry=r,
        )
        self.synack_retransmits = Gauge(
            "parallax_agent_synack_retransmits",
            "SYN-ACK retransmits per listening port",
            ["port"],
            registry=r,
        )
        self.evicted = Counter(
            "parallax_agent_conn_evictions",
            "Connections dropped from the bounded user-space table (LRU) before their end",
            registry=r,
        )
        self.lost_exchanges = Counter(
            "parallax_agent_lost_exchanges",
            "Requests in flight dropped because events of their connection were lost",
            registry=r,
        )
        self.h2_desync = Counter(
            "parallax_agent_h2_desync",
            "HTTP/2 connections whose framing or HPACK state was lost (no records from then"
            " on): header_beyond_capture, payload_beyond_capture, hpack, lost_events, ...",
            ["reason"],
            registry=r,
        )
        self.h2_lost_streams = Counter(
            "parallax_agent_h2_lost_streams",
            "HTTP/2 streams in flight when their connection desynchronised (not recorded)",
            registry=r,
        )
        self.unanswered = Counter(
            "parallax_agent_unanswered_requests",
            "Requests read whose connection ended (or the agent stopped) before a response"
            " began: not recorded",
            registry=r,
        )
        self.shed_requests = Counter(
            "parallax_agent_shed_requests",
            "Requests not traced while tracing was paused after a full ring buffer: reads"
            " with data by traced processes meanwhile (sampling is counted in"
            " parallax_agent_requests_seen_total)",
            registry=r,
        )
        self.pauses = Counter(
            "parallax_agent_pauses",
            "Times tracing was paused, by reason: ring_full (the programs paused themselves"
            " when the ring had no room; load is otherwise met by sampling)",
            ["reason"],
            registry=r,
        )
        self.sampling_probability = Gauge(
            "parallax_agent_sampling_probability",
            "The share of requests traced now: the kernel keeps each request with this"
            " probability, at random (1: all); it adapts to --cpu-budget and the ring buffer",
            registry=r,
        )
        self.sampling_probability.set(1.0)
        self.request_counts = RequestCounts()
        r.register(self.request_counts)
        self.paused = Gauge(
            "parallax_agent_paused",
            "1 while tracing is paused (the last resort after a full ring buffer)",
            registry=r,
        )
        self.event_errors = Counter(
            "parallax_agent_event_errors",
            "Ring-buffer events the agent failed to handle (an unexpected error: the agent"
            " goes on, the connection concerned resynchronises; its stderr names the error"
            " type once)",
            registry=r,
        )
        self.otlp_failed = Counter(
            "parallax_agent_otlp_failed_spans",
            "Spans not delivered over OTLP (--otlp): dropped at the export queue's bound"
            " during a collector outage, refused by the collector, or left at exit",
            registry=r,
        )
        self.connections = Gauge(
            "parallax_agent_connections", "Connections followed in user space", registry=r
        )
        self.gpu = GpuMetrics(r)
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
