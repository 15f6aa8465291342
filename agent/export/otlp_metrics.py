"""OTLP metrics beside the spans (``--otlp``): the GenAI server latency histograms per route,
fed from the records, and the GPU series (parallax_contracts.agent_metrics), read from the GPU
side when the SDK collects. One MeterProvider, exported every EXPORT_S to ``/v1/metrics``.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from agent.export import genai
from parallax_contracts import agent_metrics as gm
from parallax_contracts import span_attributes as sa

if TYPE_CHECKING:
    from agent.gpu.side import GpuSide

EXPORT_S = 10.0
# The SDK's metric exporter logs each retry of an export to a collector that is down; one
# line per failed export (its ERROR) is enough.
logging.getLogger("opentelemetry.exporter.otlp.proto.http.metric_exporter").setLevel(logging.ERROR)
# services whose per-process GPU series are labelled (beyond: their pid only)
MAX_PROCESS_SERIES = 256


class OtlpMetricsExporter:
    """An Exporter (agent.export.outputs) of records into histograms, and the GPU series'
    callbacks. ``failed`` counts nothing: the SDK's exporter retries and logs."""

    def __init__(
        self,
        base_url: str,
        gpu: GpuSide | None = None,
        export_s: float = EXPORT_S,
        requests: Callable[[], dict[int, tuple[int, int]]] | None = None,
        probability: Callable[[], float] | None = None,
        host: str | None = None,  # in Kubernetes the node's name (agent.identity.resource)
        service_of_port: Callable[[int], str | None] = lambda port: None,
    ) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
            OTLPMetricExporter,
        )
        from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader  # noqa: PLC0415
        from opentelemetry.sdk.metrics.view import (  # noqa: PLC0415
            ExplicitBucketHistogramAggregation,
            View,
        )
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415

        endpoint = base_url.rstrip("/") + "/v1/metrics"
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=endpoint, timeout=5),
            export_interval_millis=export_s * 1000,
        )
        views = [
            View(instrument_name=m.name, aggregation=ExplicitBucketHistogramAggregation(b))
            for m, b in genai.BUCKETS.items()
        ]
        resource = Resource.create({sa.RESOURCE_HOST_NAME: host or socket.gethostname()})
        self._provider = MeterProvider(resource=resource, metric_readers=[reader], views=views)
        meter = self._provider.get_meter("parallax.agent")
        self._genai = {
            m.name: meter.create_histogram(m.name, unit=m.unit, description=m.doc)
            for m in gm.GEN_AI
        }
        self._gpu = gpu
        if gpu is not None and gpu.on:
            self._gpu_instruments(meter)
        self._port_service: dict[int, str] = {}  # named by the records that pass
        self._service_of_port = service_of_port  # ... or by the port's owner (--port)
        if requests is not None and probability is not None:
            self._sampling_instruments(meter, requests, probability)

    @property
    def failed(self) -> int:
        return 0

    def export_batch(self, recs: list[dict[str, Any]]) -> None:
        names = self._port_service
        for rec in recs:
            if rec["local_port"] not in names and len(names) < MAX_PROCESS_SERIES:
                names[rec["local_port"]] = rec["service"]
            for metric, value, attrs in genai.observations(rec):
                self._genai[metric.name].record(value, attrs)

    def _gpu_instruments(self, meter: Any) -> None:
        from opentelemetry.metrics import Observation  # noqa: PLC0415

        gpu = self._gpu
        assert gpu is not None

        def device(field: str, scale: float = 1.0) -> Any:
            def observe(_options: Any) -> Iterable[Observation]:
                nvml = gpu.nvml
                for d in nvml.devices() if nvml is not None else ():
                    v = getattr(d, field)
                    if v is not None:
                        attrs = {gm.HW_ID: d.uuid, gm.HW_NAME: d.name, gm.HW_VENDOR: "NVIDIA"}
                        yield Observation(v * scale, attrs)

            return observe

        gauges = (
            (gm.HW_GPU_UTILIZATION, "util_gpu_pct", 0.01),
            (gm.GPU_SM_CLOCK, "sm_clock_mhz", 1.0),
            (gm.GPU_SM_CLOCK_MAX, "sm_clock_max_mhz", 1.0),
            (gm.GPU_POWER, "power_mw", 0.001),
            (gm.GPU_POWER_LIMIT, "power_limit_mw", 0.001),
            (gm.GPU_CLOCK_EVENT_REASONS, "clock_event_reasons", 1.0),
        )
        for m, field, scale in gauges:
            meter.create_observable_gauge(
                m.name, [device(field, scale)], unit=m.unit, description=m.doc
            )
        for m, field in (
            (gm.HW_GPU_MEMORY_USAGE, "mem_used_bytes"),
            (gm.HW_GPU_MEMORY_LIMIT, "mem_total_bytes"),
        ):
            meter.create_observable_up_down_counter(
                m.name, [device(field)], unit=m.unit, description=m.doc
            )

        def process(totals: str, scale: float | None = None) -> Any:
            """Per-process totals: counts as integers, host wait in seconds."""

            def observe(_options: Any) -> Iterable[Observation]:
                cuda = gpu.cuda
                if cuda is None:
                    return
                per_pid: dict[int, int] = getattr(cuda, totals)
                for pid, n in list(per_pid.items())[:MAX_PROCESS_SERIES]:
                    yield Observation(n if scale is None else n * scale, {gm.PROCESS_PID: pid})

            return observe

        per_process: tuple[tuple[gm.Metric, str, float | None], ...] = (
            (gm.GPU_LAUNCHES, "launches_total", None),
            (gm.GPU_GRAPH_LAUNCHES, "graphs_total", None),
            (gm.GPU_HOST_WAIT, "wait_ns_total", 1e-9),
        )
        for m, totals, unit_scale in per_process:
            meter.create_observable_counter(
                m.name, [process(totals, unit_scale)], unit=m.unit, description=m.doc
            )

    def _sampling_instruments(
        self,
        meter: Any,
        requests: Callable[[], dict[int, tuple[int, int]]],
        probability: Callable[[], float],
    ) -> None:
        from opentelemetry.metrics import Observation  # noqa: PLC0415

        def counts(which: int) -> Any:
            def observe(_options: Any) -> Iterable[Observation]:
                for port, pair in sorted(requests().items()):
                    attrs: dict[str, Any] = {gm.SERVER_PORT: port}
                    name = self._port_service.get(port) or self._service_of_port(port)
                    if name:
                        attrs[gm.SERVICE_NAME] = name
                    yield Observation(pair[which], attrs)

            return observe

        for m, which in ((gm.REQUESTS_SEEN, 0), (gm.REQUESTS_TRACED, 1)):
            meter.create_observable_counter(m.name, [counts(which)], unit=m.unit, description=m.doc)
        meter.create_observable_gauge(
            gm.SAMPLING_PROBABILITY.name,
            [lambda _options: [Observation(probability())]],
            unit=gm.SAMPLING_PROBABILITY.unit,
            description=gm.SAMPLING_PROBABILITY.doc,
        )

    def close(self) -> None:
        self._provider.force_flush(5000)
        self._provider.shutdown()
