"""The metrics the agent exports over OTLP beside its spans (``/v1/metrics``): GPU device
series, the GenAI server latency histograms, and every request counted per port, sampled or
not, with the sampling probability in force. One place for names, kinds and units; the
agent's Prometheus ``/metrics`` shows the same series under Prometheus names.

Device series carry ``hw.id`` (the GPU's NVML UUID) and ``hw.name``; OpenTelemetry's
hardware names where they exist (``hw.gpu.*``), ``parallax.gpu.*`` for the rest. The GenAI
histograms (seconds, OpenTelemetry's GenAI semantic conventions) carry ``http.route``,
``server.port`` and ``service.name`` (on the data point: one agent serves every service of
its node), so they sit beside an inference server's own.

``python -m parallax_contracts.agent_metrics`` prints the Markdown table kept in
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
# --- GenAI server latency (per route) ------------------------------------------------
GEN_AI_TTFT = Metric(
    "gen_ai.server.time_to_first_token",
    "histogram",
    "s",
    "Server TTFT per request: the app's read of the request → its first body write.",
    True,
)
GEN_AI_TPOT = Metric(
    "gen_ai.server.time_per_output_token",
    "histogram",
    "s",
    "Server time per output token: (last write − first body write) / (body writes − 1),"
    " one token per write (SSE and chunked streams write one event per token).",
    True,
)
# OpenTelemetry's GenAI conventions' bucket boundaries for these two histograms (seconds).
GEN_AI_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
GEN_AI_TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip

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
GEN_AI: tuple[Metric, ...] = (GEN_AI_TTFT, GEN_AI_TPOT)
SAMPLING: tuple[Metric, ...] = (REQUESTS_SEEN, REQUESTS_TRACED, SAMPLING_PROBABILITY)
ALL: tuple[Metric, ...] = DEVICE + PROCESS + GEN_AI + SAMPLING
BY_NAME: dict[str, Metric] = {m.name: m for m in ALL}


def markdown_table() -> str:
    rows = ["| Metric | Kind | Unit | Meaning |", "|---|---|---|---|"]
    for m in ALL:
        name = f"`{m.name}`" + (" (semconv)" if m.standard else "")
        rows.append(f"| {name} | {m.kind} | {m.unit} | {m.doc} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
