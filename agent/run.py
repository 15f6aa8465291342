"""``parallax-agent run``: load the probes, follow connections, export one record per request.

Threads: the main loop drains the ring buffer on a short timer (records are submitted
without wakeup), cuts events into exchanges and queues records; an exporter thread writes
them out. The queue is bounded: under overload records are shed and counted, never grown.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from agent import events, loader, metrics, procinfo, uprobes
from agent.budget import Shedder, default_cores
from agent.clock import MonoClock
from agent.httpcut import Conn, Exchange, Stats
from agent.records import ConnInfo, build
from agent.sockdiag import ListenerStats

log = logging.getLogger("parallax.agent")
# --port mode: every process's fds are scanned for the listeners when one opens or closes
# (a kernel counter) and at this period as a safety net (an fd passed over a unix socket);
# the traced processes' children, which inherit a listener silently, at the shorter one.
FULL_SCAN_S = 60.0
CHILD_SCAN_S = 5.0
MAX_CONNS = 32768  # user-space connection table (LRU): twice the kernel's px_conns
MAX_PORT_LABELS = 64  # label values of per-port metrics; beyond: "other"
# Map lookups per sweep (every 50 ms), one per open Content-Length response idle for 20 ms:
# a node serving thousands of downloads at once takes several sweeps to go round them.
SWEEP_LOOKUPS = 256
# A cached service name is checked against its pid's start time at most this often: with
# every process traced, a pid reused by another process gets its own name within a second
# (a /proc read per new connection would cost more than the rest of a request's handling).
SVC_CHECK_S = 1.0
# the record layouts of agent.events, bound once for on_event
_HDR = events.HDR.unpack_from
_HDR_SIZE = events.HDR.size
_READ = events.READ_NOADDR.unpack_from
_ADDRS = events.READ_ADDRS.unpack_from
_ADDRS_AT = events.HDR.size + events.READ_NOADDR.size
_READ_DATA = events.READ_DATA
_RESP = events.RESP.unpack_from
_RESP_DATA = events.RESP_DATA
_AGG = events.AGG.unpack_from
_EV_READ, _EV_RESP, _EV_CLOSE = events.EV_READ, events.EV_RESP, events.EV_CLOSE
_EV_PEER_FIN, _EV_SOCK_CLOSE = events.EV_PEER_FIN, events.EV_SOCK_CLOSE


def where(e: BaseException) -> str:
    """Where an exception was raised, as ``file:line in function`` (its innermost frame):
    enough to find the bug, and no data from the request."""
    tb = e.__traceback__
    if tb is None:
        return "unknown place"
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return f"{os.path.basename(code.co_filename)}:{tb.tb_lineno} in {code.co_name}"


@dataclass
class RunConfig:
    ports: list[int] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    jsonl: str | None = None
    otlp: str | None = None
    metrics_addr: str = "127.0.0.1:9464"
    head_window: int = 4096
    stream_limit_s: float = 60.0
    service_names: dict[int, str] = field(default_factory=dict)
    drain_ms: float = 50.0  # the ring holds ~40k events; fewer wake-ups per request
    disabled_tracepoints: list[str] = field(default_factory=list)
    queue_size: int = 20000
    offs_span_ns: int = 0  # 0: the loader's default (tests shorten it)
    nice: int = 10
    io_hooks: str = "auto"  # loader.Options.io_hooks
    cpu_budget: float = field(default_factory=default_cores)  # cores; 0 = none
    ringbuf_pages: int = 0  # 0: the loader's default (tests shrink it)


@dataclass
class ConnState:
    cut: Conn
    pid: int
    lport: int = 0
    rport: int = 0
    laddr: str = ""
    raddr: str = ""
    snap_t_first: int = 0  # an aggregate already consumed from a map snapshot
    unparsed_counted: bool = False
    info: ConnInfo | None = None


class Agent:
    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.m = metrics.Metrics()
        self.clock = MonoClock()
        self.stats = Stats()
        # bounded LRU (most recently active last): a connection whose end we never see
        # (an event lost to a full ring) cannot grow it for ever
        self.conns: OrderedDict[tuple[int, int], ConnState] = OrderedDict()
        self.n_evicted = 0
        self.n_final_partial = 0
        self._open_cl: dict[tuple[int, int], ConnState] = {}
        # a deque (append is atomic, no lock/condition per record) polled by the exporter
        self.q: deque[dict[str, Any]] = deque()
        self.n_events = 0
        self.n_requests: dict[str, int] = {}
        self.n_shed = 0
        self._pushed: dict[str, int] = {}
        self.stop = threading.Event()
        self.drained = threading.Event()
        self._have_records = threading.Event()
        self.exporters: list[Any] = []
        # pid → (comm, service, start time, when checked): see SVC_CHECK_S
        self._svc: dict[int, tuple[str, str, int | None, float]] = {}
        self._pids: set[int] = set(cfg.pids)
        self._pid_start: dict[int, int | None] = {}  # pid → start time (reuse detection)
        self._listen_ports: set[int] = set(cfg.ports)
        self._listen_checked = 0.0
        self._listen_changes = -1
        self._last_full_scan = 0.0
        self._last_child_scan = 0.0
        self._listening: dict[int, int] = {}  # inode → port of the --port listeners
        self.bpf: Any = None
        self._send_start_lazy = False  # loader.attach_send_start once a socket blocks
        self.ring: Any = None
        self.accept_probes: uprobes.AcceptProbes | None = None  # socket hooks only
        self.max_conns = 16384
        self._port_labels: set[str] = set()
        self._listeners = ListenerStats()
        self._shed_warned: set[str] = set()
        self._shed_reads = 0
        self._detached: list[bytes] = []  # hooks taken off for the current pause
        self._reattach_warned = False
        self._head_too_large_pushed = 0  # of stats.head_too_large, in the metric
        self._label_lock = threading.Lock()  # _port_label: main loop and /metrics thread
        self._live = False  # the maps may be read for /metrics (loaded, not detached)
        self.n_event_errors = 0
        self._errors_logged: set[str] = set()  # exception type names already logged

    # -- events ---------------------------------------------------------------------
    def on_event(self, raw: bytes) -> None:
        """One ring-buffer record (the layouts of agent.events), decoded in place: the hot
        path of the agent (two or three calls per request), so no event object is built and
        the fields go straight to the cutter."""
        try:
            self.n_events += 1  # plain ints on the hot path; Prometheus gets them at a scrape
            if len(raw) < _HDR_SIZE:
                return
            typ, tgid, _, _, sk, ident, t, srtt_us, retrans, lost, _ = _HDR(raw)
            if not _EV_READ <= typ <= _EV_SOCK_CLOSE:
                return  # a type this agent does not know
            key = (sk, ident)  # sockets are reused: a connection is (address, first-seen time)
            conns = self.conns
            st = conns.get(key)
            if lost and st is not None:
                st.cut.on_loss()
            if typ >= _EV_CLOSE:
                if st is None:
                    return
                if typ == _EV_PEER_FIN:
                    st.cut.on_peer_fin(t)
                    return
                self._emit(st, st.cut.on_close(t, server_gone=typ == _EV_SOCK_CLOSE))
                del conns[key]
                self._open_cl.pop(key, None)
                return
            if st is None:
                if len(conns) >= MAX_CONNS:
                    old, _ = conns.popitem(last=False)  # the least recently active
                    self._open_cl.pop(old, None)
                    self.n_evicted += 1
                st = conns[key] = ConnState(Conn(self.cfg.head_window, self.stats), tgid)
            else:
                conns.move_to_end(key)
            cut = st.cut
            if srtt_us:  # Conn.update_tcp, inline
                cut.srtt_us = srtt_us
            cut.retrans = retrans
            if typ == _EV_READ:
                t_est, t_acc, t_arr, n, caplen, lport, rport, family, _ = _READ(raw, _HDR_SIZE)
                if not st.lport:
                    st.lport, st.rport = lport, rport
                    la, ra = _ADDRS(raw, _ADDRS_AT)
                    st.laddr, st.raddr = events.addr_text(family, la), events.addr_text(family, ra)
                out = cut.on_read(t, n, raw[_READ_DATA : _READ_DATA + caplen], t_arr, t_acc, t_est)
                if cut.mode == "dead" and not st.unparsed_counted and cut.requests == 0:
                    st.unparsed_counted = True
                    self.m.unparsed.labels(self._port_label(st.lport)).inc()
            elif typ == _EV_RESP:
                n, caplen = _RESP(raw, _HDR_SIZE)
                out = cut.on_resp(t, n, raw[_RESP_DATA : _RESP_DATA + caplen])
            else:
                t_first, t_last, nbytes, gap_max_ns, n, flags = _AGG(raw, _HDR_SIZE)
                if t_first and t_first == st.snap_t_first:
                    return  # already taken from the map snapshot
                times = [t_first + o * 1000 for o in events.offsets(raw, events.OFFS_AT, n)]
                out = cut.on_writes(t_last, times, n, nbytes, gap_max_ns, flags)
            if out:
                self._emit(st, out)
            # the sweep looks only at Content-Length responses still open
            a = cut.active
            if a is not None and a.content_length is not None:
                self._open_cl[key] = st
            elif self._open_cl:
                self._open_cl.pop(key, None)
        except Exception as e:  # noqa: BLE001  (one event must not stop the agent)
            self._event_error(raw, e)

    def _event_error(self, raw: bytes, e: Exception) -> None:
        """An event this agent could not handle (a bug, or input nothing here anticipated):
        counted (parallax_agent_event_errors_total), logged once per exception type, and its
        connection's state dropped, so that its framing resynchronises instead of going on
        from a half-updated cutter."""
        key: tuple[int, int] | None = None
        closing = False
        if len(raw) >= _HDR_SIZE:
            h = _HDR(raw)
            key, closing = (h[4], h[5]), h[0] in (_EV_CLOSE, _EV_SOCK_CLOSE)
        self._conn_error(e, key, closing)

    def _conn_error(self, e: Exception, key: tuple[int, int] | None, closing: bool) -> None:
        self.n_event_errors += 1
        name = type(e).__name__
        if name not in self._errors_logged:
            self._errors_logged.add(name)
            # Privacy: the type and the code's place only, never str(e), which can quote the
            # request's bytes (a header value, a path)
            log.warning(
                "an event could not be handled (%s at %s): its connection resynchronises;"
                " counted in parallax_agent_event_errors_total (logged once per type)",
                name,
                where(e),
            )
        if key is None:
            return
        self._open_cl.pop(key, None)
        st = self.conns.get(key)
        if st is None:
            return
        old = st.cut
        # what it had in flight is lost, as after lost events
        self.stats.lost_exchanges += (
            len(old.pending) + (old.active is not None) + (old.ws_cur is not None)
        )
        if closing:
            del self.conns[key]
            return
        fresh = Conn(self.cfg.head_window, self.stats)
        fresh.mode = "resync"  # from the next read that starts a request
        fresh.requests = old.requests  # not a first request: no accept-queue time
        fresh.srtt_us, fresh.retrans = old.srtt_us, old.retrans
        st.cut = fresh

    def _port_label(self, port: int) -> str:
        """A bounded label set: listening ports (at most MAX_PORT_LABELS), else "other"."""
        with self._label_lock:
            return self._port_label_locked(port)

    def _port_label_locked(self, port: int) -> str:
        if port not in self._listen_ports and time.monotonic() - self._listen_checked > 5:
            self._listen_checked = time.monotonic()
            # a copy: the main loop's rescan may grow the set meanwhile (/metrics thread)
            self._listen_ports |= set(procinfo.listen_counts(tuple(self._pids)))
        if port in self._listen_ports:
            label = str(port)
            if label in self._port_labels or len(self._port_labels) < MAX_PORT_LABELS:
                self._port_labels.add(label)
                return label
        return "other"

    def _info(self, st: ConnState) -> ConnInfo:
        if st.info is None:
            cached = self._svc.get(st.pid)
            now = time.monotonic()
            if cached is None or now - cached[3] >= SVC_CHECK_S:
                start = procinfo.start_time(st.pid)
                if cached is None or cached[2] != start:  # new, or the pid names another process
                    cached = (procinfo.comm(st.pid), procinfo.service_name(st.pid), start, now)
                else:
                    cached = (cached[0], cached[1], start, now)
                if len(self._svc) > 10000:
                    self._svc.clear()
                self._svc[st.pid] = cached
            service = self.cfg.service_names.get(st.lport) or cached[1]
            st.info = ConnInfo(st.pid, cached[0], service, st.laddr, st.lport, st.raddr, st.rport)
        return st.info

    def _emit(self, st: ConnState, out: list[Exchange]) -> None:
        q = self.q
        for ex in out:
            if not ex.t2 and not ex.ws_seq:
                continue
            info = st.info or self._info(st)
            rec = build(ex, info, self.clock)
            if ex.traceparent_missed:
                self.m.traceparent_missed.inc()
            if len(q) >= self.cfg.queue_size:
                self.n_shed += 1  # bounded: shed and count, never grow
                continue
            q.append(rec)
            n_req = self.n_requests
            svc = info.service
            n_req[svc] = n_req.get(svc, 0) + 1

    # -- the snapshot sweep -----------------------------------------------------------
    def sweep(self) -> None:
        """A Content-Length response whose body writes sit in the kernel aggregate (flushed
        only at the next boundary) is finished from a snapshot of the map."""
        if self.bpf is None or not self._open_cl:
            return
        aggs = self.bpf["px_aggs"]
        now = time.monotonic_ns()
        lookups = 0
        for (sk, ident), st in list(self._open_cl.items()):
            a = st.cut.active
            if a is None or a.content_length is None:
                self._open_cl.pop((sk, ident), None)
                continue
            if now - st.cut.t_last_event < 20_000_000:
                continue
            if lookups == SWEEP_LOOKUPS:
                break  # the rest next time: each looked-at response moved to the back
            lookups += 1
            self._open_cl[(sk, ident)] = self._open_cl.pop((sk, ident))
            try:
                v = aggs[aggs.Key(sk)]
            except KeyError:
                continue
            if not v.t_last or v.t_first == st.snap_t_first:
                continue
            if a.body_out + v.bytes < a.content_length:
                continue
            try:
                self._take_snapshot(st, v)
            except Exception as e:  # noqa: BLE001  (as for a ring event: on_event)
                self._conn_error(e, (sk, ident), closing=False)

    def _take_snapshot(self, st: ConnState, v: Any) -> None:
        """Body writes read from a px_aggs entry (the sweep, shutdown), as if their WAGG
        event had come; the event itself, when it comes, is then skipped (snap_t_first)."""
        n = int(v.n)
        times = [v.t_first + v.offs_us[i] * 1000 for i in range(min(n, events.CHUNKS))]
        st.snap_t_first = v.t_first
        self._emit(st, st.cut.on_writes(v.t_last, times, n, v.bytes, v.gap_max_ns, int(v.flags)))

    # -- housekeeping -----------------------------------------------------------------
    def rescan(self, counters: dict[str, int]) -> None:
        """Every second: drop traced pids whose process exited (or whose pid now names
        another process: a reused pid is not traced because its previous owner was), then
        add the new owners of the --port listeners. ``counters``: the kernel's, read once
        per tick."""
        if self.accept_probes is not None:
            self.accept_probes.sweep()
        gone = [p for p, st in self._pid_start.items() if procinfo.start_time(p) != st]
        if gone:
            loader.remove_pids(self.bpf, gone)
            for p in gone:
                self._pids.discard(p)
                del self._pid_start[p]
                self._svc.pop(p, None)
        if not self.cfg.ports and (self.accept_probes is None or self.cfg.pids):
            return
        # The owners of the listeners: a walk of /proc/net/tcp (the kernel walks its whole
        # connection hash for it: milliseconds) and of every process's fds, when a listening
        # socket opened or closed (counted in the kernel) or FULL_SCAN_S passed; in between
        # only the traced processes' children (see FULL_SCAN_S).
        changes = counters["listen_changes"]
        now = time.monotonic()
        if not self.cfg.ports:
            # Every process is traced: a new server's libc gets the accept probe. Only on a
            # listener change (a forked worker maps its parent's libc, already probed).
            if changes != self._listen_changes and self.accept_probes is not None:
                self._listen_changes = changes
                self.accept_probes.add(procinfo.listeners(None))  # one read of the tables
            return
        if changes != self._listen_changes or now - self._last_full_scan >= FULL_SCAN_S:
            self._listen_changes, self._last_full_scan = changes, now
            everyone = procinfo.all_pids()
            self._listening = procinfo.listener_inodes(set(self.cfg.ports), everyone)
            found = set(procinfo.holders(everyone, self._listening))
        elif now - self._last_child_scan >= CHILD_SCAN_S:
            # A worker forked later inherits its parent's listener without any state
            # change: only the traced processes' children need looking at, not every
            # process's fds (tens of milliseconds on a busy node).
            self._last_child_scan = now
            kids = procinfo.children(self._pids) - self._pids
            found = set(procinfo.holders(kids, self._listening))
        else:
            return
        # Workers handed their connections by a traced process hold no listener: its
        # children on the same executable are traced too (the kernel still follows only
        # connections accepted on the --port listeners, whoever reads them).
        found |= procinfo.worker_children(self._pids | found)
        new = found - self._pids
        if new and self.accept_probes is not None:
            self.accept_probes.add(new)
        if new:
            self._track(new)
            loader.set_pids(self.bpf, sorted(new))
            self._pids |= new
            self._seed(new)

    def _track(self, pids: set[int]) -> None:
        for p in pids:
            self._pid_start[p] = procinfo.start_time(p)

    def _seed(self, pids: set[int]) -> None:
        ports = set(self.cfg.ports) or None
        for pid, fd, e in procinfo.established(pids, ports):
            loader.seed_fd(self.bpf, pid, fd, e.lport, e.family, e.laddr, e.raddr, e.rport)

    def _push_counter(self, key: str, counter: Any, value: int) -> None:
        delta = value - self._pushed.get(key, 0)
        if delta > 0:
            counter.inc(delta)
            self._pushed[key] = value

    def maybe_time_write_starts(self, counters: dict[str, int]) -> None:
        """A traced server writes on a blocking socket (counted in the kernel): such a write
        can wait for buffer space, so from now on its start is stamped (the first ones were
        timed at their end)."""
        if self._send_start_lazy and counters["blocking_conns"] and not self._detached:
            # (not while paused: it would run for the rest of the pause; the first check
            # after the resume attaches it)
            self._send_start_lazy = False
            loader.attach_send_start(self.bpf)
            log.info("a traced server writes on blocking sockets: timing write starts")

    def _scrape(self) -> None:
        """/metrics asked (metrics.Metrics.refresh, under its lock): the values now."""
        if self._live:
            self.refresh_metrics(loader.counters(self.bpf))

    def refresh_metrics(self, c: dict[str, int]) -> None:
        self._push_counter("events", self.m.events, self.n_events)
        self._push_counter("shed", self.m.shed, self.n_shed)
        self._push_counter("event_errors", self.m.event_errors, self.n_event_errors)
        for svc, n in list(self.n_requests.items()):
            self._push_counter("req:" + svc, self.m.requests.labels(svc), n)
        self.m.lost.set(c["lost_events"])
        for name, n in loader.map_fill(c, self.max_conns).items():
            self.m.map_fill.labels(name).set(n)
        self._push_counter("evicted", self.m.evicted, self.n_evicted)
        self._push_counter("unanswered", self.m.unanswered, self.stats.unanswered)
        self._push_counter("lost_exchanges", self.m.lost_exchanges, self.stats.lost_exchanges)
        self._push_counter("shed_requests", self.m.shed_requests, c["shed_reads"])
        failed = sum(getattr(e, "failed_spans", 0) for e in self.exporters)  # OTLP only
        self._push_counter("otlp_failed", self.m.otlp_failed, failed)
        for label, n in self._by_port_label(loader.synack_retransmits(self.bpf)).items():
            self.m.synack_retransmits.labels(label).set(n)
        self.m.listen_overflows.set(metrics.listen_overflows())
        self._listen_drops()
        self.m.connections.set(len(self.conns))
        # one read of the live counter: what the main loop adds meanwhile counts next time
        head_too_large = self.stats.head_too_large
        d = head_too_large - self._head_too_large_pushed
        if d:
            self.m.head_too_large.inc(d)
        self._head_too_large_pushed = head_too_large

    def _by_port_label(self, per_port: dict[int, int]) -> dict[str, int]:
        """Per-port counts under the bounded port labels (_port_label): ports beyond the
        label budget are summed under "other"."""
        out: dict[str, int] = {}
        for port, n in per_port.items():
            label = self._port_label(port)
            out[label] = out.get(label, 0) + n
        return out

    def _listen_drops(self) -> None:
        """Accept-queue drops per listening port: the agent's network namespace and those of
        the traced processes (a pod has its own); --port limits the ports."""
        drops: dict[str, int] = {}
        for ls in self._listeners.read(sorted(self._pids)):
            if ls.port and self.cfg.ports and ls.port not in self.cfg.ports:
                continue
            self._listen_ports.add(ls.port)
            label = self._port_label(ls.port) if ls.port else "0"
            drops[label] = drops.get(label, 0) + ls.drops
        for label, n in drops.items():
            self.m.listen_drops.labels(label).set(n)

    def exporter_loop(self) -> None:
        # Woken by the main loop when it queued records, then at most every 20 ms (batches):
        # an idle agent does not poll.
        while True:
            self._have_records.wait(1.0)
            self._have_records.clear()
            stopping = self.stop.is_set() and self.drained.is_set()
            q = self.q
            while q:
                batch = [q.popleft() for _ in range(min(len(q), 1024))]
                for e in self.exporters:
                    try:
                        e.export_batch(batch)
                    except Exception as exc:  # noqa: BLE001  (one bad export must not stop us)
                        # the type and place, not the message: it may quote a record
                        log.warning("export failed: %s at %s", type(exc).__name__, where(exc))
            if stopping:
                return
            time.sleep(0.05)  # batches: at most 20 wake-ups a second

    def run(self) -> int:
        cfg = self.cfg
        from agent import export  # noqa: PLC0415

        # SIGTERM/SIGINT from here on: the ~1 s compile below must not end in a traceback.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop.set())
        try:
            if cfg.jsonl:
                self.exporters.append(export.JsonlExporter(cfg.jsonl))
            if cfg.otlp:
                self.exporters.append(export.OtlpExporter(cfg.otlp))
        except OSError as e:
            print(f"parallax-agent: cannot write {cfg.jsonl}: {e.strerror}", file=sys.stderr)
            return 1
        try:
            srv = metrics.serve(self.m, cfg.metrics_addr)
        except (OSError, ValueError) as e:
            why = "expected HOST:PORT" if isinstance(e, ValueError) else str(e)
            print(
                f"parallax-agent: cannot serve metrics on {cfg.metrics_addr}: {why}",
                file=sys.stderr,
            )
            return 1
        if cfg.ports:
            self._pids |= set(procinfo.listeners(set(cfg.ports)))
        self._track(self._pids)
        opts = loader.Options(
            ports=cfg.ports,
            pids=sorted(self._pids),
            head_window=cfg.head_window,
            stream_limit_s=cfg.stream_limit_s,
            disabled=cfg.disabled_tracepoints,
            io_hooks=cfg.io_hooks,
            **({"ringbuf_pages": cfg.ringbuf_pages} if cfg.ringbuf_pages else {}),
            **({"offs_span_ns": cfg.offs_span_ns} if cfg.offs_span_ns else {}),
        )
        # with only --port, pid filtering follows the owners of those listening ports
        try:
            loaded = loader.load(opts)
        except loader.LoadError as e:
            print(f"parallax-agent: {e}", file=sys.stderr)
            srv.shutdown()
            return 1
        self.bpf = loaded.bpf
        self._send_start_lazy = loaded.send_start_lazy
        if self.stop.is_set():  # signalled while compiling: detach and leave quietly
            loader.detach(self.bpf)
            srv.shutdown()
            return 0
        self.ring = loader.Ring(loaded, self.on_event)
        if cfg.nice:
            # After the compile (start-up stays fast): under CPU contention the traced apps
            # come first; an agent that falls behind loses events (counted; the connections
            # concerned resynchronise) instead of slowing the servers it measures.
            try:
                os.setpriority(os.PRIO_PROCESS, 0, max(-20, min(19, cfg.nice)))
            except OSError as e:
                log.warning("cannot set nice %d: %s", cfg.nice, e)
        # the kernel counts listeners per port over every namespace: seeded the same way
        listen = procinfo.listen_counts(procinfo.all_pids())
        loader.seed_listen(self.bpf, listen)
        # with every process traced, the servers are the owners of listening sockets
        servers = self._pids or set(procinfo.listeners(set(listen)))
        if loaded.hooks == "socket":
            self.accept_probes = uprobes.AcceptProbes(self.bpf)
            self.accept_probes.add(servers)
        # connections older than the agent: followed from their next read or write
        self._seed(servers)
        t = threading.Thread(target=self.exporter_loop, name="export", daemon=True)
        t.start()
        # Everything loaded so far (bcc, the OpenTelemetry SDK, compiled tables) lives for
        # the whole run: out of the collector's generations, full collections stay cheap.
        gc.freeze()
        self._live = True
        self.m.before_scrape = self._scrape
        self.m.ready = True
        what = (f"ports {','.join(map(str, cfg.ports))}" if cfg.ports else "all ports") + (
            f", pids {','.join(map(str, cfg.pids))}" if cfg.pids else ""
        )
        deg = "; ".join(loaded.degraded) if loaded.degraded else "none"
        print(
            f"parallax-agent: attached {len(loaded.attached)} tracepoints, {loaded.hooks} hooks"
            f" (degraded: {deg}), tracing {what}, CPU budget "
            + (f"{cfg.cpu_budget:g} cores" if cfg.cpu_budget else "none"),
            file=sys.stderr,
            flush=True,
        )
        error: str | None = None
        stop_error: str | None = None
        try:
            self._main_loop()
        except Exception as e:  # noqa: BLE001  (reported in one line below, not a traceback)
            error = f"{type(e).__name__} at {where(e)}"
        finally:
            # always: what is in flight is flushed and the exporters are closed, whatever
            # stopped the loop
            stop_error = self._stop_run(t, srv)
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

    def _main_loop(self) -> None:
        """Until SIGTERM/SIGINT: drain the ring, shed load, rescan, sweep."""
        cfg = self.cfg
        last_slow = 0.0
        period = cfg.drain_ms / 1000
        idle = 0
        shedder = Shedder(cfg.cpu_budget)
        reader = self.ring.reader
        while not self.stop.is_set():
            before = self.n_events
            fill = reader.backlog() if reader is not None else None
            self.ring.drain()
            full = not shedder.paused and loader.paused_by_kernel(self.bpf)
            self._apply_shedding(shedder, shedder.step(fill, full))
            if self.q:
                self._have_records.set()
            # Idle (no event in the last 5 drains, no response waiting for the sweep):
            # drain five times less often — fewer wake-ups; the 8 MiB ring holds far more
            # than that of a burst.
            idle = idle + 1 if self.n_events == before and not self._open_cl else 0
            now = time.monotonic()
            if now - last_slow >= 1.0:
                last_slow = now
                counters = loader.counters(
                    self.bpf,
                    ("listen_changes", "blocking_conns")
                    if self._send_start_lazy
                    else ("listen_changes",),
                )
                self.rescan(counters)
                self.maybe_time_write_starts(counters)
                self.clock.maybe_remeasure()
            self.sweep()
            self.stop.wait(period if idle < 5 else 5 * period)

    def _stop_run(self, exporter: threading.Thread, srv: Any) -> str | None:
        """The end of run(), however the main loop ended: flush (shutdown), let the exporter
        write the last records, close. Returns what failed in shutdown, if anything."""
        error = None
        with self.m.scrape_lock:  # no /metrics read of the maps from here on
            self._live = False
        try:
            self.shutdown()
        except Exception as e:  # noqa: BLE001  (the exporters must still be flushed)
            error = f"{type(e).__name__} at {where(e)}, while stopping"
        self.drained.set()
        self._have_records.set()
        exporter.join(timeout=10)
        for exp in self.exporters:
            exp.close()
        srv.shutdown()
        log.info(
            "stopped: %d records; %d in-flight responses flushed as partial; %d requests"
            " never answered (not recorded); %d records shed by the export queue; %d requests"
            " not traced while shedding load",
            sum(self.n_requests.values()),
            self.n_final_partial,
            self.stats.unanswered,
            self.n_shed,
            self._shed_reads,
        )
        return error

    def _apply_shedding(self, shedder: Shedder, change: bool | None) -> None:
        if change is None:
            return
        if not change and self._detached:
            # the hooks taken off for the pause go back before the programs trace again
            try:
                loader.reattach(self.bpf, self._detached)
            except Exception as e:  # noqa: BLE001  (bcc raises bare Exception)
                if not self._reattach_warned:
                    self._reattach_warned = True
                    log.warning("could not attach hooks again after a pause (%s): still paused", e)
                shedder.hold()
                return
            self._detached = []
        loader.set_paused(self.bpf, change)
        if change:
            # Paused, these programs return at once, yet every TCP write and arrival on the
            # node still runs them (docs/agent.md, Overload).
            self._detached = loader.detach_idle(self.bpf)
        self.m.paused.set(1 if change else 0)
        if change:
            self.m.pauses.labels(shedder.reason).inc()
            if shedder.reason not in self._shed_warned:
                self._shed_warned.add(shedder.reason)
                why = {
                    "cpu_budget": f"over the CPU budget ({self.cfg.cpu_budget:g} cores)",
                    "behind": "the ring buffer is filling faster than it is drained",
                    "ring_full": "the ring buffer was full (the kernel paused itself)",
                }[shedder.reason]
                log.warning(
                    "%s: tracing paused for a while; requests meanwhile are counted in"
                    " parallax_agent_shed_requests_total",
                    why,
                )
            return
        # What the kernel skipped while paused cannot be framed: every connection
        # resynchronises at its next request (what it had in flight is counted as lost).
        for st in self.conns.values():
            st.cut.on_loss()

    def _flush_conn(self, aggs: Any, sk: int, st: ConnState) -> None:
        """Stopping: one connection's body writes still in the kernel aggregate, then what
        it has in flight as partial records."""
        if st.cut.active is not None or st.cut.ws_cur is not None:
            try:
                v = aggs[aggs.Key(sk)]
            except KeyError:
                v = None
            if v is not None and v.t_last and v.t_first != st.snap_t_first:
                self._take_snapshot(st, v)
        out = st.cut.flush_inflight()
        self.n_final_partial += len(out)
        self._emit(st, out)

    def shutdown(self) -> None:
        """SIGTERM/SIGINT: stop tracing new work, take everything the kernel holds, and
        flush what is in flight as partial records before the exporters are flushed.

        1. the filters are emptied (the programs stay attached but every hook exits at its
           first check), so nothing new starts;
        2. a short pause lets programs running on other CPUs finish, then the ring buffer
           is consumed until empty;
        3. body writes still held in the kernel aggregates are read from px_aggs;
        4. each response in progress becomes a partial record (``partial``: true) covering
           what was written so far; requests read but not answered yet are counted
           (``parallax_agent_unanswered_requests_total`` and the exit line), not recorded;
        5. the programs are detached."""
        loader.quiesce(self.bpf, sorted(self._pids))
        time.sleep(0.02)
        for _ in range(1000):
            before = self.n_events
            self.ring.drain()
            if self.n_events == before:
                break
        aggs = self.bpf["px_aggs"]
        for key, st in list(self.conns.items()):
            try:
                self._flush_conn(aggs, key[0], st)
            except Exception as e:  # noqa: BLE001  (the other connections are still flushed)
                self._conn_error(e, key, closing=True)
        self.conns.clear()
        self._shed_reads = loader.counters(self.bpf)["shed_reads"]
        self.ring.close()
        self._listeners.close()
        loader.detach(self.bpf)


def main(cfg: RunConfig) -> int:
    logging.basicConfig(level=logging.INFO, format="parallax-agent: %(message)s", stream=sys.stderr)
    return Agent(cfg).run()
