"""The connection table: ring-buffer events → HTTP exchanges → records, per connection.

Every event of a followed connection lands here (``on_event``, the agent's hot path); each
connection has its cutter (agent.protocols.http1.Conn), and each finished exchange becomes a record
(agent.records.build) handed to the export queue. The table is a bounded LRU: a connection
whose end is never seen (an event lost to a full ring) cannot grow it for ever.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.diagnostics import where
from agent.export.outputs import RecordQueue
from agent.kernel import events
from agent.kernel.clock import MonoClock
from agent.protocols.http1 import Conn, Exchange, Stats
from agent.protocols.http2 import H2Conn, H2Stats
from agent.records import ConnInfo, build

log = logging.getLogger("parallax.agent")
MAX_CONNS = 32768  # user-space connection table (LRU): twice the kernel's px_conns
# Map lookups per sweep (every 50 ms), one per open Content-Length response idle for 20 ms:
# a node serving thousands of downloads at once takes several sweeps to go round them.
SWEEP_LOOKUPS = 256
SWEEP_IDLE_NS = 20_000_000
# the record layouts of agent.kernel.events, bound once for on_event
_HDR = events.HDR.unpack_from
_HDR_SIZE = events.HDR.size
_READ = events.READ_NOADDR.unpack_from
_ADDRS = events.READ_ADDRS.unpack_from
_ADDRS_AT = events.HDR.size + events.READ_NOADDR.size
_READ_DATA = events.READ_DATA
_RESP = events.RESP.unpack_from
_RESP_DATA = events.RESP_DATA
_AGG = events.AGG.unpack_from
_TLS = events.TLS.unpack_from
_EV_READ, _EV_RESP, _EV_CLOSE = events.EV_READ, events.EV_RESP, events.EV_CLOSE
_EV_PEER_FIN, _EV_SOCK_CLOSE = events.EV_PEER_FIN, events.EV_SOCK_CLOSE
_EV_TLS = events.EV_TLS
_EV_H2 = events.EV_H2
_H2_WALK = events.H2_WALK.unpack_from
_H2_HDRS_AT = events.READ_DATA + events.H2_WALK.size
_H2_DATA = events.H2_DATA

Key = tuple[int, int]  # (socket address, first-seen time): sockets are reused


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
    tls: bool = False  # its bytes are TLS records: the plaintext comes from the SSL uprobes
    h2: H2Conn | None = None  # it began with HTTP/2's client preface (agent/protocols/http2.py)


class Connections:
    """The followed connections and their cutters. ``identity(pid, lport)`` gives (comm,
    service) for a record; ``on_unparsed(lport)`` counts a connection that is not HTTP/1.x;
    ``on_tls(pid, lport)`` is told of each TLS connection; ``out`` takes the records."""

    def __init__(
        self,
        head_window: int,
        clock: MonoClock,
        out: RecordQueue,
        identity: Callable[[int, int], tuple[str, str]],
        on_unparsed: Callable[[int], None],
        on_traceparent_missed: Callable[[], None],
        on_tls: Callable[[int, int], None] = lambda pid, lport: None,
    ) -> None:
        self.head_window = head_window
        self.clock = clock
        self.out = out
        self.stats = Stats()
        self.h2_stats = H2Stats()
        self._identity = identity
        self._on_unparsed = on_unparsed
        self._on_traceparent_missed = on_traceparent_missed
        self._on_tls = on_tls
        self.conns: OrderedDict[Key, ConnState] = OrderedDict()
        self._open_cl: dict[Key, ConnState] = {}  # Content-Length responses still open
        self.n_events = 0
        self.n_evicted = 0
        self.n_final_partial = 0
        self.n_event_errors = 0
        self._errors_logged: set[str] = set()  # exception type names already logged

    def __len__(self) -> int:
        return len(self.conns)

    @property
    def waiting(self) -> bool:
        """Responses wait for the sweep (the main loop keeps draining at full rate)."""
        return bool(self._open_cl)

    # -- events ---------------------------------------------------------------------
    def on_event(self, raw: bytes) -> None:
        """One ring-buffer record (the layouts of agent.kernel.events), decoded in place: the hot
        path of the agent (two or three calls per request), so no event object is built and
        the fields go straight to the cutter."""
        try:
            self.n_events += 1  # plain ints on the hot path; Prometheus gets them at a scrape
            if len(raw) < _HDR_SIZE:
                return
            typ, tgid, _, _, sk, ident, t, srtt_us, retrans, lost, sample_th = _HDR(raw)
            if not _EV_READ <= typ <= _EV_H2:
                return  # a type this agent does not know
            key = (sk, ident)
            conns = self.conns
            st = conns.get(key)
            if lost and st is not None:
                st.cut.on_loss()
                if st.h2 is not None:
                    st.h2.on_loss()
            if _EV_CLOSE <= typ <= _EV_SOCK_CLOSE:
                if st is None:
                    return
                if typ == _EV_PEER_FIN:
                    st.cut.on_peer_fin(t)
                    if st.h2 is not None:
                        st.h2.on_peer_fin()
                    return
                self.emit(st, st.cut.on_close(t, server_gone=typ == _EV_SOCK_CLOSE))
                if st.h2 is not None:
                    self.emit(st, st.h2.on_close(server_gone=typ == _EV_SOCK_CLOSE))
                elif st.tls and st.cut.requests == 0 and not st.unparsed_counted:
                    self._on_unparsed(st.lport)  # TLS whose plaintext never showed a request
                del conns[key]
                self._open_cl.pop(key, None)
                return
            if st is None:
                if len(conns) >= MAX_CONNS:
                    old, _ = conns.popitem(last=False)  # the least recently active
                    self._open_cl.pop(old, None)
                    self.n_evicted += 1
                st = conns[key] = ConnState(Conn(self.head_window, self.stats), tgid)
            else:
                conns.move_to_end(key)
            if typ == _EV_TLS:  # once per connection, before its first plaintext
                st.tls = True
                st.pid = tgid
                st.lport = st.lport or _TLS(raw, _HDR_SIZE)[0]
                self._on_tls(tgid, st.lport)
                return
            if typ == _EV_H2:
                self._h2_event(st, raw, t, srtt_us, retrans)
                return
            cut = st.cut
            if srtt_us:  # Conn.update_tcp, inline
                cut.srtt_us = srtt_us
            cut.retrans = retrans
            if typ == _EV_READ:
                t_est, t_acc, t_arr, n, caplen, lport, rport, family, skipped = _READ(
                    raw, _HDR_SIZE
                )
                if skipped:  # requests the kernel did not sample: not the first one now
                    cut.requests += skipped
                cut.sample_th = sample_th
                if not st.laddr:  # (EV_TLS may have set the port alone)
                    st.lport, st.rport = lport, rport
                    la, ra = _ADDRS(raw, _ADDRS_AT)
                    st.laddr, st.raddr = events.addr_text(family, la), events.addr_text(family, ra)
                out = cut.on_read(t, n, raw[_READ_DATA : _READ_DATA + caplen], t_arr, t_acc, t_est)
                if cut.mode == "dead" and not st.unparsed_counted and cut.requests == 0:
                    st.unparsed_counted = True
                    self._on_unparsed(st.lport)
            elif typ == _EV_RESP:
                n, caplen = _RESP(raw, _HDR_SIZE)
                out = cut.on_resp(t, n, raw[_RESP_DATA : _RESP_DATA + caplen])
            else:
                t_first, t_last, nbytes, gap_max_ns, n, flags = _AGG(raw, _HDR_SIZE)
                if t_first and t_first == st.snap_t_first:
                    return  # already taken from the map snapshot
                times = [t_first + o * 1000 for o in events.offsets(raw, events.OFFS_AT, n)]
                hold = events.hold_at(raw)
                out = cut.on_writes(t_last, times, n, nbytes, gap_max_ns, flags, hold)
            if out:
                self.emit(st, out)
            # the sweep looks only at Content-Length responses still open
            a = cut.active
            if a is not None and a.content_length is not None:
                self._open_cl[key] = st
            elif self._open_cl:
                self._open_cl.pop(key, None)
        except Exception as e:  # noqa: BLE001  (one event must not stop the agent)
            self._event_error(raw, e)

    def _h2_event(self, st: ConnState, raw: bytes, t: int, srtt_us: int, retrans: int) -> None:
        """A read (dir 0) or write (dir 1) of an HTTP/2 connection: the layout of READ, its
        ``skipped`` field carrying the direction."""
        t_est, t_acc, t_arr, n, caplen, lport, rport, family, direction = _READ(raw, _HDR_SIZE)
        h2 = st.h2
        if h2 is None:
            h2 = st.h2 = H2Conn(self.h2_stats)
            h2.requests = st.cut.requests  # (requests before it: none, in practice)
        if not st.laddr:
            st.lport, st.rport = lport, rport
            la, ra = _ADDRS(raw, _ADDRS_AT)
            st.laddr, st.raddr = events.addr_text(family, la), events.addr_text(family, ra)
        if srtt_us:
            h2.srtt_us = srtt_us
        h2.retrans = retrans
        data = raw[_H2_DATA : _H2_DATA + caplen]
        walk = _H2_WALK(raw, _READ_DATA)
        past: dict[int, bytes] | None = None
        if walk[1]:  # frame headers past the copy, found by the kernel's walk
            past = {
                walk[3 + i]: bytes(raw[_H2_HDRS_AT + 12 * i : _H2_HDRS_AT + 12 * i + 9])
                for i in range(min(walk[1], events.H2_HDRS))
            }
        tail = raw[_H2_DATA + caplen : _H2_DATA + caplen + walk[2]] if walk[2] else b""
        if direction == 0:
            out = h2.on_read(t, n, data, t_arr, t_acc, t_est, past, tail)
        else:
            out = h2.on_write(t, n, data, past, tail)
        if out:
            self.emit(st, out)

    def _event_error(self, raw: bytes, e: Exception) -> None:
        """An event this agent could not handle (a bug, or input nothing here anticipated):
        counted (parallax_agent_event_errors_total), logged once per exception type, and its
        connection's state dropped, so that its framing resynchronises instead of going on
        from a half-updated cutter."""
        key: Key | None = None
        closing = False
        if len(raw) >= _HDR_SIZE:
            h = _HDR(raw)
            key, closing = (h[4], h[5]), h[0] in (_EV_CLOSE, _EV_SOCK_CLOSE)
        self.conn_error(e, key, closing)

    def conn_error(self, e: Exception, key: Key | None, closing: bool) -> None:
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
        if st.h2 is not None:  # an HTTP/2 connection is not picked up again
            st.h2.on_loss()
            if closing:
                del self.conns[key]
            return
        old = st.cut
        # what it had in flight is lost, as after lost events
        self.stats.lost_exchanges += (
            len(old.pending) + (old.active is not None) + (old.ws_cur is not None)
        )
        if closing:
            del self.conns[key]
            return
        fresh = Conn(self.head_window, self.stats)
        fresh.mode = "resync"  # from the next read that starts a request
        fresh.requests = old.requests  # not a first request: no accept-queue time
        fresh.srtt_us, fresh.retrans = old.srtt_us, old.retrans
        st.cut = fresh

    def resync_all(self) -> None:
        """What the kernel skipped (a pause) cannot be framed: every connection
        resynchronises at its next request (what it had in flight is counted as lost)."""
        for st in self.conns.values():
            st.cut.on_loss()
            if st.h2 is not None:
                st.h2.on_loss()

    def open_requests(self, service: str) -> list[int]:
        """The t1 (monotonic ns) of the service's requests read and not yet finished. Called
        from the exporter thread: list() copies the table in one step under the GIL."""
        out = []
        for st in list(self.conns.values()):
            h2 = st.h2
            a = st.cut.active
            if h2 is not None:  # HTTP/2: its streams answered and open
                t1s = [ex.t1 for ex in list(h2.streams.values()) if ex.t2]
            elif a is not None and a.t1:
                t1s = [a.t1]
            else:
                continue
            svc = st.info.service if st.info is not None else self._identity(st.pid, st.lport)[1]
            if svc == service:
                out += t1s
        return out

    # -- records --------------------------------------------------------------------
    def _info(self, st: ConnState) -> ConnInfo:
        comm, service = self._identity(st.pid, st.lport)
        st.info = ConnInfo(st.pid, comm, service, st.laddr, st.lport, st.raddr, st.rport, st.tls)
        return st.info

    def emit(self, st: ConnState, out: list[Exchange]) -> None:
        for ex in out:
            if not ex.t2 and not ex.ws_seq:
                continue
            info = st.info or self._info(st)
            rec = build(ex, info, self.clock)
            if ex.traceparent_missed:
                self._on_traceparent_missed()
            self.out.put(rec, info.service)

    # -- body writes still in the kernel aggregate ---------------------------------
    def sweep(self, aggs: Any) -> None:
        """A Content-Length response whose body writes sit in the kernel aggregate
        (``aggs``: px_aggs, flushed only at the next boundary) is finished from a snapshot
        of the map."""
        if not self._open_cl:
            return
        now = time.monotonic_ns()
        lookups = 0
        for (sk, ident), st in list(self._open_cl.items()):
            a = st.cut.active
            if a is None or a.content_length is None:
                self._open_cl.pop((sk, ident), None)
                continue
            if now - st.cut.t_last_event < SWEEP_IDLE_NS:
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
            if getattr(v, "hold_pend", 0):
                continue  # its last bytes are still in the socket (bpf/agent/hold.h)
            if a.body_out + v.bytes < a.content_length:
                continue
            try:
                self._take_snapshot(st, v)
            except Exception as e:  # noqa: BLE001  (as for a ring event: on_event)
                self.conn_error(e, (sk, ident), closing=False)

    def _take_snapshot(self, st: ConnState, v: Any) -> None:
        """Body writes read from a px_aggs entry (the sweep, shutdown), as if their WAGG
        event had come; the event itself, when it comes, is then skipped (snap_t_first)."""
        n = int(v.n)
        times = [v.t_first + v.offs_us[i] * 1000 for i in range(min(n, events.CHUNKS))]
        st.snap_t_first = v.t_first
        hold = None
        if getattr(v, "hold_on", 0):  # (a program compiled without PX_HOLDS has no field)
            hold = events.Hold.of(
                int(v.hold_max_us),
                int(v.hold_sum_us),
                int(v.hold_n),
                int(v.hold_untimed),
                int(v.hold_why),
                int(v.hold_mask),
                int(v.hold_bytes),
            )
        out = st.cut.on_writes(v.t_last, times, n, v.bytes, v.gap_max_ns, int(v.flags), hold)
        self.emit(st, out)

    def flush_all(self, aggs: Any) -> None:
        """Stopping: every connection's body writes still in the kernel aggregate, then what
        it has in flight as partial records (requests read but not answered yet are counted
        as unanswered, not recorded)."""
        for key, st in list(self.conns.items()):
            try:
                self._flush_conn(aggs, key[0], st)
            except Exception as e:  # noqa: BLE001  (the other connections are still flushed)
                self.conn_error(e, key, closing=True)
        self.conns.clear()
        self._open_cl.clear()

    def _flush_conn(self, aggs: Any, sk: int, st: ConnState) -> None:
        if st.cut.active is not None or st.cut.ws_cur is not None:
            try:
                v = aggs[aggs.Key(sk)]
            except KeyError:
                v = None
            if v is not None and v.t_last and v.t_first != st.snap_t_first:
                self._take_snapshot(st, v)
        out = st.cut.flush_inflight()
        if st.h2 is not None:
            out += st.h2.flush_inflight()
        self.n_final_partial += len(out)
        self.emit(st, out)
