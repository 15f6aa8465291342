"""``parallax-agent run``: load the probes, follow connections, export one record per request.

The agent is wired from parts, one module each (docs/ARCHITECTURE.md, "Where things live"):
the traced processes (agent.identity.processes), the connection table that cuts events into
records (agent.connections), the export queue and thread (agent.export.outputs,
agent.export.spans), and shedding (agent.shedding). This module starts them, runs the main
loop and stops them.

Threads: the main loop drains the ring buffer on a timer that follows the event rate
(records are submitted without wakeup), cuts events into exchanges and queues records; an
exporter thread writes them out; /metrics answers on its own thread.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from agent import metrics
from agent.budget import default_cores
from agent.connections import MAX_CONNS, Connections
from agent.diagnostics import where
from agent.export import genai, otlp_wire
from agent.export.outputs import Exporter, ExportThread, Processor, RecordQueue
from agent.gpu.side import GpuConfig, GpuSide
from agent.gpu.stage import GpuStage
from agent.identity import resource
from agent.identity.processes import Processes
from agent.identity.resource import ResourceStage
from agent.kernel import loader, perf_close
from agent.kernel.clock import MonoClock
from agent.protocols import http1_head
from agent.shedding import Shedding

log = logging.getLogger("parallax.agent")

# The main loop's drains (Agent._main_loop): each comes when about DRAIN_EVENTS events are
# due, at most IDLE_DRAINS drain periods apart (the idle agent's wait), at least one apart,
# and one apart whenever the ring is more than BUSY_FILL full.
DRAIN_EVENTS = 1024
IDLE_DRAINS = 5
BUSY_FILL = 1 / 16


def next_drain(n: int, dt: float, fill: float | None, period: float) -> float:
    """Seconds to the next drain, after one that took ``n`` events that came in ``dt``
    seconds, the ring ``fill`` full before it; ``period``: the shortest wait (drain_ms).

    A wake-up has a fixed cost, and a drain of a few events pays it per event: at 150
    streams/s the agent cost 108-123 µs a stream draining every 50 ms, 64-68 with this
    (docs/benchmarks.md, "Drains that follow the event rate"). The 8 MiB ring holds ~40k
    events: a burst after the longest wait has the room it has after an idle one."""
    slow = IDLE_DRAINS * period
    if fill is not None and fill > BUSY_FILL:
        return period
    if n <= 0:
        return slow
    return min(slow, max(period, dt * DRAIN_EVENTS / n))


@dataclass
class RunConfig:
    ports: list[int] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    jsonl: str | None = None
    otlp: str | None = None
    metrics_addr: str = "127.0.0.1:9464"
    head_window: int = 4096
    stream_limit_s: float = 60.0
    max_conns: int = loader.Options.max_conns  # the kernel's connection maps (entries)
    service_names: dict[int, str] = field(default_factory=dict)
    drain_ms: float = 50.0  # the ring holds ~40k events; fewer wake-ups per request
    disabled_tracepoints: list[str] = field(default_factory=list)
    queue_size: int = 20000
    offs_span_ns: int = 0  # 0: the loader's default (tests shorten it)
    nice: int = 10
    io_hooks: str = "auto"  # loader.Options.io_hooks
    cpu_budget: float = field(default_factory=default_cores)  # cores; 0 = none
    ringbuf_pages: int = 0  # 0: the loader's default (tests shrink it)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    sample_fixed: float | None = None  # tests: a keep probability held whatever the load
    k8s_api: str | None = None  # tests: the Kubernetes API's URL (agent.identity.resource)
    tls: str = "auto"  # TLS library uprobes (agent.kernel.tls_probes): auto | off
    holdback: str = "auto"  # write-to-wire holdback (agent.kernel.holdback): auto | off


class Agent:
    """The parts wired together: ``run()`` loads the programs, starts the exporter thread
    and /metrics, runs the main loop until SIGTERM/SIGINT and stops everything in order."""

    def __init__(self, cfg: RunConfig, stop: threading.Event | None = None) -> None:
        self.cfg = cfg
        self.m = metrics.Metrics()
        self.clock = MonoClock()
        self.procs = Processes(cfg.ports, cfg.pids, cfg.service_names)
        self.records = RecordQueue(cfg.queue_size)
        self.conns = Connections(
            cfg.head_window,
            self.clock,
            self.records,
            identity=self.procs.identity,
            on_unparsed=lambda lport: self.m.unparsed.labels(self.procs.port_label(lport)).inc(),
            on_traceparent_missed=self.m.traceparent_missed.inc,
            on_tls=self._on_tls,
            on_plain=self._on_plain,
            tcp_now=self._tcp_now,
            # (twice the kernel's maps, never below the default: this bound is for
            # connections whose end went unseen, not a memory limit)
            max_conns=max(MAX_CONNS, 2 * cfg.max_conns),
        )
        self.exporters: list[Exporter] = []
        self.gpu = GpuSide(cfg.gpu)
        self.gpu_stage: GpuStage | None = None
        self.resource: ResourceStage | None = None
        self.export: ExportThread | None = None
        self.shedding: Shedding | None = None
        self.stop = stop if stop is not None else threading.Event()
        self.bpf: Any = None
        self.ring: Any = None
        self._send_start_lazy = False  # loader.attach_send_start once a socket blocks
        self._counts_unfollowed = False  # loader.Loaded.counts_unfollowed
        self._live = False  # the maps may be read for /metrics (loaded, not detached)
        self._pushed: dict[str, int] = {}  # counter values already given to Prometheus
        self._shed_reads = 0
        self._counts: dict[int, tuple[int, int]] = {}
        self._tls_unprobed: set[str] = set()  # comm labels of parallax_agent_tls_unprobed

    # -- start-up ---------------------------------------------------------------------
    def _open_outputs(self) -> str | None:
        """The configured outputs; a one-line reason when one cannot be opened."""
        cfg = self.cfg
        # the OpenTelemetry SDK: only when used
        from agent.export import spans  # noqa: PLC0415

        # the GenAI histograms of /metrics, from the records of LLM streams
        self.exporters.append(genai.PrometheusGenAi(self.m.genai))
        try:
            if cfg.jsonl:
                self.exporters.append(spans.JsonlExporter(cfg.jsonl))
            if cfg.otlp:
                self.exporters.append(spans.OtlpExporter(cfg.otlp))
        except OSError as e:
            return f"cannot write {cfg.jsonl}: {e.strerror}"
        return None

    def run(self) -> int:
        # SIGTERM/SIGINT from here on: the ~1 s compile below must not end in a traceback.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop.set())
        if self.stop.is_set():  # signalled while starting: nothing opened yet
            return 0
        why = self._open_outputs()
        if why is not None:
            print(f"parallax-agent: {why}", file=sys.stderr)
            return 1
        # host, container, pod of each record; in Kubernetes its pod watch starts listing
        # now, during the compile below
        res = self.resource = resource.start(self.cfg.k8s_api)
        srv = self._serve_metrics()
        if srv is None:
            return 1
        loaded = self._load()
        if loaded is None:
            srv.shutdown()
            return 1
        if self.stop.is_set():  # signalled while compiling: detach and leave quietly
            loader.detach(self.bpf)
            srv.shutdown()
            return 0
        gpu_line = self._start_tracing(loaded)
        self._start_export(res)
        # Everything loaded so far (bcc, the OpenTelemetry SDK, compiled tables) lives for
        # the whole run: out of the collector's generations, full collections stay cheap.
        gc.freeze()
        self._live = True
        self.m.before_scrape = self._scrape
        self.m.ready = True
        self._attach_line(loaded, gpu_line)
        return self._run_until_stopped(srv)

    def _serve_metrics(self) -> ThreadingHTTPServer | None:
        """The /metrics server, or None when it cannot listen (said in one line)."""
        addr = self.cfg.metrics_addr
        try:
            return metrics.serve(self.m, addr)
        except (OSError, ValueError) as e:
            why = "expected HOST:PORT" if isinstance(e, ValueError) else str(e)
            print(f"parallax-agent: cannot serve metrics on {addr}: {why}", file=sys.stderr)
            return None

    def _load(self) -> loader.Loaded | None:
        """The kernel programs compiled and attached, or None when they cannot be (said in
        one line)."""
        cfg = self.cfg
        # with only --port, pid filtering follows the owners of those listening ports
        opts = loader.Options(
            ports=cfg.ports,
            pids=self.procs.find(),
            head_window=cfg.head_window,
            stream_limit_s=cfg.stream_limit_s,
            max_conns=cfg.max_conns,
            disabled=cfg.disabled_tracepoints,
            io_hooks=cfg.io_hooks,
            holdback=cfg.holdback,
            **({"ringbuf_pages": cfg.ringbuf_pages} if cfg.ringbuf_pages else {}),
            **({"offs_span_ns": cfg.offs_span_ns} if cfg.offs_span_ns else {}),
        )
        try:
            loaded = loader.load(opts)
        except loader.LoadError as e:
            print(f"parallax-agent: {e}", file=sys.stderr)
            return None
        self.bpf = loaded.bpf
        self._send_start_lazy = loaded.send_start_lazy
        self._counts_unfollowed = loaded.counts_unfollowed
        return loaded

    def _start_tracing(self, loaded: loader.Loaded) -> str:
        """Events flowing: the ring buffer read, the traced processes' probes attached, the
        GPU side and load shedding started. Returns the GPU side's start-up line."""
        cfg = self.cfg
        self.ring = loader.Ring(loaded, self.conns.on_event)
        if cfg.nice:
            # After the compile (start-up stays fast): under CPU contention the traced apps
            # come first; an agent that falls behind loses events (counted; the connections
            # concerned resynchronise) instead of slowing the servers it measures.
            try:
                os.setpriority(os.PRIO_PROCESS, 0, max(-20, min(19, cfg.nice)))
            except OSError as e:
                log.warning("cannot set nice %d: %s", cfg.nice, e)
        self.procs.attach(self.bpf, socket_hooks=loaded.hooks == "socket", tls=cfg.tls)
        gpu_line = self.gpu.start()  # (before the CPU budget starts counting: a compile)
        self.shedding = Shedding(
            self.bpf, cfg.cpu_budget, self.m, self.conns.resync_all, cfg.sample_fixed
        )
        return gpu_line

    def _start_export(self, res: ResourceStage) -> None:
        """The records' way out: the OTLP metrics exporter, the stages a record passes
        (GPU, then resource), the export thread; and the GPU side's sampling."""
        cfg = self.cfg
        if cfg.otlp:  # after the GPU side: its series are registered with the meter
            from agent.export.otlp_metrics import OtlpMetricsExporter  # noqa: PLC0415

            self.exporters.append(
                OtlpMetricsExporter(
                    cfg.otlp,
                    self.gpu,
                    host=res.host,
                    requests=self._request_counts,
                    probability=lambda: self.shedding.p if self.shedding else 1.0,
                    service_of_port=self.procs.service_of_port,
                )
            )
        stages: list[Processor] = []
        if self.gpu.on:
            self.gpu_stage = GpuStage(self.gpu, self.clock, self.conns.open_requests)
            stages.append(self.gpu_stage)
        stages.append(res)  # last: a record held above gets the latest pod
        self.export = ExportThread(self.records, self.exporters, stages)
        self.export.start()
        self.gpu.run(self.stop, lambda: set(self.procs.pids))

    def _run_until_stopped(self, srv: Any) -> int:
        """The main loop until a signal, then the stop; an internal error in either is one
        line and exit 1."""
        assert self.shedding is not None
        error: str | None = None
        stop_error: str | None = None
        self.shedding.sampler.start()  # the start-up's CPU is not the requests'
        try:
            self._main_loop()
        except Exception as e:  # noqa: BLE001  (reported in one line below, not a traceback)
            error = f"{type(e).__name__} at {where(e)}"
        finally:
            # always: what is in flight is flushed and the exporters are closed, whatever
            # stopped the loop
            stop_error = self._stop_run(srv)
        if error is not None or stop_error is not None:
            what = "; ".join(x for x in (error, stop_error) if x is not None)
            print(
                f"parallax-agent: stopped by an internal error ({what}; a bug, please report"
                " it); the records in flight "
                + ("may be lost" if stop_error is not None else "were flushed"),
                file=sys.stderr,
            )
            return 1
        return 0

    def _attach_line(self, loaded: loader.Loaded, gpu: str) -> None:
        cfg = self.cfg
        what = (f"ports {','.join(map(str, cfg.ports))}" if cfg.ports else "all ports") + (
            f", pids {','.join(map(str, cfg.pids))}" if cfg.pids else ""
        )
        deg = "; ".join(loaded.degraded) if loaded.degraded else "none"
        print(
            f"parallax-agent: attached {len(loaded.attached)} tracepoints, {loaded.hooks} hooks"
            f" (degraded: {deg}), tracing {what}, CPU budget "
            + (f"{cfg.cpu_budget:g} cores" if cfg.cpu_budget else "none")
            + (
                f", sampling fixed at {100 * cfg.sample_fixed:g} %"
                if cfg.sample_fixed is not None
                else ", sampling: every request (the share adapts to the budget)"
            )
            + f"; {gpu}; "
            + (self.procs.tls_probes.describe() if self.procs.tls_probes else "TLS: off")
            + f"; {http1_head.PARSER}"
            + (f"; {otlp_wire.ENCODER}" if cfg.otlp else ""),
            file=sys.stderr,
            flush=True,
        )

    def _on_tls(self, pid: int, lport: int) -> None:
        """A TLS connection (the kernel saw a TLS record): its process gets the TLS probes
        now if it has none (agent.kernel.tls_probes: at its first TLS connection); where none can
        go, its requests go unseen — counted per executable and logged once each."""
        tls = self.procs.tls_probes
        if tls is not None and tls.on_tls(pid):
            return
        comm = self.procs.identity(pid, lport)[0]
        label = comm if comm in self._tls_unprobed or len(self._tls_unprobed) < 64 else "other"
        if label not in self._tls_unprobed:
            self._tls_unprobed.add(label)
            why = tls.why if tls is not None and tls.why else "no libssl or OpenSSL symbols found"
            log.warning(
                "pid %d (%s) serves TLS without probes (%s): its requests are not recorded"
                " (parallax_agent_tls_unprobed_total, logged once per executable)",
                pid,
                comm,
                why,
            )
        self.m.tls_unprobed.labels(label).inc()

    def _on_plain(self, pid: int) -> None:
        """A plaintext connection of ``pid``: TLS probes it got before any TLS connection
        (agent.kernel.tls_probes: at start) come off if it serves none."""
        tls = self.procs.tls_probes
        if tls is not None:
            tls.on_plain(pid)

    def _tcp_now(self, sk: int, ident: int) -> tuple[int, int, int] | None:
        """A connection's retransmit counts in the kernel now (agent.connections: a record
        that waited long enough for its own)."""
        if self.bpf is None:
            return None
        return loader.conn_tcp(self.bpf, sk, ident)

    # -- the main loop ----------------------------------------------------------------
    def _main_loop(self) -> None:
        """Until SIGTERM/SIGINT: drain the ring, shed load, rescan, sweep."""
        assert self.shedding is not None and self.export is not None
        conns, shedding, export = self.conns, self.shedding, self.export
        last_slow = 0.0
        period = self.cfg.drain_ms / 1000
        reader = self.ring.reader
        aggs = self.bpf["px_aggs"]
        last = time.monotonic()
        while not self.stop.is_set():
            before = conns.n_events
            fill = reader.backlog() if reader is not None else None
            self.ring.drain()
            shedding.step(fill)
            export.wake()
            now = time.monotonic()
            wait = next_drain(conns.n_events - before, now - last, fill, period)
            last = now
            if now - last_slow >= 1.0:
                last_slow = now
                counters = loader.counters(
                    self.bpf,
                    ("listen_changes", "blocking_conns")
                    if self._send_start_lazy
                    else ("listen_changes",),
                )
                self.procs.rescan(counters)
                self.maybe_time_write_starts(counters)
                self.clock.maybe_remeasure()
            conns.sweep(aggs)
            self.stop.wait(wait)

    def maybe_time_write_starts(self, counters: dict[str, int]) -> None:
        """A traced server writes on a blocking socket (counted in the kernel): such a write
        can wait for buffer space, so from now on its start is stamped (the first ones were
        timed at their end)."""
        paused = self.shedding is not None and self.shedding.detached
        if self._send_start_lazy and counters["blocking_conns"] and not paused:
            # (not while paused: it would run for the rest of the pause; the first check
            # after the resume attaches it)
            self._send_start_lazy = False
            loader.attach_send_start(self.bpf)
            log.info("a traced server writes on blocking sockets: timing write starts")

    def _request_counts(self) -> dict[int, tuple[int, int]]:
        """Per port: every request seen and those traced (the kernel's counts; the last
        ones read while the programs were loaded)."""
        if self._live:
            self._counts = {p: (s.seen, s.kept) for p, s in loader.port_stats(self.bpf).items()}
        return self._counts

    # -- /metrics -----------------------------------------------------------------------
    def _scrape(self) -> None:
        """/metrics asked (metrics.Metrics.refresh, under its lock): the values now."""
        if self._live:
            self.refresh_metrics(loader.counters(self.bpf))

    def _push_counter(self, key: str, counter: Any, value: int) -> None:
        delta = value - self._pushed.get(key, 0)
        if delta > 0:
            counter.inc(delta)
            self._pushed[key] = value

    def refresh_metrics(self, c: dict[str, int]) -> None:
        m, conns, procs, push = self.m, self.conns, self.procs, self._push_counter
        push("events", m.events, conns.n_events)
        push("shed", m.shed, self.records.n_shed)
        push("event_errors", m.event_errors, conns.n_event_errors)
        for svc, n in list(self.records.n_requests.items()):
            push("req:" + svc, m.requests.labels(svc), n)
        m.lost.set(c["lost_events"])
        for name, n in loader.map_fill(c, self.cfg.max_conns).items():
            m.map_fill.labels(name).set(n)
        push("evicted", m.evicted, conns.n_evicted)
        h1, u = conns.stats, m.unrecorded
        for prog, n in loader.missed_runs(self.bpf).items():
            u.bpf_missed_runs.labels(prog).set(n)
        if self._counts_unfollowed:
            u.unfollowed_reads.set(c["unfollowed_reads"])
        push("unanswered", u.unanswered, h1.unanswered)
        push("h1:unmatched", u.http1_unframed.labels("unmatched_response"), h1.unmatched_responses)
        push("h1:desync", u.http1_unframed.labels("desync"), h1.desync)
        push("lost_exchanges", u.lost_exchanges, h1.lost_exchanges)
        for reason, n in list(conns.h2_stats.desync.items()):
            push("h2_desync:" + reason, u.h2_desync.labels(reason), n)
        push("h2_lost_streams", u.h2_lost_streams, conns.h2_stats.lost_streams)
        push("shed_requests", m.shed_requests, c["shed_reads"])
        push("otlp_failed", m.otlp_failed, sum(e.failed for e in self.exporters))
        for label, n in procs.by_port_label(loader.synack_retransmits(self.bpf)).items():
            m.sockets.synack_retransmits.labels(label).set(n)
        m.sockets.listen_overflows.set(metrics.listen_overflows())
        for label, n in procs.listen_drops().items():
            m.sockets.listen_drops.labels(label).set(n)
        m.connections.set(len(conns))
        push("head_too_large", m.head_too_large, conns.stats.head_too_large)
        per_label: dict[str, tuple[int, int, list[int], int]] = {}
        for port, st in loader.port_stats(self.bpf).items():
            label = procs.port_label(port)
            seen, kept, buckets, total = per_label.get(label, (0, 0, [0] * 32, 0))
            buckets = [a + b for a, b in zip(buckets, st.ttfb_us, strict=True)]
            per_label[label] = (seen + st.seen, kept + st.kept, buckets, total + st.ttfb_sum_us)
        m.request_counts.per_label = per_label
        self.gpu.refresh_metrics(m, push, self.gpu_stage)

    # -- stopping -----------------------------------------------------------------------
    def _stop_run(self, srv: Any) -> str | None:
        """The end of run(), however the main loop ended: flush (shutdown), let the exporter
        write the last records, close. Returns what failed in shutdown, if anything."""
        error = None
        with self.m.scrape_lock:  # no /metrics read of the maps from here on
            self._live = False
        # /metrics' server notices a shutdown at its next poll (up to 0.5 s): asked now, it
        # waits beside the flush below instead of after it
        srv_stop = threading.Thread(target=srv.shutdown, name="px-metrics-stop", daemon=True)
        srv_stop.start()
        closing: perf_close.Closing | None = None
        try:
            closing = self.shutdown()
        except Exception as e:  # noqa: BLE001  (the exporters must still be flushed)
            error = f"{type(e).__name__} at {where(e)}, while stopping"
        t_closing = time.monotonic()
        # the GPU data up to the end (the stage then releases what it holds with it)
        self.gpu.finish(set(self.procs.pids))
        if self.export is not None:
            self.export.finish()
        if self.resource is not None:
            self.resource.close()
        srv_stop.join()
        log.info(
            "stopped: %d records; %d in-flight responses flushed as partial; %d requests"
            " never answered (not recorded); %d records shed by the export queue; %d requests"
            " not traced while shedding load",
            sum(self.records.n_requests.values()),
            self.conns.n_final_partial,
            self.conns.stats.unanswered,
            self.records.n_shed,
            self._shed_reads,
        )
        errors = self._close_gpu()
        if closing is not None:
            errors += closing.wait()
            log.info("detached in %.1f s", time.monotonic() - t_closing)
        if errors and error is None:  # an internal error, reported as one
            first = errors[0]
            error = f"{type(first).__name__} at {where(first)}, while detaching"
        return error

    def _close_gpu(self) -> list[Exception]:
        """The GPU side's sources closed (its CUDA uprobes, serialised in the kernel as the
        agent's own are), after the records left; their errors."""
        try:
            self.gpu.close()
        except Exception as e:  # noqa: BLE001  (an internal error: reported by the caller)
            return [e]
        return []

    def shutdown(self) -> perf_close.Closing:
        """SIGTERM/SIGINT: stop tracing new work, take everything the kernel holds, and
        flush what is in flight as partial records before the exporters are flushed.
        Returns the detach under way (step 5), for the caller to wait for once it has
        exported the records.

        1. the filters are emptied (the programs stay attached but every hook exits at its
           first check), so nothing new starts;
        2. a short pause lets programs running on other CPUs finish, then the ring buffer
           is consumed until empty;
        3. body writes still held in the kernel aggregates are read from px_aggs;
        4. each response in progress becomes a partial record (``partial``: true) covering
           what was written so far; requests read but not answered yet are counted
           (``parallax_agent_unanswered_requests_total`` and the exit line), not recorded;
        5. the programs are detached, the TLS probes with them, all closing at once."""
        loader.quiesce(self.bpf, sorted(self.procs.pids))
        time.sleep(0.02)
        for _ in range(1000):
            before = self.conns.n_events
            self.ring.drain()
            if self.conns.n_events == before:
                break
        self.conns.flush_all(self.bpf["px_aggs"])
        self._shed_reads = loader.counters(self.bpf)["shed_reads"]
        # the final counts, for the metrics exported at exit
        self._counts = {p: (s.seen, s.kept) for p, s in loader.port_stats(self.bpf).items()}
        self.ring.close()
        # The TLS probes and the programs' own hooks close at once, each waiting out a
        # grace period (agent.kernel.perf_close): ~0.1 s a uprobe, serialised in the kernel,
        # so seconds on a node with many TLS-serving processes (8 per process). The records
        # are exported meanwhile, not after: a stop past the grace period then loses none.
        return perf_close.in_parallel(
            [self.procs.close, functools.partial(loader.detach, self.bpf)], name="px-detach"
        )


def main(cfg: RunConfig, stop: threading.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT, or until ``stop`` (the caller's, set by its own handlers
    from before the imports) is set."""
    logging.basicConfig(level=logging.INFO, format="parallax-agent: %(message)s", stream=sys.stderr)
    return Agent(cfg, stop).run()
