"""The span attributes the agent emits and the collector reads: the data model in one place.

Standard fields use OpenTelemetry semantic-convention names; everything Parallax adds is
``parallax.*``. Durations are integers in microseconds (names end ``_us``), instants are
Unix nanoseconds (``_unix_ns``). Any OTLP source may send spans: only the standard names
are needed for a span to pair (its duration then stands for server TTFB).

``python -m parallax_contracts.span_attributes`` prints the Markdown table kept in
docs/contracts/span-attributes.md (a test checks the two agree).
"""

from __future__ import annotations

import sys

from parallax_contracts import genai
from parallax_contracts.attr import Attr as Attr  # noqa: PLC0414  (re-exported)
from parallax_contracts.attr import AttrType
from parallax_contracts.attr import record_field as record_field  # noqa: PLC0414

# --- OpenTelemetry semantic conventions (span attributes) --------------------------
HTTP_REQUEST_METHOD = Attr("http.request.method", "string", "", "Request method.", True)
URL_PATH = Attr(
    "url.path",
    "string",
    "",
    "Request path. The query string is dropped (a `traceparent` parameter is read, not kept).",
    True,
)
HTTP_ROUTE = Attr(
    "http.route",
    "string",
    "",
    "Low-cardinality route when the source knows it; else the collector derives one.",
    True,
)
HTTP_RESPONSE_STATUS_CODE = Attr(
    "http.response.status_code",
    "int",
    "",
    "Response status (101 for a WebSocket upgrade).",
    True,
)
SERVER_ADDRESS = Attr("server.address", "string", "", "Local address of the server socket.", True)
SERVER_PORT = Attr("server.port", "int", "", "Local port of the server socket.", True)
CLIENT_ADDRESS = Attr("client.address", "string", "", "Peer address of the connection.", True)
CLIENT_PORT = Attr("client.port", "int", "", "Peer port of the connection.", True)
NETWORK_PROTOCOL_VERSION = Attr(
    "network.protocol.version", "string", "", "HTTP version, e.g. `1.1`, or `2` (HTTP/2).", True
)
RPC_SYSTEM = Attr(
    "rpc.system",
    "string",
    "",
    "`grpc` for an HTTP/2 stream of content-type `application/grpc`.",
    True,
)
RPC_SERVICE = Attr(
    "rpc.service", "string", "", "gRPC only: the service, from `:path` `/<service>/<method>`.", True
)
RPC_METHOD = Attr("rpc.method", "string", "", "gRPC only: the method, from `:path`.", True)
RPC_GRPC_STATUS_CODE = Attr(
    "rpc.grpc.status_code",
    "int",
    "",
    "gRPC only: `grpc-status` of the response's trailers (0 OK; absent without trailers).",
    True,
)

# --- Parallax: kernel timings (agent) ----------------------------------------------
TTFB_US = Attr(
    "parallax.ttfb_us",
    "int",
    "us",
    "Server TTFB t2 − t1: the app's read of the request → its first response write.",
)
RECV_QUEUE_US = Attr(
    "parallax.recv_queue_us",
    "int",
    "us",
    "Receive-queue wait t1 − max(t_arr, t_acc): request bytes waiting for the app to read.",
)
ACCEPT_QUEUE_US = Attr(
    "parallax.accept_queue_us",
    "int",
    "us",
    "Accept-queue wait t_acc − t_est. First request of a connection only; absent after.",
)
ARRIVAL_UNIX_NS = Attr(
    "parallax.arrival_unix_ns",
    "int",
    "ns",
    "t_arr: the request's bytes arrived at the server socket (Unix time).",
)
TTFT_US = Attr(
    "parallax.ttft_us",
    "int",
    "us",
    "Server TTFT: on an LLM stream (`parallax.llm.dialect` set) the first answer token's write"
    " − t1; elsewhere, for now, t_tok − t1 as `parallax.first_chunk_us`.",
)
FIRST_CHUNK_US = Attr(
    "parallax.first_chunk_us",
    "int",
    "us",
    "First write carrying body bytes − t1 (may be the header write), for every response with"
    " a body. On an LLM stream `parallax.ttft_us` is its first answer token instead.",
)
CHUNK_OFFSETS_US = Attr(
    "parallax.chunk_offsets_us",
    "int[]",
    "us",
    "Each body-carrying write − t1, for the first 256 writes of the response.",
)
CHUNKS = Attr("parallax.chunks", "int", "", "Body-carrying writes in the response (all of them).")
CHUNK_GAP_MAX_US = Attr(
    "parallax.chunk_gap_max_us", "int", "us", "Largest gap between consecutive body writes."
)
DURATION_US = Attr("parallax.duration_us", "int", "us", "t_end − t1: read → last write.")
BYTES_IN = Attr("parallax.bytes_in", "int", "By", "Request bytes read by the app.")
BYTES_OUT = Attr("parallax.bytes_out", "int", "By", "Response bytes written by the app.")
SRTT_US = Attr("parallax.srtt_us", "int", "us", "TCP smoothed RTT of the connection (tcp_probe).")
RETRANSMITS = Attr(
    "parallax.retransmits",
    "int",
    "",
    "TCP segments the server's kernel sent again for the request: from its read to the next"
    " request's on the connection, or to the socket's end (the first request's from the"
    " SYN-ACK on).",
)
RETRANSMIT_WAIT_US = Attr(
    "parallax.retransmit_wait_us",
    "int",
    "us",
    "The time the request's connection had bytes waiting to be sent again: for each"
    " retransmission timed, from the start of the write that queued its bytes (the first"
    " SYN-ACK's send, for a SYN-ACK), or from the previous retransmission if later, to the"
    " retransmission. Absent when none of the request's retransmits could be timed.",
)
WS_SEQ = Attr(
    "parallax.ws_seq",
    "int",
    "",
    "WebSocket exchange number after the upgrade (1 = first client message), as the probe counts.",
)
PARTIAL = Attr(
    "parallax.partial",
    "bool",
    "",
    "The record covers the response only in part: a stream over the length limit (a final one"
    " follows), the agent stopping mid-response, or the server gone mid-response.",
)
CLIENT_ABORTED = Attr(
    "parallax.client_aborted",
    "bool",
    "",
    "The peer closed the connection before the response ended.",
)
TRACEPARENT_MISSED = Attr(
    "parallax.traceparent_missed",
    "bool",
    "",
    "The request head exceeded the capture window, so a `traceparent` may have been missed.",
)
SOURCE = Attr("parallax.source", "string", "", "Who measured the span: `ebpf` for the agent.")

