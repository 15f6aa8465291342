"""The connection table: ring-buffer events → a protocol's parser → exchanges → records.

Every event of a followed connection lands here (``on_event``, the agent's hot path). What
is common to every protocol is done here — finding the connection, its addresses and
identity, lost events, its TCP figures, close, TLS — and the rest is the connection's
parser's, chosen by the event's type from the protocol table (agent.protocols.table). Each
finished exchange becomes a record (agent.records.build) handed to the export queue. The
table is a bounded LRU: a connection whose end is never seen (an event lost to a full ring)
cannot grow it for ever.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.diagnostics import where
from agent.export.outputs import RecordQueue
from agent.kernel import events
from agent.kernel.clock import MonoClock
from agent.protocols import http1
from agent.protocols.base import ConnParser
from agent.protocols.exchange import Exchange
from agent.protocols.http2 import H2Stats
from agent.protocols.streams.stream import Engines
from agent.protocols.table import BY_EVENT, PROTOCOLS, Entry
from agent.protocols.websocket import WsConn
from agent.records import ConnInfo, build

log = logging.getLogger("parallax.agent")
MAX_CONNS = 32768  # user-space connection table (LRU): twice the kernel's px_conns (default)
# A finished exchange's record waits at most this long for the end of its share of the
# connection's retransmits (the next request's start, or the socket's end: EV_TAIL); then
# it takes the connection's counts as the kernel has them. A lost segment is sent again
# after ~2 RTT (tail-loss probe) or the retransmission timeout (200 ms at least, doubling).
TCP_HOLD_S = 1.0
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
_TLS = events.TLS.unpack_from
_AGG_T_FIRST = events.Struct_Q.unpack_from
_EV_WAGG, _EV_READ, _EV_BODY = events.EV_WAGG, events.EV_READ, events.EV_BODY
_EV_CLOSE, _EV_PEER_FIN, _EV_SOCK_CLOSE = events.EV_CLOSE, events.EV_PEER_FIN, events.EV_SOCK_CLOSE
_EV_TLS = events.EV_TLS
_EV_TAIL = events.EV_TAIL
_WITH_ADDRS = frozenset((events.EV_READ, events.EV_H2))  # their layout carries the addresses

Key = tuple[int, int]  # (socket address, first-seen time): sockets are reused


@dataclass
class ConnState:
    parser: ConnParser
    proto: Entry
    pid: int
    lport: int = 0
    rport: int = 0
    laddr: str = ""
    raddr: str = ""
    snap_t_first: int = 0  # an aggregate already consumed from a map snapshot
    unparsed_counted: bool = False
    info: ConnInfo | None = None
    tls: bool = False  # its bytes are TLS records: the plaintext comes from the SSL uprobes
    key: Key = (0, 0)
    # finished exchanges whose share of the connection's retransmits is still open
    # (Exchange.tcp_hold), in order, and when the first of them stops waiting (monotonic s)
    held: list[Exchange] = field(default_factory=list)
    hold_until: float = 0.0


class Connections:
    """The followed connections and their parsers. ``identity(pid, lport)`` gives (comm,
    service) for a record; ``on_unparsed(lport)`` counts a connection that is no protocol
    the agent follows; ``on_tls(pid, lport)`` is told of each TLS connection; ``out`` takes
    the records."""

    def __init__(
        self,
        head_window: int,
        clock: MonoClock,
        out: RecordQueue,
        identity: Callable[[int, int], tuple[str, str]],
        on_unparsed: Callable[[int], None],
        on_traceparent_missed: Callable[[], None],
        on_tls: Callable[[int, int], None] = lambda pid, lport: None,
        on_plain: Callable[[int], None] = lambda pid: None,
        tcp_now: Callable[[int, int], tuple[int, int, int] | None] = lambda sk, ident: None,
        hold_s: float = TCP_HOLD_S,
        max_conns: int = MAX_CONNS,
    ) -> None:
        self.head_window = head_window
        self.clock = clock
        self.out = out
        self.proto_stats: dict[str, Any] = {e.name: e.new_stats() for e in PROTOCOLS}
        self.engines = Engines()  # per local port: the streams of one engine (LLM queue)
        self._identity = identity
        self._on_unparsed = on_unparsed
        self._on_traceparent_missed = on_traceparent_missed
        self._on_tls = on_tls
        self._on_plain = on_plain  # a plaintext connection's first event (its process)
        self._tcp_now = tcp_now  # a connection's TCP counts now (the kernel's maps)
        self.hold_s = hold_s
        self.max_conns = max_conns
        self.conns: OrderedDict[Key, ConnState] = OrderedDict()
        # connections with records waiting for their retransmits (oldest wait first), and
        # of those the ones closed by the app, waiting for their socket's end (EV_TAIL)
        self._holding: OrderedDict[Key, ConnState] = OrderedDict()
        self._ending: dict[Key, ConnState] = {}
        self._open_cl: dict[Key, ConnState] = {}  # Content-Length responses still open
        self.n_events = 0
        self.n_evicted = 0
        self.n_final_partial = 0
        self.n_event_errors = 0
        self._errors_logged: set[str] = set()  # exception type names already logged

    @property
    def stats(self) -> http1.Stats:
        """HTTP/1's (and WebSocket's) counters."""
        s: http1.Stats = self.proto_stats["http1"]
        return s

    @property
    def h2_stats(self) -> H2Stats:
        s: H2Stats = self.proto_stats["http2"]
        return s

    def __len__(self) -> int:
        return len(self.conns)

    @property
    def waiting(self) -> bool:
        """Responses or records wait for a sweep (the main loop's, at each drain)."""
        return bool(self._open_cl) or bool(self._holding)

    def _new_parser(self, proto: Entry) -> ConnParser:
        return proto.new_conn(self.proto_stats[proto.name], self.head_window)

    # -- events ---------------------------------------------------------------------
    def on_event(self, raw: bytes) -> None:
        """One ring-buffer record (the layouts of agent.kernel.events): the hot path of the
        agent (two or three calls per request), so no event object is built; the header is
        read here, the rest by the connection's parser."""
        try:
            self.n_events += 1  # plain ints on the hot path; Prometheus gets them at a scrape
            if len(raw) < _HDR_SIZE:
                return
            typ, tgid, _, _, sk, ident, t, srtt_us, retrans, lost, sample_th, wait, timed = _HDR(
                raw
            )
            key = (sk, ident)
            conns = self.conns
            st = conns.get(key)
            if lost and st is not None:
                st.parser.on_loss()
            proto = BY_EVENT.get(typ)
            if proto is None:
                self._conn_event(typ, raw, key, st, tgid, t, (retrans, wait, timed))
                return
            if st is None:
                if len(conns) >= self.max_conns:
                    self._evict()
                st = conns[key] = ConnState(self._new_parser(proto), proto, tgid, key=key)
                if typ in _WITH_ADDRS:
                    self._on_plain(tgid)  # its first bytes were no TLS record (EV_TLS first)
            else:
                conns.move_to_end(key)
                if st.proto is not proto:  # the kernel found another protocol (h2 preface)
                    old_p = st.parser
                    st.parser, st.proto = self._new_parser(proto), proto
                    st.parser.requests, st.parser.engine = old_p.requests, old_p.engine
            p = st.parser
            if typ in _WITH_ADDRS and not st.laddr:  # (EV_TLS may have set the port alone)
                lport, rport, family = _READ(raw, _HDR_SIZE)[5:8]
                st.lport, st.rport = lport, rport
                la, ra = _ADDRS(raw, _ADDRS_AT)
                st.laddr, st.raddr = events.addr_text(family, la), events.addr_text(family, ra)
                p.engine = self.engines.of(lport)
            elif (
                typ == _EV_WAGG
                and st.snap_t_first
                and st.snap_t_first == _AGG_T_FIRST(raw, _HDR_SIZE)[0]
            ):
                return  # already taken from the map snapshot (the sweep)
            if srtt_us:
                p.srtt_us = srtt_us
            p.retrans, p.rtx_wait_us, p.rtx_timed = retrans, wait, timed
            out = p.on_event(typ, raw, t, sample_th)
            if out:
                self.emit(st, out)
            held = st.held
            if held and (len(held) > 1 or held[0].tcp_end is not None):
                # (one record waiting for its share of retransmits, still open: the common
                # case between a response and the next request, nothing to release)
                self._release(st)
            if typ == _EV_READ:
                if p.gave_up_unparsed and not st.unparsed_counted:
                    st.unparsed_counted = True
                    self._on_unparsed(st.lport)
                return
            if p.upgraded is not None:  # WebSocket after a 101
                st.parser, p.upgraded = p.upgraded, None
                st.parser.engine = p.engine
            # the sweep looks only at Content-Length responses still open
            if typ != _EV_BODY and isinstance(p, http1.Conn) and p.open_content_length():
                self._open_cl[key] = st
            elif self._open_cl:
                self._open_cl.pop(key, None)
        except Exception as e:  # noqa: BLE001  (one event must not stop the agent)
            self._event_error(raw, e)

    def _evict(self) -> None:
        old, st = self.conns.popitem(last=False)  # the least recently active
        self._open_cl.pop(old, None)
        self.n_evicted += 1
        if st.held:
            self._release(st, force=True)

    def _conn_event(
        self,
        typ: int,
        raw: bytes,
        key: Key,
        st: ConnState | None,
        tgid: int,
        t: int,
        tcp: tuple[int, int, int],
    ) -> None:
        """The events of the connection itself, whatever its protocol: its end, the peer's
        FIN, TLS, its socket's end."""
        if _EV_CLOSE <= typ <= _EV_SOCK_CLOSE:
            if st is None:
                return
            p = st.parser
            p.retrans, p.rtx_wait_us, p.rtx_timed = tcp
            if typ == _EV_PEER_FIN:
                p.on_peer_fin(t)
                return
            self.emit(st, p.on_close(t, typ == _EV_SOCK_CLOSE))
            if st.held:
                # the socket may still send its last bytes again: EV_TAIL ends the share
                self._ending[key] = st
            if (
                st.tls
                and st.parser.requests == 0
                and not st.unparsed_counted
                and isinstance(st.parser, http1.Conn)
            ):
                self._on_unparsed(st.lport)  # TLS whose plaintext never showed a request
            del self.conns[key]
            self._open_cl.pop(key, None)
        elif typ == _EV_TAIL:  # the socket of a connection closed by the app ended
            st = self._ending.pop(key, None)
            if st is not None:
                for ex in st.held:
                    ex.end_tcp(*tcp)
                self._release(st)
        elif typ == _EV_TLS:  # once per connection, before its first plaintext
            if st is None:
                if len(self.conns) >= self.max_conns:
                    self._evict()
                proto = PROTOCOLS[0]
                st = self.conns[key] = ConnState(self._new_parser(proto), proto, tgid, key=key)
            st.tls = True
            st.pid = tgid
            st.lport = st.lport or _TLS(raw, _HDR_SIZE)[0]
            self._on_tls(tgid, st.lport)
        # (a type this agent does not know: ignored)

    def _event_error(self, raw: bytes, e: Exception) -> None:
        """An event this agent could not handle (a bug, or input nothing here anticipated):
        counted (parallax_agent_event_errors_total), logged once per exception type, and its
        connection's state dropped, so that its framing resynchronises instead of going on
        from a half-updated parser."""
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
        if closing:
            st.parser.on_loss()
            del self.conns[key]
            return
        nxt = st.parser.after_error()
        if nxt is None:
            del self.conns[key]
        else:
            st.parser = nxt

    def resync_all(self) -> None:
        """What the kernel skipped (a pause) cannot be framed: every connection
        resynchronises at its next request (what it had in flight is counted as lost)."""
        for st in self.conns.values():
            st.parser.on_loss()

    def open_requests(self, service: str) -> list[int]:
        """The t1 (monotonic ns) of the service's requests read and not yet finished. Called
        from the exporter thread: list() copies the table in one step under the GIL."""
        out = []
        for st in list(self.conns.values()):
            t1s = st.parser.in_flight()
            if not t1s:
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
            if ex.tcp_hold and ex.tcp_end is None and not ex.partial and self.hold_s > 0:
                # its share of the connection's retransmits is still open: the record waits
                if not st.held:
                    st.hold_until = time.monotonic() + self.hold_s
                    self._holding[st.key] = st
                    self._holding.move_to_end(st.key)
                st.held.append(ex)
                continue
            self._build(st, ex)

    def _release(self, st: ConnState, force: bool = False) -> None:
        """The held records whose share of retransmits has ended (all of them, ``force``:
        with the connection's counts as the kernel has them now, or as last seen)."""
        if force:
            now = self._tcp_now(st.key[0], st.key[1])
            p = st.parser
            for ex in st.held:
                ex.end_tcp(*(now or (p.retrans, p.rtx_wait_us, p.rtx_timed)))
        keep: list[Exchange] = []
        for ex in st.held:
            if ex.tcp_end is None:
                keep.append(ex)
            else:
                self._build(st, ex)
        st.held = keep
        if not keep:
            self._holding.pop(st.key, None)
            self._ending.pop(st.key, None)

    def _build(self, st: ConnState, ex: Exchange) -> None:
        info = st.info or self._info(st)
        rec = build(ex, info, self.clock)
        if ex.traceparent_missed:
            self._on_traceparent_missed()
        self.out.put(rec, info.service)

    def sweep_holds(self) -> None:
        """Records that waited TCP_HOLD_S for the end of their share of retransmits: out,
        with the connection's counts as the kernel has them now."""
        if not self._holding:
            return
        now = time.monotonic()
        while self._holding:
            st = next(iter(self._holding.values()))
            if st.hold_until > now:
                break
            try:
                self._release(st, force=True)
            except Exception as e:  # noqa: BLE001  (as for a ring event: on_event)
                st.held = []
                self.conn_error(e, st.key, closing=False)
            self._holding.pop(st.key, None)
            self._ending.pop(st.key, None)

    # -- body writes still in the kernel aggregate (HTTP/1) ---------------------------
    def sweep(self, aggs: Any) -> None:
        """A Content-Length response whose body writes sit in the kernel aggregate
        (``aggs``: px_aggs, flushed only at the next boundary) is finished from a snapshot
        of the map; records that waited long enough for their retransmits go out."""
        self.sweep_holds()
        if not self._open_cl:
            return
        now = time.monotonic_ns()
        lookups = 0
        for (sk, ident), st in list(self._open_cl.items()):
            p = st.parser
            left = p.open_content_length() if isinstance(p, http1.Conn) else None
            if left is None:
                self._open_cl.pop((sk, ident), None)
                continue
            expected, t_last_event = left
            if now - t_last_event < SWEEP_IDLE_NS:
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
            if v.bytes < expected:
                continue
            try:
                self._take_snapshot(st, v)
            except Exception as e:  # noqa: BLE001  (as for a ring event: on_event)
                self.conn_error(e, (sk, ident), closing=False)

    def _take_snapshot(self, st: ConnState, v: Any) -> None:
        """Body writes read from a px_aggs entry (the sweep, shutdown), as if their WAGG
        event had come; the event itself, when it comes, is then skipped (snap_t_first)."""
        p = st.parser
        if not isinstance(p, http1.Conn | WsConn):
            return
        n = int(v.n)
        offs = tuple(int(v.offs_us[i]) for i in range(min(n, events.CHUNKS)))
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
        out = p.on_writes(v.t_last, v.t_first, offs, n, v.bytes, v.gap_max_ns, int(v.flags), hold)
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
        for st in list(self._holding.values()):
            try:
                self._release(st, force=True)
            except Exception as e:  # noqa: BLE001
                self.conn_error(e, st.key, closing=True)
        self.conns.clear()
        self._open_cl.clear()
        self._holding.clear()
        self._ending.clear()

    def _flush_conn(self, aggs: Any, sk: int, st: ConnState) -> None:
        p = st.parser
        if (isinstance(p, http1.Conn) and p.active is not None) or (
            isinstance(p, WsConn) and p.cur is not None
        ):
            try:
                v = aggs[aggs.Key(sk)]
            except KeyError:
                v = None
            if v is not None and v.t_last and v.t_first != st.snap_t_first:
                self._take_snapshot(st, v)
        out = st.parser.flush_inflight()
        self.n_final_partial += len(out)
        self.emit(st, out)
