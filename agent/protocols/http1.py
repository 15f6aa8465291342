"""HTTP/1.x: one TCP connection's kernel events → exchanges (pure Python).

Input, in order, per connection: reads (request bytes, the first ``window`` of each read),
response-head writes (a write beginning ``HTTP/``), aggregated body writes, peer FIN and
close. Output: one :class:`~agent.protocols.exchange.Exchange` per request.

Framing: keep-alive and pipelining (several requests in one read; responses matched in
order), Content-Length and chunked bodies, close-delimited bodies, SSE, a peer that closes
mid-stream, and a stream-length limit (the kernel flushes at the limit: a partial record is
emitted, the final one follows). After ``101 Switching Protocols`` the connection is
WebSocket's (agent.protocols.websocket).
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass

from agent.kernel import events
from agent.kernel.events import WAGG_END, WAGG_PARTIAL, Hold
from agent.protocols import http1_head
from agent.protocols.base import ConnParser
from agent.protocols.exchange import Exchange
from agent.protocols.streams.body import framing_of, open_body
from agent.protocols.streams.stream import Engine
from agent.protocols.websocket import WsConn

MAX_PIPELINE = 64  # pending requests per connection before we stop queueing (bounded memory)

# the record layouts of agent.kernel.events, bound once for on_event
_HDR_SIZE = events.HDR.size
_READ = events.READ_NOADDR.unpack_from
_READ_DATA = events.READ_DATA
_RESP = events.RESP.unpack_from
_RESP_DATA = events.RESP_DATA
_AGG = events.AGG.unpack_from
_OFFS_AT = events.OFFS_AT
_BODY = events.BODY.unpack_from
_BODY_DATA = events.BODY_DATA
_EV_READ, _EV_RESP, _EV_WAGG = events.EV_READ, events.EV_RESP, events.EV_WAGG
_EV_BODY = events.EV_BODY


@dataclass(slots=True)
class Stats:
    unparsed: int = 0  # connections whose bytes are not HTTP/1.x (TLS, HTTP/2, other)
    head_too_large: int = 0  # request heads beyond the capture window
    unmatched_responses: int = 0
    desync: int = 0
    unanswered: int = 0  # requests read but never answered when their connection ended
    lost_exchanges: int = 0  # dropped because events of their connection were lost


class Conn:
    """One connection's HTTP/1 parser (agent.protocols.base.ConnParser). Feed events in
    kernel order; each call returns the exchanges it completed."""

    def __init__(self, window: int = 4096, stats: Stats | None = None) -> None:
        self.window = window
        self.stats = stats if stats is not None else Stats()
        self.mode = "http"  # http | dead | resync
        self.buf = bytearray()
        self.body_skip = 0
        self.cur_t_arr = 0
        self.cur_bytes = 0
        self.pending: deque[Exchange] = deque()
        self.active: Exchange | None = None
        self.requests = 0  # seen on this connection, those the kernel did not sample included
        self.sample_th = 0  # the threshold of the request being read (its READ events say)
        self.t_acc = 0
        self.t_est = 0
        self.t_peer_fin = 0
        self.srtt_us = 0
        self.retrans = 0
        self.rtx_wait_us = 0
        self.rtx_timed = 0
        self.last: Exchange | None = None  # the last exchange begun (its retransmits end here)
        self.t_last_event = 0
        self.upgraded: ConnParser | None = None
        self.engine: Engine | None = None

    @property
    def gave_up_unparsed(self) -> bool:
        return self.mode == "dead" and self.requests == 0

    # -- the seam -------------------------------------------------------------------------
    def on_event(self, typ: int, raw: bytes, t: int, sample_th: int) -> list[Exchange]:
        if typ == _EV_READ:
            t_est, t_acc, t_arr, n, caplen, _lp, _rp, _fam, skipped = _READ(raw, _HDR_SIZE)
            if skipped:  # requests the kernel did not sample: not the first one now
                self.requests += skipped
            self.sample_th = sample_th
            return self.on_read(t, n, raw[_READ_DATA : _READ_DATA + caplen], t_arr, t_acc, t_est)
        if typ == _EV_RESP:
            n, caplen = _RESP(raw, _HDR_SIZE)
            return self.on_resp(t, n, raw[_RESP_DATA : _RESP_DATA + caplen])
        if typ == _EV_WAGG:
            t_first, t_last, nbytes, gap_max_ns, n, flags = _AGG(raw, _HDR_SIZE)
            offs = events.offsets(raw, _OFFS_AT, n)
            hold = events.hold_at(raw)
            return self.on_writes(t_last, t_first, offs, n, nbytes, gap_max_ns, flags, hold)
        if typ == _EV_BODY:
            n, caplen, tail, _ = _BODY(raw, _HDR_SIZE)
            end = _BODY_DATA + caplen
            self.on_body(t, n, raw[_BODY_DATA:end], raw[end : end + tail])
        return []

    def on_body(self, t: int, n: int, head: bytes, tail: bytes = b"") -> None:
        """A body write of an event stream, with its bytes (the kernel times it in the
        aggregate too)."""
        a = self.active
        if a is not None and a.body is not None:
            a.body.write(t, n, head, tail)

    # -- request side ---------------------------------------------------------------
    def on_read(
        self, t: int, n: int, data: bytes, t_arr: int = 0, t_acc: int = 0, t_est: int = 0
    ) -> list[Exchange]:
        self.t_last_event = t
        if t_acc:
            self.t_acc = t_acc
        if t_est:
            self.t_est = t_est
        if n <= 0 or self.mode == "dead":
            return []
        if (
            not self.buf
            and not self.body_skip
            and self.mode == "http"
            and n == len(data)
            and n >= 4
            and data.find(b"\r\n\r\n") == n - 4
        ):
            # The common case, one whole request head alone in a read: what _cut does with
            # it, without the buffer (no copy in and out, no second scan).
            self.cur_bytes = n
            self.cur_t_arr = t_arr
            r = self._request(data, t)
            if r is not None:
                self.body_skip = r[1]
            return []
        missing = n - len(data)
        pos = 0
        if self.body_skip:
            take = min(self.body_skip, n)
            self.body_skip -= take
            self._credit_body(take)
            pos = take
            if pos >= len(data):
                missing = n - pos
                if missing > 0 and self.body_skip == 0:
                    self._lose_sync()
                return []
        if self.mode == "resync":
            # after bytes we could not frame: pick up again at a read that starts a request
            if not (data[pos:] and http1_head.looks_like_request(bytes(data[pos : pos + 11]))):
                return []
            self.mode = "http"
            self.buf.clear()
        if not self.buf:
            self.cur_t_arr = t_arr
            self.cur_bytes = 0
        elif not self.cur_t_arr:
            self.cur_t_arr = t_arr
        self.buf += data[pos:]
        self.cur_bytes += n - pos
        self._cut(t, truncated=missing > 0)
        if missing > 0 and self.mode == "http" and not self.buf:
            # bytes beyond the capture: body of the last request, else we lost the framing
            if self.body_skip >= missing:
                self.body_skip -= missing
                self._credit_body(missing)
            else:
                self._lose_sync()
        return []

    def _credit_body(self, nbytes: int) -> None:
        last = self.pending[-1] if self.pending else self.active
        if last is not None:
            last.bytes_in += nbytes

    def _lose_sync(self) -> None:
        self.stats.desync += 1
        self.mode = "resync"
        self.buf.clear()
        self.body_skip = 0

    def _cut(self, t: int, truncated: bool) -> None:
        while self.buf and self.mode == "http":
            if not http1_head.looks_like_request(bytes(self.buf[:11])):
                self.stats.unparsed += 1
                self.mode = "dead" if self.requests == 0 else "resync"
                self.buf.clear()
                break
            idx = self.buf.find(b"\r\n\r\n")
            if idx < 0:
                if len(self.buf) >= self.window or truncated:
                    self._head_overflow(t)
                break
            head = bytes(self.buf[: idx + 4])
            del self.buf[: idx + 4]
            r = self._request(head, t)
            if r is None:
                break
            ex, length = r
            take = min(len(self.buf), length)
            del self.buf[:take]
            self.body_skip = length - take
            ex.bytes_in += take
            if self.buf:
                self.cur_bytes = len(self.buf)

    def _request(self, head: bytes, t: int) -> tuple[Exchange, int] | None:
        """One whole request head: its exchange queued (bytes_in: the head) and its body
        length. None where framing stops: not a request (the connection is given up or
        resynchronises) or a chunked body (queued, then resync after it)."""
        req = http1_head.parse_request(head)
        if req is None:
            self.stats.unparsed += 1
            self.mode = "dead" if self.requests == 0 else "resync"
            self.buf.clear()
            return None
        ex = self._new_exchange(req, t, missed=False)
        if req.chunked:
            # chunked request bodies are rare (gRPC-web, uploads): resync after them
            self._queue(ex)
            self._lose_sync()
            return None
        ex.bytes_in = req.head_len
        self._queue(ex)
        return ex, req.content_length

    def _head_overflow(self, t: int) -> None:
        """The head does not fit the window: keep the request line if it is whole (the
        record then says its traceparent may be missed), never guess the rest."""
        self.stats.head_too_large += 1
        line_end = self.buf.find(b"\r\n")
        if line_end > 0:
            req = http1_head.parse_request(bytes(self.buf[:line_end]) + b"\r\n\r\n")
            if req is not None:
                ex = self._new_exchange(req, t, missed=True)
                ex.bytes_in = self.cur_bytes
                self._queue(ex)
        self._lose_sync()

    def _new_exchange(self, req: http1_head.RequestHead, t: int, missed: bool) -> Exchange:
        self.requests += 1
        # The connection's retransmits are shared out by request: the previous one's share
        # ends where this one begins; the first one's begins with the connection (its
        # SYN-ACK retransmits included: bpf/agent/tcp.h).
        tcp = (self.retrans, self.rtx_wait_us, self.rtx_timed) if self.requests > 1 else (0, 0, 0)
        if self.last is not None:
            self.last.end_tcp(self.retrans, self.rtx_wait_us, self.rtx_timed)
        ex = Exchange(
            req.method,
            req.path,
            req.version,
            None if missed and req.traceparent is None else req.traceparent,
            missed and req.traceparent is None,
            t1=t,
            t_arr=self.cur_t_arr,
            srtt_us=self.srtt_us,
            retrans_start=tcp[0],
            rtx_wait_start=tcp[1],
            rtx_timed_start=tcp[2],
            tcp_hold=True,
            upgrade=req.upgrade_websocket,
            head_request=req.method == "HEAD",
            sample_th=self.sample_th,
        )
        if self.requests == 1:
            ex.t_acc, ex.t_est = self.t_acc, self.t_est
        self.cur_t_arr = 0
        self.last = ex
        return ex

    def _queue(self, ex: Exchange) -> None:
        if len(self.pending) < MAX_PIPELINE:
            self.pending.append(ex)

    # -- response side --------------------------------------------------------------
    def on_resp(self, t: int, n: int, data: bytes) -> list[Exchange]:
        self.t_last_event = t
        if self.mode == "dead":
            return []
        rh = http1_head.parse_response(data)
        if rh is None:
            return []
        out: list[Exchange] = []
        if rh.status == 100 or (100 < rh.status < 200 and rh.status != 101):
            return out  # interim response: the final one follows
        if self.active is not None:
            out.append(self._finish(self.active))
            self.active = None
        if not self.pending:
            self.stats.unmatched_responses += 1  # e.g. a 400 for bytes that were not a request
            return out
        ex = self.pending.popleft()
        ex.t2 = t
        ex.status = rh.status
        if ex.traceparent is None and rh.server_traceparent is not None:
            # a page load: the request came without a traceparent, the app named its trace
            # in Server-Timing (what the probe's navigation entry reports): the record joins
            # it as a child of the span the app named, so the two pair
            ex.traceparent = rh.server_traceparent
            ex.traceparent_missed = False
        ex.bytes_out = n
        ex.content_length = rh.content_length
        ex.chunked = rh.chunked
        whole = len(data) >= n
        if rh.head_len is not None and n > rh.head_len:
            ex.add_body_write(t)
            ex.body_out = n - rh.head_len
        ex.t_end = t
        done = (
            rh.status == 101
            or ex.head_request
            or rh.status in (204, 304)
            or (rh.content_length is not None and ex.body_out >= rh.content_length)
            or (rh.chunked and whole and data.endswith(b"0\r\n\r\n"))
        )
        framing = framing_of(rh.content_type) if rh.content_type and not done else None
        if framing is not None:
            # an event stream: its writes' bytes come (EV_BODY) and are read as LLM events
            ex.body = open_body(framing, rh.chunked, ex.t1, self.engine)
            ex.stream = ex.body.stream
            if rh.head_len is not None and n > rh.head_len:  # body bytes in the head's write
                ex.body.write(t, n - rh.head_len, data[rh.head_len :])
        if rh.status == 101:
            # the connection is WebSocket's from here on: requests pipelined after the
            # upgrade are not HTTP
            self.pending.clear()
            self.mode = "dead"
            self.upgraded = WsConn(ex, self.stats, self.requests, rh.ws_extensions, self.engine)
        if done:
            out.append(self._finish(ex))
        else:
            self.active = ex
        return out

    def on_writes(
        self,
        t_last: int,
        t_first: int,
        offs_us: tuple[int, ...],
        n: int,
        nbytes: int,
        gap_max_ns: int,
        flags: int,
        hold: Hold | None = None,
    ) -> list[Exchange]:
        """Aggregated body writes (``offs_us``: the first ≤ 256 of the ``n``, µs from
        ``t_first``)."""
        self.t_last_event = t_last
        ex = self.active
        if ex is None:
            return []
        ex.merge_writes(t_last, t_first, offs_us, n, nbytes, gap_max_ns, hold)
        ex.body_out += nbytes
        out: list[Exchange] = []
        if flags & WAGG_PARTIAL and not flags & WAGG_END:
            snap = copy.copy(ex)
            snap.chunk_offs_us = list(ex.chunk_offs_us)
            snap.partial = True
            out.append(self._finish(snap))
            ex.partial = False
        if flags & WAGG_END:
            ex.ended = True
        if flags & WAGG_END or (ex.content_length is not None and ex.body_out >= ex.content_length):
            out.append(self._finish(ex))
            self.active = None
        return out

    # -- connection end -------------------------------------------------------------
    def on_peer_fin(self, t: int) -> None:
        # Only noted: the kernel may still hold body writes it flushes at close; whether the
        # response was cut short is decided there, from the framing.
        if not self.t_peer_fin:
            self.t_peer_fin = t
        a = self.active
        if a is not None and not a.t_peer_fin:
            a.t_peer_fin = t
            if a.stream is not None:
                a.stream.client_left(t)

    def on_close(self, t: int, server_gone: bool = False) -> list[Exchange]:
        """The connection ended. ``server_gone``: it closed without a close() of the app
        (the process was killed or exited): an incomplete response is marked partial."""
        out: list[Exchange] = []
        a = self.active
        if a is not None:
            incomplete = (a.content_length is not None and a.body_out < a.content_length) or (
                a.chunked and not a.ended
            )
            peer_fin = bool(self.t_peer_fin)
            a.client_aborted = incomplete and peer_fin
            a.partial = incomplete and server_gone and not peer_fin
            out.append(self._finish(a))
            self.active = None
        return self._end(out)

    def flush_inflight(self) -> list[Exchange]:
        """The agent is stopping: the response in progress as a partial record covering
        what was written so far. Requests not answered yet are counted
        (``Stats.unanswered``), not recorded."""
        out: list[Exchange] = []
        a = self.active
        if a is not None:
            a.partial = True
            out.append(self._finish(a))
            self.active = None
        return self._end(out)

    def _end(self, out: list[Exchange]) -> list[Exchange]:
        """Both ends of a connection's life: requests never answered get no record
        (nothing was served), only a count."""
        self.stats.unanswered += len(self.pending)
        self.pending.clear()
        self.mode = "dead"
        return out

    def on_loss(self) -> None:
        """Events of this connection were lost (the kernel's ring was full): what is in
        flight can no longer be framed — a lost response head would match the next response
        to the wrong request. Drop it (counted) and pick up again at the next read that
        starts a request."""
        self.stats.lost_exchanges += len(self.pending) + (self.active is not None)
        self.pending.clear()
        self.active = None
        self.body_skip = 0
        self.buf.clear()
        if self.mode == "http":
            self.mode = "resync"

    def in_flight(self) -> list[int]:
        a = self.active
        return [a.t1] if a is not None and a.t1 else []

    def after_error(self) -> ConnParser | None:
        self.stats.lost_exchanges += len(self.pending) + (self.active is not None)
        fresh = Conn(self.window, self.stats)
        fresh.mode = "resync"  # from the next read that starts a request
        fresh.requests = self.requests  # not a first request: no accept-queue time
        fresh.srtt_us, fresh.retrans = self.srtt_us, self.retrans
        fresh.rtx_wait_us, fresh.rtx_timed = self.rtx_wait_us, self.rtx_timed
        return fresh

    def update_tcp(self, srtt_us: int, retrans: int) -> None:
        if srtt_us:
            self.srtt_us = srtt_us
        self.retrans = retrans

    def _finish(self, ex: Exchange) -> Exchange:
        return ex.finish_tcp(self.srtt_us, self.retrans, self.rtx_wait_us, self.rtx_timed)

    # -- the sweep: a Content-Length response whose last writes sit in the kernel -------
    def open_content_length(self) -> tuple[int, int] | None:
        """(body bytes still expected, last event time) of a Content-Length response in
        progress, else None."""
        a = self.active
        if a is None or a.content_length is None:
            return None
        return a.content_length - a.body_out, self.t_last_event
