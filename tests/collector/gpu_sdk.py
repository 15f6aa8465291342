"""GPU metrics as the agent exports them, made with the real OpenTelemetry SDK (MeterProvider,
observable instruments, the OTLP/HTTP protobuf exporter) from a scripted state: the device
series per GPU, the per-process series per pid, the GenAI histograms, and one metric the
contract does not name."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from parallax_contracts import agent_metrics as gm

HOST = "node-7"
GPU_A = "GPU-8f2c0b1e-5a4d-4c3b-9a2f-0e1d2c3b4a59"
GPU_B = "GPU-1b2c3d4e-0000-4c3b-9a2f-0e1d2c3b4a5a"
PID = 4242


@dataclass
class GpuState:
    """What the scripted GPUs and the process report at the next export."""

    device: dict[str, dict[str, float]] = field(default_factory=dict)  # hw.id → metric → value
    process: dict[str, float] = field(default_factory=dict)  # per-process metric → value


def sample_state(step: int) -> GpuState:
    """Two GPUs with distinct values per metric, and one GPU process; ``step`` moves them."""
    dev = {
        hw: {
            gm.HW_GPU_UTILIZATION.name: 0.5 + 0.1 * i + 0.01 * step,
            gm.HW_GPU_MEMORY_USAGE.name: float((40 + i) * 2**30 + step),
            gm.HW_GPU_MEMORY_LIMIT.name: float(141 * 2**30),
            gm.GPU_SM_CLOCK.name: 1980.0 - 900 * i - step,
            gm.GPU_SM_CLOCK_MAX.name: 1980.0,
            gm.GPU_POWER.name: 600.0 + i + step,
            gm.GPU_POWER_LIMIT.name: 700.0,
            gm.GPU_CLOCK_EVENT_REASONS.name: float(0x4 if i else 0),
        }
        for i, hw in enumerate((GPU_A, GPU_B))
    }
    proc = {
        gm.GPU_LAUNCHES.name: float(1000 * (step + 1)),
        gm.GPU_GRAPH_LAUNCHES.name: float(10 * (step + 1)),
        gm.GPU_HOST_WAIT.name: 0.25 * (step + 1),
    }
    return GpuState(dev, proc)


Callback = Callable[[CallbackOptions], Iterable[Observation]]


class SdkExporter:
    """A MeterProvider whose instruments read ``state``; ``export()`` sends one OTLP request
    (to ``endpoint``), or with no endpoint collects into memory (``body()`` encodes it)."""

    def __init__(self, endpoint: str | None, headers: dict[str, str] | None = None) -> None:
        self.state = GpuState()
        self.reader: MetricReader
        if endpoint is None:
            self.reader = InMemoryMetricReader()
        else:
            exporter = OTLPMetricExporter(
                endpoint=endpoint, headers=headers, compression=Compression.Gzip, timeout=10
            )
            # Exports only when asked (force_flush), as the agent does every 10 s and at exit.
            self.reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
        res = Resource.create({"service.name": "parallax-agent", "host.name": HOST})
        self.provider = MeterProvider(resource=res, metric_readers=[self.reader])
        meter = self.provider.get_meter("parallax.agent.gpu")
        for m in gm.DEVICE:
            make = (
                meter.create_observable_up_down_counter
                if m.kind == "updowncounter"
                else meter.create_observable_gauge
            )
            make(m.name, callbacks=[self._device(m.name)], unit=m.unit)
        for m in gm.PROCESS:
            meter.create_observable_counter(m.name, callbacks=[self._process(m.name)], unit=m.unit)
        self.ttft = meter.create_histogram(
            gm.GEN_AI_TTFT.name,
            unit="s",
            explicit_bucket_boundaries_advisory=gm.GEN_AI_TTFT_BUCKETS,
        )
        self.other = meter.create_counter("app.requests")

    def _device(self, name: str) -> Callback:
        def cb(_: CallbackOptions) -> Iterable[Observation]:
            for hw, values in self.state.device.items():
                attrs = {gm.HW_ID: hw, gm.HW_NAME: "NVIDIA H200", gm.HW_VENDOR: "NVIDIA"}
                yield Observation(values[name], attrs)

        return cb

    def _process(self, name: str) -> Callback:
        def cb(_: CallbackOptions) -> Iterable[Observation]:
            if name in self.state.process:
                attrs: dict[str, str | int] = {gm.PROCESS_PID: PID, gm.SERVICE_NAME: "llm"}
                yield Observation(self.state.process[name], attrs)

        return cb

    def export(self, state: GpuState, ttfts: Iterable[float] = (), others: int = 0) -> None:
        self.state = state
        for v in ttfts:
            self.ttft.record(v, {"http.route": "/v1/chat", "server.port": 8000})
        if others:
            self.other.add(others)
        assert self.provider.force_flush(10_000)

    def body(self, state: GpuState) -> bytes:
        """One collection of ``state`` as the exporter's protobuf body (in-memory reader)."""
        assert isinstance(self.reader, InMemoryMetricReader)
        self.state = state
        data = self.reader.get_metrics_data()
        assert data is not None
        out: bytes = encode_metrics(data).SerializeToString()
        return out

    def close(self) -> None:
        self.provider.shutdown()


@contextmanager
def sdk_exporter(endpoint: str, headers: dict[str, str] | None = None) -> Iterator[SdkExporter]:
    e = SdkExporter(endpoint, headers)
    try:
        yield e
    finally:
        e.close()


def points_per_export(state: GpuState) -> int:
    return sum(len(v) for v in state.device.values()) + len(state.process)
