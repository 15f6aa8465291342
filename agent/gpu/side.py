"""The GPU side of the agent, wired by agent.run: the NVML poller, the CUDA driver probes
and the map of each traced server to its GPU processes, driven by one thread.

``--gpu auto`` (the default) turns it on where NVML finds a GPU; without one (no library,
no device, NVML failing) the attach line says why in one line and the agent runs without
any GPU part. The CUDA probes are compiled only once a traced server has GPU processes,
and never with ``--gpu-uprobes off``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.gpu import attribution as at
from agent.gpu.cuda import CudaProbes
from agent.gpu.nvml import NvmlPoller, ProcessSample
from agent.gpu.processes import GpuProcesses
from agent.kernel import loader
from agent.metrics import Metrics

if TYPE_CHECKING:
    from agent.gpu.stage import GpuStage

log = logging.getLogger("parallax.agent")


@dataclass
class GpuConfig:
    mode: str = "auto"  # auto | off
    poll_ms: float = 500.0
    uprobes: str = "auto"  # auto | off
    gpu_pids: dict[int, set[int]] = field(default_factory=dict)  # --gpu-pid SERVER=GPU


class GpuSide:
    def __init__(self, cfg: GpuConfig) -> None:
        self.cfg = cfg
        self.nvml: NvmlPoller | None = None
        self.cuda: CudaProbes | None = None
        self.processes = GpuProcesses(cfg.gpu_pids, self._nvml_pids)
        self._thread: threading.Thread | None = None

    @property
    def on(self) -> bool:
        return self.nvml is not None

    def _nvml_pids(self) -> Iterable[int]:
        return self.nvml.gpu_pids().keys() if self.nvml is not None else ()

    def start(self) -> str:
        """Before the main loop: NVML is tried; returns the attach line's GPU part."""
        if self.cfg.mode == "off":
            return "GPU: off (--gpu off)"
        poller = NvmlPoller(self.cfg.poll_ms / 1000)
        line = poller.start()
        if poller.available:
            self.nvml = poller
            if self.cfg.uprobes == "off":
                line += "; CUDA probes off (--gpu-uprobes off)"
            else:
                # Compiled now, on a node with a GPU, like the main program: a second of
                # CPU in the GPU thread later would count against the CPU budget and pause
                # tracing. They attach to each GPU process's libcuda as it is found.
                self._start_cuda()
                if self.cuda is None:
                    line += "; CUDA probes did not compile (NVML only)"
        return line

    def run(self, stop: threading.Event, servers: Callable[[], set[int]]) -> None:
        """Start the thread: every poll period, NVML is read, the servers' GPU processes
        are refreshed, the CUDA probes follow them and their closed buckets are read."""

        def loop() -> None:
            period = self.cfg.poll_ms / 1000
            while not stop.is_set():
                self.tick(servers())
                stop.wait(period)

        if self.nvml is None:
            return
        self._thread = threading.Thread(target=loop, name="gpu", daemon=True)
        self._thread.start()

    def tick(self, servers: set[int], final: bool = False) -> None:
        """One round (the thread's body; tests call it directly). ``final``: stopping, the
        CUDA buckets still open are read too."""
        if self.nvml is not None:
            self.nvml.poll()
        try:
            self.processes.refresh(servers)
            pids = self.processes.all()
            if self.cuda is not None:
                self.cuda.set_pids(pids)
                self.cuda.drain(final)
        except Exception as e:  # noqa: BLE001  (the GPU side must never stop the agent)
            from agent.diagnostics import where  # noqa: PLC0415

            log.warning("GPU round failed: %s at %s", type(e).__name__, where(e))

    def _start_cuda(self) -> None:
        try:
            self.cuda = CudaProbes()
        except loader.LoadError as e:
            log.warning("degraded: %s → no launch counts or host waits", e)

    def covered_to(self, offset_ns: int) -> int:
        """Unix ns up to which every GPU source has been read (a record ending before it
        can be attributed with everything there will be)."""
        t = 1 << 62
        if self.nvml is not None:
            t = min(t, self.nvml.covered_us * 1000)
        if self.cuda is not None:
            t = min(t, self.cuda.drained_to + offset_ns)
        return t

    def sm_view(
        self, pids: Iterable[int], w: at.Window
    ) -> tuple[list[ProcessSample], dict[str, tuple[int, int]]] | None:
        """NVML's view of these processes over ``w``: their samples, and per GPU they use
        the stretch (Unix ns) its samples are complete for. None without NVML."""
        nvml = self.nvml
        if nvml is None:
            return None
        pids = set(pids)
        samples = nvml.process_samples(pids, w.start // 1000, w.end // 1000)
        gpus = {s.uuid for s in samples} | nvml.uuids_of(pids)
        to = nvml.covered_us * 1000
        return samples, {u: (nvml.known_from_us(u) * 1000, to) for u in gpus}

    def uuids_of(self, pids: Iterable[int]) -> set[str]:
        """The GPUs these processes hold memory on (NVML's compute processes)."""
        if self.nvml is None:
            return set()
        return self.nvml.uuids_of(pids)

    def refresh_metrics(
        self, m: Metrics, push: Callable[[str, Any, int], None], stage: GpuStage | None
    ) -> None:
        """/metrics: the device series, the GPU processes' totals, the stage's counts."""
        gpu = self
        if gpu.nvml is not None:
            push("nvml_errors", m.gpu.nvml_errors, gpu.nvml.errors)
            for d in gpu.nvml.devices():
                for name, v in (
                    ("utilization_ratio", None if d.util_gpu_pct is None else d.util_gpu_pct / 100),
                    ("memory_used_bytes", d.mem_used_bytes),
                    ("memory_total_bytes", d.mem_total_bytes),
                    ("sm_clock_mhz", d.sm_clock_mhz),
                    ("sm_clock_max_mhz", d.sm_clock_max_mhz),
                    ("power_watts", None if d.power_mw is None else d.power_mw / 1000),
                    (
                        "power_limit_watts",
                        None if d.power_limit_mw is None else d.power_limit_mw / 1000,
                    ),
                    ("clock_event_reasons", d.clock_event_reasons),
                ):
                    if v is not None:  # absent, not 0
                        m.gpu.device[name].labels(d.uuid).set(v)
        m.gpu.processes.labels("found").set(len(self.processes.all()))
        if gpu.cuda is not None:
            cuda = gpu.cuda
            m.gpu.processes.labels("probed").set(len(cuda.probed()))
            for pid, n in list(cuda.launches_total.items()):
                m.gpu.launches.labels(str(pid)).set(n + cuda.graphs_total.get(pid, 0))
            for pid, ns in list(cuda.wait_ns_total.items()):
                m.gpu.host_wait.labels(str(pid)).set(ns / 1e9)
        if stage is not None:
            push("gpu_records", m.gpu.records, stage.n_attributed)
            push("gpu_hold_expired", m.gpu.hold_expired, stage.n_hold_expired)

    def finish(self, servers: set[int]) -> None:
        """Stopping (the stop event is set): the thread ends, one last round reads what
        the sources hold. Before the records are exported; :meth:`close` may follow them."""
        if self._thread is not None:
            self._thread.join(timeout=5)
            self.tick(servers, final=True)

    def close(self) -> None:
        """The sources closed: the CUDA uprobes (~0.1 s each to close), NVML."""
        if self.cuda is not None:
            self.cuda.close()
        if self.nvml is not None:
            self.nvml.close()
