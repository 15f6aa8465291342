"""The metrics the agent exports over OTLP beside its spans (``/v1/metrics``): GPU device
series, the GenAI server latency histograms, and every request counted per port, sampled or
not, with the sampling probability in force. One place for names, kinds and units; the
agent's Prometheus ``/metrics`` shows the same series under Prometheus names.

Device series carry ``hw.id`` (the GPU's NVML UUID) and ``hw.name``; OpenTelemetry's
hardware names where they exist (``hw.gpu.*``), ``parallax.gpu.*`` for the rest. The GenAI
histograms (seconds, OpenTelemetry's GenAI semantic conventions) carry ``http.route``,
``server.port`` and ``service.name`` (on the data point: one agent serves every service of
its node), so they sit beside an inference server's own.

The agent's Prometheus ``/metrics`` is declared here too (``PROMETHEUS``, below): every
series it serves, by the name a scrape shows, in Prometheus' conventions — base units in
the name (seconds, bytes, hertz, watts, ratio), counters ending ``_total`` (the kernel's
cumulative counts included), histograms in seconds. agent/metrics.py builds its registry
from these, and a test holds the registry to them.

``python -m parallax_contracts.agent_metrics`` prints the Markdown tables kept in
docs/contracts/agent-metrics.md (a test checks the two agree).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

Kind = Literal["gauge", "counter", "updowncounter", "histogram"]


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    kind: Kind
    unit: str
    doc: str
    standard: bool = False  # an OpenTelemetry semantic-convention name


# --- attributes ----------------------------------------------------------------------
HW_ID = "hw.id"  # the GPU's UUID (NVML), e.g. GPU-8f2c…
HW_NAME = "hw.name"  # the product name, e.g. "NVIDIA H200"
HW_VENDOR = "hw.vendor"
PROCESS_PID = "process.pid"  # per-process GPU series: the host pid
SERVICE_NAME = "service.name"
SERVER_PORT = "server.port"

# --- device series (NVML) -------------------------------------------------------------
HW_GPU_UTILIZATION = Metric(
    "hw.gpu.utilization",
    "gauge",
    "1",
    "Share of the last sample period in which a kernel ran on the GPU, 0–1 (NVML).",
    True,
)
HW_GPU_MEMORY_USAGE = Metric(
    "hw.gpu.memory.usage", "updowncounter", "By", "GPU memory in use (NVML).", True
)
HW_GPU_MEMORY_LIMIT = Metric(
    "hw.gpu.memory.limit", "updowncounter", "By", "GPU memory in all (NVML).", True
)
GPU_SM_CLOCK = Metric("parallax.gpu.sm_clock", "gauge", "MHz", "Current SM clock.")
GPU_SM_CLOCK_MAX = Metric("parallax.gpu.sm_clock_max", "gauge", "MHz", "Maximum SM clock.")
GPU_POWER = Metric("parallax.gpu.power", "gauge", "W", "Power draw.")
GPU_POWER_LIMIT = Metric("parallax.gpu.power_limit", "gauge", "W", "Enforced power limit.")
GPU_CLOCK_EVENT_REASONS = Metric(
    "parallax.gpu.clock_event_reasons",
    "gauge",
    "1",
    "Why the clocks are below their maximum: NVML's clock-event reason bitmask (0x1 GPU idle,"
    " 0x4 SW power cap, 0x8 HW slowdown, 0x20 SW thermal, 0x40 HW thermal, 0x80 HW power"
    " brake; docs/gpu.md).",
)
# --- per GPU process (CUDA driver uprobes) -----------------------------------------
GPU_LAUNCHES = Metric(
    "parallax.gpu.launches",
    "counter",
    "{launch}",
    "Kernel launches enqueued by the process (host side: cuLaunchKernel*, not execution).",
)
GPU_GRAPH_LAUNCHES = Metric(
    "parallax.gpu.graph_launches", "counter", "{launch}", "CUDA graph launches enqueued."
)
GPU_HOST_WAIT = Metric(
    "parallax.gpu.host_wait",
    "counter",
    "s",
    "Time the process's host threads were blocked on the GPU (union over threads).",
)
# --- GenAI server latency (OpenTelemetry GenAI semconv), LLM streams only ---------------
# Fed by the records of responses that spoke a stream dialect (agent/protocols/streams): a
# chunked download or an SSE feed in no dialect is no token stream and feeds none of them.
GEN_AI_TTFT = Metric(
    "gen_ai.server.time_to_first_token",
    "histogram",
    "s",
    "Server time to the first answer token: the app's read of the request → its write of"
    " the first content event (not the head, a role-only delta or a heartbeat).",
    True,
)
GEN_AI_TPOT = Metric(
    "gen_ai.server.time_per_output_token",
    "histogram",
    "s",
    "Server time per output token after the first: (last output event − first) / (output"
    " tokens − 1), the count as the stream states it (usage) else its output events; one"
    " observation per complete stream of two tokens or more.",
    True,
)
GEN_AI_DURATION = Metric(
    "gen_ai.server.request.duration",
    "histogram",
    "s",
    "Server time from the app's read of the request to its last write.",
    True,
)
# OpenTelemetry's GenAI conventions' advised bucket boundaries (seconds).
GEN_AI_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
GEN_AI_TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
GEN_AI_DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
# Their attributes (semconv names; ours last: the agent serves every service of its node)
GEN_AI_ATTRIBUTES = (
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.response.model",
    "server.address",
    "server.port",
    "error.type",
    "http.route",
    "service.name",
)

# --- every request, sampled or not (the kernel's counts; docs/agent.md, Sampling) --------
REQUESTS_SEEN = Metric(
    "parallax.requests.seen",
    "counter",
    "{request}",
    "Requests the agent saw start on a traced port, sampled or not (exact, from the kernel);"
    " attributes server.port and, where known, service.name.",
)
REQUESTS_TRACED = Metric(
    "parallax.requests.traced",
    "counter",
    "{request}",
    "Of those, the requests the agent sampled and exported as spans.",
)
SAMPLING_PROBABILITY = Metric(
    "parallax.sampling.probability",
    "gauge",
    "1",
    "The share of requests the agent traces now (each kept at random with this"
    " probability; 1: all). Each span states its own in tracestate ot=th.",
)

DEVICE: tuple[Metric, ...] = (
    HW_GPU_UTILIZATION,
    HW_GPU_MEMORY_USAGE,
    HW_GPU_MEMORY_LIMIT,
    GPU_SM_CLOCK,
    GPU_SM_CLOCK_MAX,
    GPU_POWER,
    GPU_POWER_LIMIT,
    GPU_CLOCK_EVENT_REASONS,
)
PROCESS: tuple[Metric, ...] = (GPU_LAUNCHES, GPU_GRAPH_LAUNCHES, GPU_HOST_WAIT)
GEN_AI: tuple[Metric, ...] = (GEN_AI_TTFT, GEN_AI_TPOT, GEN_AI_DURATION)
SAMPLING: tuple[Metric, ...] = (REQUESTS_SEEN, REQUESTS_TRACED, SAMPLING_PROBABILITY)
ALL: tuple[Metric, ...] = DEVICE + PROCESS + GEN_AI + SAMPLING
BY_NAME: dict[str, Metric] = {m.name: m for m in ALL}


# --- the agent's Prometheus /metrics ---------------------------------------------------
PromKind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True, slots=True)
class PromSeries:
    name: str  # as a scrape shows it: a counter's ends in _total, a histogram's family name
    kind: PromKind
    labels: tuple[str, ...]
    doc: str


def _c(name: str, doc: str, *labels: str) -> PromSeries:
    return PromSeries(name, "counter", labels, doc)


def _g(name: str, doc: str, *labels: str) -> PromSeries:
    return PromSeries(name, "gauge", labels, doc)


P = "parallax_agent_"
# the record path
P_EVENTS = _c(P + "events_total", "Ring-buffer events received")
P_REQUESTS = _c(P + "requests_total", "Request records emitted", "service")
P_LOST_EVENTS = _c(
    P + "lost_events_total",
    "Events the kernel could not queue (ring full; the kernel's count since the programs loaded)",
)
P_SHED_RECORDS = _c(
    P + "shed_records_total",
    "Records dropped by the bounded export queue, the oldest first (as the OTLP sender's"
    " queue drops its oldest: otlp_failed_spans_total)",
)
P_MAP_ENTRIES = _g(P + "map_entries", "Entries in the kernel maps", "map")
P_UNPARSED = _c(
    P + "unparsed_connections_total",
    "Connections whose bytes are not HTTP/1.x (TLS, HTTP/2, other)",
    "port",
)
P_TLS_UNPROBED = _c(
    P + "tls_unprobed_total",
    "TLS connections of traced processes whose TLS library carries no probe (Go's"
    " crypto/tls, a static or stripped OpenSSL, BoringSSL, --tls off): their requests"
    " are not recorded; per executable name",
    "comm",
)
P_HEAD_TOO_LARGE = _c(P + "head_too_large_total", "Request heads larger than the capture window")
P_TRACEPARENT_MISSED = _c(
    P + "traceparent_missed_total", "Requests whose traceparent may lie beyond the capture window"
)
# the server's sockets (the kernel's cumulative counts, read at the scrape)
P_LISTEN_OVERFLOWS = _c(
    P + "listen_overflows_total",
    "Node-wide TCP ListenOverflows (/proc/net/netstat; no per-port tracepoint)",
)
P_LISTEN_DROPS = _c(
    P + "listen_drops_total",
    "Connections dropped by a full accept queue, per listening port (the listener's sk_drops"
    " via sock_diag, summed over IPv4/IPv6 and network namespaces; port 0: a namespace the"
    " agent cannot enter, its ListenDrops)",
    "port",
)
P_SYNACK_RETRANSMITS = _c(
    P + "synack_retransmits_total", "SYN-ACK retransmits per listening port", "port"
)
P_CONN_EVICTIONS = _c(
    P + "conn_evictions_total",
    "Connections dropped from the bounded user-space table (LRU) before their end",
)
P_LOST_EXCHANGES = _c(
    P + "lost_exchanges_total",
    "Requests in flight dropped because events of their connection were lost",
)
P_H2_DESYNC = _c(
    P + "h2_desync_total",
    "HTTP/2 connections whose framing or HPACK state was lost (no records from then on):"
    " header_beyond_capture, payload_beyond_capture, hpack, lost_events, ...",
    "reason",
)
P_H2_LOST_STREAMS = _c(
    P + "h2_lost_streams_total",
    "HTTP/2 streams in flight when their connection desynchronised (not recorded)",
)
P_BPF_MISSED_RUNS = _c(
    P + "bpf_missed_runs_total",
    "Runs of the agent's kernel programs the kernel skipped because another BPF program was"
    " running on the same CPU (bpf_prog_info.recursion_misses): those events are lost, and a"
    " connection whose start was skipped is not followed",
    "program",
)
P_UNFOLLOWED_READS = _c(
    P + "unfollowed_reads_total",
    "Reads with data by traced servers on accepted connections the agent was not following"
    " (their start missed, or their entry dropped from the kernel's full connection map:"
    " --max-conns): their requests are not recorded. Served where the kernel's BTF gives"
    " the socket's fields",
)
P_HTTP1_UNFRAMED = _c(
    P + "http1_unframed_total",
    "HTTP/1 exchanges not recorded because the agent could not frame them:"
    " unmatched_response (a response whose request's read was not seen), desync (bytes"
    " beyond the capture window broke the framing; the next request starts it again)",
    "reason",
)
P_UNANSWERED = _c(
    P + "unanswered_requests_total",
    "Requests read whose connection ended (or the agent stopped) before a response began:"
    " not recorded",
)
# overload: sampling, then pausing
P_SHED_REQUESTS = _c(
    P + "shed_requests_total",
    "Requests not traced while tracing was paused after a full ring buffer: reads with data"
    " by traced processes meanwhile (sampling is counted in parallax_agent_requests_seen_total)",
)
P_PAUSES = _c(
    P + "pauses_total",
    "Times tracing was paused, by reason: ring_full (the programs paused themselves when the"
    " ring had no room; load is otherwise met by sampling)",
    "reason",
)
P_SAMPLING_PROBABILITY = _g(
    P + "sampling_probability",
    "The share of requests traced now: the kernel keeps each request with this probability,"
    " at random (1: all); it adapts to --cpu-budget and the ring buffer",
)
P_REQUESTS_SEEN = _c(
    P + "requests_seen_total",
    "HTTP requests the kernel saw start on a traced port, sampled or not (exact)",
    "port",
)
P_REQUESTS_TRACED = _c(
    P + "requests_traced_total",
    "Of those, requests sampled (traced); traced / seen is the sampled share",
    "port",
)
P_REQUEST_TTFB = PromSeries(
    P + "request_ttfb_seconds",
    "histogram",
    ("port",),
    "Server TTFB (the request's first read to the response head) of every request, sampled"
    " or not (the kernel's log2 buckets)",
)
# the GenAI histograms above under Prometheus names (their attributes as labels, dots as
# underscores): LLM streams only
P_GEN_AI_LABELS = tuple(a.replace(".", "_") for a in GEN_AI_ATTRIBUTES)
P_GEN_AI_TTFT = PromSeries(
    "gen_ai_server_time_to_first_token_seconds", "histogram", P_GEN_AI_LABELS, GEN_AI_TTFT.doc
)
P_GEN_AI_TPOT = PromSeries(
    "gen_ai_server_time_per_output_token_seconds", "histogram", P_GEN_AI_LABELS, GEN_AI_TPOT.doc
)
P_GEN_AI_DURATION = PromSeries(
    "gen_ai_server_request_duration_seconds", "histogram", P_GEN_AI_LABELS, GEN_AI_DURATION.doc
)
P_PAUSED = _g(P + "paused", "1 while tracing is paused (the last resort after a full ring buffer)")
P_EVENT_ERRORS = _c(
    P + "event_errors_total",
    "Ring-buffer events the agent failed to handle (an unexpected error: the agent goes on,"
    " the connection concerned resynchronises; its stderr names the error type once)",
)
P_OTLP_FAILED = _c(
    P + "otlp_failed_spans_total",
    "Spans not delivered over OTLP (--otlp): dropped at the export queue's bound during a"
    " collector outage, refused by the collector, or left at exit",
)
P_CONNECTIONS = _g(P + "connections", "Connections followed in user space")
# the GPU side (docs/gpu.md): the device series above under Prometheus names, per GPU uuid
P_GPU_UTILIZATION = _g(
    P + "gpu_utilization_ratio", "Share of the last sample period a kernel ran (NVML)", "gpu"
)
P_GPU_MEMORY_USED = _g(P + "gpu_memory_used_bytes", "GPU memory in use", "gpu")
P_GPU_MEMORY_TOTAL = _g(P + "gpu_memory_total_bytes", "GPU memory in all", "gpu")
P_GPU_SM_CLOCK = _g(P + "gpu_sm_clock_hertz", "Current SM clock", "gpu")
P_GPU_SM_CLOCK_MAX = _g(P + "gpu_sm_clock_max_hertz", "Maximum SM clock", "gpu")
P_GPU_POWER = _g(P + "gpu_power_watts", "Power draw", "gpu")
P_GPU_POWER_LIMIT = _g(P + "gpu_power_limit_watts", "Enforced power limit", "gpu")
P_GPU_CLOCK_EVENT_REASONS = _g(
    P + "gpu_clock_event_reasons", "NVML clock-event (throttle) reason bitmask", "gpu"
)
P_GPU_LAUNCHES = _c(
    P + "gpu_launches_total",
    "Kernel and graph launches enqueued by a traced service's GPU process (CUDA driver uprobes)",
    "pid",
)
P_GPU_HOST_WAIT = _c(
    P + "gpu_host_wait_seconds_total",
    "Time a GPU process's host threads were blocked on the GPU",
    "pid",
)
P_GPU_PROCESSES = _g(
    P + "gpu_processes",
    "GPU processes of the traced services, and those whose CUDA driver carries the probes"
    " (state=probed)",
    "state",
)
P_GPU_RECORDS = _c(
    P + "gpu_records_total", "Records of services with GPU processes given GPU attributes"
)
P_GPU_HOLD_EXPIRED = _c(
    P + "gpu_hold_expired_total",
    "Records released before the GPU data of their windows was read (held too long)",
)
P_NVML_ERRORS = _c(
    P + "nvml_errors_total", 'NVML calls that failed unexpectedly ("no new samples" is not counted)'
)

PROMETHEUS: tuple[PromSeries, ...] = (
    P_EVENTS, P_REQUESTS, P_LOST_EVENTS, P_SHED_RECORDS, P_MAP_ENTRIES, P_UNPARSED, P_TLS_UNPROBED,
    P_HEAD_TOO_LARGE, P_TRACEPARENT_MISSED, P_LISTEN_OVERFLOWS, P_LISTEN_DROPS,
    P_SYNACK_RETRANSMITS, P_CONN_EVICTIONS, P_LOST_EXCHANGES, P_H2_DESYNC, P_H2_LOST_STREAMS,
    P_BPF_MISSED_RUNS, P_UNFOLLOWED_READS, P_HTTP1_UNFRAMED, P_UNANSWERED, P_SHED_REQUESTS,
    P_PAUSES, P_SAMPLING_PROBABILITY, P_REQUESTS_SEEN, P_REQUESTS_TRACED, P_REQUEST_TTFB,
    P_GEN_AI_TTFT, P_GEN_AI_TPOT, P_GEN_AI_DURATION, P_PAUSED, P_EVENT_ERRORS, P_OTLP_FAILED,
    P_CONNECTIONS, P_GPU_UTILIZATION, P_GPU_MEMORY_USED, P_GPU_MEMORY_TOTAL, P_GPU_SM_CLOCK,
    P_GPU_SM_CLOCK_MAX, P_GPU_POWER, P_GPU_POWER_LIMIT, P_GPU_CLOCK_EVENT_REASONS, P_GPU_LAUNCHES,
    P_GPU_HOST_WAIT, P_GPU_PROCESSES, P_GPU_RECORDS, P_GPU_HOLD_EXPIRED, P_NVML_ERRORS,
)  # fmt: skip


def markdown_table() -> str:
    rows = ["| Metric | Kind | Unit | Meaning |", "|---|---|---|---|"]
    for m in ALL:
        name = f"`{m.name}`" + (" (semconv)" if m.standard else "")
        rows.append(f"| {name} | {m.kind} | {m.unit} | {m.doc} |")
    return "\n".join(rows) + "\n"


def prometheus_table() -> str:
    rows = ["| Series | Type | Labels | Meaning |", "|---|---|---|---|"]
    for s in PROMETHEUS:
        labels = ", ".join(f"`{x}`" for x in s.labels) or "—"
        rows.append(f"| `{s.name}` | {s.kind} | {labels} | {s.doc} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table() + "\n" + prometheus_table())