# --- Parallax: write-to-wire holdback (agent, docs/agent.md "Write-to-wire holdback") ----
# For each body write, the time from the write to the departure of the segment carrying its
# last byte (handed to the device). Absent when not measured (TLS, kernels without the
# socket hooks or the BTF fields); 0 held writes when measured and none was held.
WIRE_HOLD_WRITES = Attr(
    "parallax.wire_hold.writes",
    "int",
    "",
    "Body writes whose bytes the kernel held back after the write returned, timed.",
)
WIRE_HOLD_MAX_US = Attr(
    "parallax.wire_hold.max_us",
    "int",
    "us",
    "Longest wait of a body write's last byte between the write and its segment's departure.",
)
WIRE_HOLD_SUM_US = Attr(
    "parallax.wire_hold.sum_us", "int", "us", "Sum of those waits over the held writes."
)
WIRE_HOLD_BYTES = Attr(
    "parallax.wire_hold.bytes", "int", "By", "Most response bytes left unsent at a write's return."
)
WIRE_HOLD_REASON = Attr(
    "parallax.wire_hold.reason",
    "string",
    "",
    "Why the longest-held write waited: `nagle`, `cork`, `cwnd`, `rwnd`, `sndbuf` or `stack`.",
)
WIRE_HOLD_UNTIMED = Attr(
    "parallax.wire_hold.untimed",
    "int",
    "",
    "Held writes whose departure was not seen (still held at the response's end, queue full).",
)

# --- Parallax: GPU time beside the request (agent, docs/gpu.md) ----------------------
# Windows: prefill = t1 → the first body write (ttft), decode = first body write → the last
# write. GPU activity is the *service's*: its GPU processes (the traced process and those in
# its cgroup that use a GPU) during the window, shared with whatever else they served then
# (inference servers batch), never the request's own kernels. Absent when not measured: a
# service without GPU processes, no NVML, uprobes off, a window without samples.
GPU_PREFILL_LAUNCHES = Attr(
    "parallax.gpu.prefill_launches",
    "int",
    "",
    "Kernel and graph launches the service's GPU processes enqueued during prefill (host"
    " enqueue times, CUDA driver uprobes; not execution on the GPU).",
)
GPU_DECODE_LAUNCHES = Attr(
    "parallax.gpu.decode_launches",
    "int",
    "",
    "Kernel and graph launches the service's GPU processes enqueued during decode.",
)
GPU_PREFILL_WAIT_US = Attr(
    "parallax.gpu.prefill_wait_us",
    "int",
    "us",
    "Time a host thread of the service was blocked on the GPU during prefill (synchronize,"
    " device-to-host copy; the union over threads).",
)
GPU_DECODE_WAIT_US = Attr(
    "parallax.gpu.decode_wait_us",
    "int",
    "us",
    "Time a host thread of the service was blocked on the GPU during decode (union over threads).",
)
GPU_PREFILL_SM_UTIL_PCT = Attr(
    "parallax.gpu.prefill_sm_util_pct",
    "double",
    "%",
    "SM utilisation of the service's GPU processes during prefill, 0–100 (NVML process"
    " samples, time-weighted).",
)
GPU_DECODE_SM_UTIL_PCT = Attr(
    "parallax.gpu.decode_sm_util_pct",
    "double",
    "%",
    "SM utilisation of the service's GPU processes during decode, 0–100.",
)
GPU_SAMPLE_COVERAGE = Attr(
    "parallax.gpu.sample_coverage",
    "double",
    "",
    "Share of the request's windows (prefill + decode) that NVML samples cover, 0–1.",
)
GPU_INFLIGHT_MEAN = Attr(
    "parallax.gpu.inflight_mean",
    "double",
    "",
    "Mean number of requests in flight to the same service over the request (itself"
    " included): the batch it shared the GPU with.",
)
GPU_UUID = Attr(
    "parallax.gpu.uuid",
    "string",
    "",
    "The GPUs the service's GPU processes ran on (NVML UUIDs, comma-separated).",
)

# Resource attributes the agent sets per process (OpenTelemetry semantic-convention names).
RESOURCE_SERVICE_NAME = "service.name"
RESOURCE_PROCESS_PID = "process.pid"
RESOURCE_PROCESS_EXECUTABLE_NAME = "process.executable.name"
RESOURCE_HOST_NAME = "host.name"
# The process's container (its cgroup) and, in Kubernetes, its pod (the API), node, workload.
RESOURCE_CONTAINER_ID = "container.id"
RESOURCE_K8S_NODE_NAME = "k8s.node.name"
RESOURCE_K8S_NAMESPACE_NAME = "k8s.namespace.name"
RESOURCE_K8S_POD_NAME = "k8s.pod.name"
RESOURCE_K8S_POD_UID = "k8s.pod.uid"
RESOURCE_K8S_CONTAINER_NAME = "k8s.container.name"
RESOURCE_K8S_REPLICASET_NAME = "k8s.replicaset.name"
RESOURCE_K8S_DEPLOYMENT_NAME = "k8s.deployment.name"
RESOURCE_K8S_STATEFULSET_NAME = "k8s.statefulset.name"
RESOURCE_K8S_DAEMONSET_NAME = "k8s.daemonset.name"
RESOURCE_K8S_JOB_NAME = "k8s.job.name"
RESOURCE_K8S_CRONJOB_NAME = "k8s.cronjob.name"


# Who served a span, kept by the collector on every stored span (server_spans' `attributes`
# map, by these names; docs/store.md "Kubernetes identity"): the container and, in Kubernetes,
# the pod, its node and workload. Only these: the Resource's other attributes (SDK, process)
# are not stored, and no labels or annotations ever (the agent sends none). A string value
# only; the Resource's value wins over a span attribute of the same name. One list for both
# OTLP decoders (collector/ingest/otlp.py and its compiled twin) and the docs.
RESOURCE_STORED: tuple[str, ...] = (
    RESOURCE_CONTAINER_ID,
    RESOURCE_K8S_NODE_NAME,
    RESOURCE_K8S_NAMESPACE_NAME,
    RESOURCE_K8S_POD_NAME,
    RESOURCE_K8S_POD_UID,
    RESOURCE_K8S_CONTAINER_NAME,
    RESOURCE_K8S_REPLICASET_NAME,
    RESOURCE_K8S_DEPLOYMENT_NAME,
    RESOURCE_K8S_STATEFULSET_NAME,
    RESOURCE_K8S_DAEMONSET_NAME,
    RESOURCE_K8S_JOB_NAME,
    RESOURCE_K8S_CRONJOB_NAME,
)


def _resource(name: str, doc: str, type_: AttrType = "string") -> Attr:
    return Attr(name, type_, "", doc, standard=True)


RESOURCE: tuple[Attr, ...] = (
    _resource(
        RESOURCE_SERVICE_NAME,
        "The process's `OTEL_SERVICE_NAME`, else its executable name; `--service-name"
        " PORT=NAME` wins.",
    ),
    _resource(RESOURCE_PROCESS_PID, "Process id (the host's pid namespace).", "int"),
    _resource(RESOURCE_PROCESS_EXECUTABLE_NAME, "Executable name (`comm`)."),
    _resource(
        RESOURCE_HOST_NAME,
        "In Kubernetes the node's name (`NODE_NAME` from the downward API); elsewhere the"
        " machine's host name.",
    ),
    _resource(
        RESOURCE_CONTAINER_ID,
        "The process's container (64 hex digits, from `/proc/<pid>/cgroup`: containerd,"
        " CRI-O, Docker, Podman); absent outside a container.",
    ),
    _resource(RESOURCE_K8S_NODE_NAME, "Kubernetes only: the node."),
    _resource(
        RESOURCE_K8S_POD_UID,
        "The pod's uid: from the API, else from the cgroup path (also when the API refuses"
        " the agent).",
    ),
    _resource(RESOURCE_K8S_NAMESPACE_NAME, "The pod's namespace (API)."),
    _resource(RESOURCE_K8S_POD_NAME, "The pod's name (API)."),
    _resource(
        RESOURCE_K8S_CONTAINER_NAME,
        "The container's name in the pod spec (API: the status that lists the container"
        " id, or the pod's only container).",
    ),
    _resource(RESOURCE_K8S_REPLICASET_NAME, "The ReplicaSet owning the pod (owner reference)."),
    _resource(
        RESOURCE_K8S_DEPLOYMENT_NAME,
        "The Deployment: the ReplicaSet's name less its `pod-template-hash` label's value.",
    ),
    _resource(RESOURCE_K8S_STATEFULSET_NAME, "Owner reference."),
    _resource(RESOURCE_K8S_DAEMONSET_NAME, "Owner reference."),
    _resource(RESOURCE_K8S_JOB_NAME, "Owner reference."),
    _resource(
        RESOURCE_K8S_CRONJOB_NAME,
        "The Job's name less the CronJob controller's suffix (its scheduled time in Unix"
        " minutes, accepted within the last 400 days).",
    ),
)

assert frozenset(RESOURCE_STORED) <= {a.name for a in RESOURCE}

SOURCE_EBPF = "ebpf"

ALL: tuple[Attr, ...] = (
    HTTP_REQUEST_METHOD,
    URL_PATH,
    HTTP_ROUTE,
    HTTP_RESPONSE_STATUS_CODE,
    SERVER_ADDRESS,
    SERVER_PORT,
    CLIENT_ADDRESS,
    CLIENT_PORT,
    NETWORK_PROTOCOL_VERSION,
    RPC_SYSTEM,
    RPC_SERVICE,
    RPC_METHOD,
    RPC_GRPC_STATUS_CODE,
    TTFB_US,
    RECV_QUEUE_US,
    ACCEPT_QUEUE_US,
    ARRIVAL_UNIX_NS,
    TTFT_US,
    FIRST_CHUNK_US,
    CHUNK_OFFSETS_US,
    CHUNKS,
    CHUNK_GAP_MAX_US,
    DURATION_US,
    BYTES_IN,
    BYTES_OUT,
    SRTT_US,
    RETRANSMITS,
    RETRANSMIT_WAIT_US,
    WS_SEQ,
    PARTIAL,
    CLIENT_ABORTED,
    TRACEPARENT_MISSED,
    SOURCE,
    WIRE_HOLD_WRITES,
    WIRE_HOLD_MAX_US,
    WIRE_HOLD_SUM_US,
    WIRE_HOLD_BYTES,
    WIRE_HOLD_REASON,
    WIRE_HOLD_UNTIMED,
    GPU_PREFILL_LAUNCHES,
    GPU_DECODE_LAUNCHES,
    GPU_PREFILL_WAIT_US,
    GPU_DECODE_WAIT_US,
    GPU_PREFILL_SM_UTIL_PCT,
    GPU_DECODE_SM_UTIL_PCT,
    GPU_SAMPLE_COVERAGE,
    GPU_INFLIGHT_MEAN,
    GPU_UUID,
    *genai.ALL,
)
GPU: tuple[Attr, ...] = tuple(a for a in ALL if a.name.startswith("parallax.gpu."))
WIRE_HOLD: tuple[Attr, ...] = tuple(a for a in ALL if a.name.startswith("parallax.wire_hold."))
BY_NAME: dict[str, Attr] = {a.name: a for a in ALL}
CHUNK_OFFSETS_CAP = 256


def markdown_table(attrs: tuple[Attr, ...] = ALL) -> str:
    rows = ["| Attribute | Type | Unit | Meaning |", "|---|---|---|---|"]
    for a in attrs:
        name = f"`{a.name}`" + (" (semconv)" if a.standard else "")
        rows.append(f"| {name} | {a.type} | {a.unit or '—'} | {a.doc} |")
    return "\n".join(rows) + "\n"


def resource_table() -> str:
    """The Resource attributes' table (docs/contracts/span-attributes.md, "Resource") and
    the line naming those the collector stores on each span."""
    stored = ", ".join(f"`{n}`" for n in RESOURCE_STORED)
    return (
        markdown_table(RESOURCE)
        + "\nStored by the collector on every span, in `server_spans.attributes` (docs/store.md,"
        + f' "Kubernetes identity"): {stored}.\n'
    )


if __name__ == "__main__":
    sys.stdout.write(markdown_table() + "\nResource attributes:\n\n" + resource_table())
