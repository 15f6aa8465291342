"""Cutting one TCP connection's kernel events into HTTP/1.x exchanges (pure Python).

Input, in order, per connection: reads (request bytes, the first ``window`` of each read),
response-head writes (a write beginning ``HTTP/``), aggregated body writes, peer FIN and
close. Output: :class:`Exchange` objects, one per request (or WebSocket exchange), with
CLOCK_MONOTONIC nanosecond times; :mod:`agent.records` turns them into exported records.

Framing: keep-alive and pipelining (several requests in one read; responses matched in
order), Content-Length and chunked bodies, close-delimited bodies, SSE, a peer that closes
mid-stream, WebSocket after ``101`` (each client data frame starts an exchange; server
frames until the next client frame belong to it), and a stream-length limit (the kernel
flushes at the limit: a partial record is emitted, the final one follows).
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field

from agent.kernel.events import WAGG_END, WAGG_PARTIAL, Hold, merge_hold
from agent.protocols import http1_head
from parallax_contracts import trace_context
from parallax_contracts.span_attributes import CHUNK_OFFSETS_CAP

MAX_PIPELINE = 64  # pending requests per connection before we stop queueing (bounded memory)


@dataclass(slots=True)
class Exchange:
    method: str
    path: str
    version: str
    traceparent: trace_context.TraceContext | None
    traceparent_missed: bool
    t1: int
    t_arr: int = 0
    t_acc: int = 0  # first request of a connection only
    t_est: int = 0
    t2: int = 0
    t_tok: int = 0
    t_end: int = 0
    status: int = 0
    chunk_times: list[int] = field(default_factory=list)
    chunks: int = 0
    gap_max_ns: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    body_out: int = 0
    content_length: int | None = None
    chunked: bool = False
    srtt_us: int = 0
    retrans_start: int = 0
    retransmits: int = 0
    partial: bool = False
    client_aborted: bool = False
    ws_seq: int = 0
    upgrade: bool = False
    head_request: bool = False
    ended: bool = False  # chunked terminator seen
    sample_th: int = 0  # the kernel's sampling threshold it was kept under (0: all kept)
    hold: Hold | None = None  # write-to-wire holdback of its body writes (None: unmeasured)
    rpc_system: str | None = None  # "grpc": an HTTP/2 stream of content-type application/grpc
    grpc_status: int | None = None  # its trailers' grpc-status

    def add_body_write(self, t: int) -> None:
        if self.t_tok == 0:
            self.t_tok = t
        elif self.chunk_times and t - self.chunk_times[-1] > self.gap_max_ns:
            self.gap_max_ns = t - self.chunk_times[-1]
        if len(self.chunk_times) < CHUNK_OFFSETS_CAP:
            self.chunk_times.append(t)
        self.chunks += 1


@dataclass(slots=True)
class Stats:
    unparsed: int = 0  # connections whose bytes are not HTTP/1.x (TLS, HTTP/2, other)
    head_too_large: int = 0  # request heads beyond the capture window
    unmatched_responses: int = 0
    desync: int = 0
    unanswered: int = 0  # requests read but never answered when their connection ended
    lost_exchanges: int = 0  # dropped because events of their connection were lost


class Conn:
    """One connection's cutter. Feed events in kernel order; each call returns the
    exchanges it completed."""

    def __init__(self, window: int = 4096, stats: Stats | None = None) -> None:
        self.window = window
        self.stats = stats if stats is not None else Stats()
        self.mode = "http"  # http | ws | dead | resync
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
        self.peer_fin = False
        self.srtt_us = 0
        self.retrans = 0
        # WebSocket
        self.ws_upgrade: Exchange | None = None
        self.ws_cur: Exchange | None = None
        self.ws_seq = 0
        self.ws_skip = 0
        self.t_last_event = 0

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
        if self.mode == "ws":
            return self._ws_read(t, n, data, t_arr)
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
        out = self._cut(t, truncated=missing > 0)
        if missing > 0 and self.mode == "http" and not self.buf:
            # bytes beyond the capture: body of the last request, else we lost the framing
            if self.body_skip >= missing:
                self.body_skip -= missing
                self._credit_body(missing)
            else:
                self._lose_sync()
        return out

    def _credit_body(self, nbytes: int) -> None:
        last = self.pending[-1] if self.pending else self.active
        if last is not None:
            last.bytes_in += nbytes

    def _lose_sync(self) -> None:
        self.stats.desync += 1
        self.mode = "resync"
        self.buf.clear()
        self.body_skip = 0

    def _cut(self, t: int, truncated: bool) -> list[Exchange]:
        out: list[Exchange] = []
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
        return out

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
        ex = Exchange(
            req.method,
            req.path,
            req.version,
            None if missed and req.traceparent is None else req.traceparent,
            missed and req.traceparent is None,
            t1=t,
            t_arr=self.cur_t_arr,
            srtt_us=self.srtt_us,
            retrans_start=self.retrans,
            upgrade=req.upgrade_websocket,
            head_request=req.method == "HEAD",
            sample_th=self.sample_th,
        )
        if self.requests == 1:
            ex.t_acc, ex.t_est = self.t_acc, self.t_est
        self.cur_t_arr = 0
        return ex

    def _queue(self, ex: Exchange) -> None:
        if len(self.pending) < MAX_PIPELINE:
            self.pending.append(ex)

    # -- response side --------------------------------------------------------------
    def on_resp(self, t: int, n: int, data: bytes) -> list[Exchange]:
        self.t_last_event = t
        if self.mode in {"ws", "dead"}:
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
        ex.t_end = t
        done = (
            rh.status == 101
            or ex.head_request
            or rh.status in (204, 304)
            or (rh.content_length is not None and ex.body_out >= rh.content_length)
            or (rh.chunked and whole and data.endswith(b"0\r\n\r\n"))
        )
        if rh.status == 101:
            self.mode = "ws"
            self.ws_upgrade = ex
            self.pending.clear()
        if done:
            out.append(self._finish(ex))
        else:
            self.active = ex
        return out

    def on_writes(
        self,
        t_last: int,
        times: list[int],
        n: int,
        nbytes: int,
        gap_max_ns: int,
        flags: int,
        hold: Hold | None = None,
    ) -> list[Exchange]:
        """Aggregated body writes (``times``: the first ≤ 256 of ``n``)."""
        self.t_last_event = t_last
        if self.mode == "ws":
            return self._ws_writes(t_last, times, n, nbytes, gap_max_ns, hold)
        ex = self.active
        if ex is None:
            return []
        self._merge_writes(ex, t_last, times, n, nbytes, gap_max_ns)
        if hold is not None:
            ex.hold = merge_hold(ex.hold, hold)
        ex.body_out += nbytes
        out: list[Exchange] = []
        if flags & WAGG_PARTIAL and not flags & WAGG_END:
            snap = copy.copy(ex)
            snap.chunk_times = list(ex.chunk_times)
            snap.partial = True
            out.append(self._finalize_fields(snap))
            ex.partial = False
        if flags & WAGG_END:
            ex.ended = True
        if flags & WAGG_END or (ex.content_length is not None and ex.body_out >= ex.content_length):
            out.append(self._finish(ex))
            self.active = None
        return out

    @staticmethod
    def _merge_writes(
        ex: Exchange, t_last: int, times: list[int], n: int, nbytes: int, gap_max_ns: int
    ) -> None:
        for tw in times:
            ex.add_body_write(tw)
        ex.chunks += n - len(times)  # writes beyond the kernel's 256 timestamps
        ex.gap_max_ns = max(ex.gap_max_ns, gap_max_ns)
        ex.bytes_out += nbytes
        ex.t_end = max(ex.t_end, t_last)

    # -- connection end -------------------------------------------------------------
    def on_peer_fin(self, t: int) -> None:
        # Only noted: the kernel may still hold body writes it flushes at close; whether the
        # response was cut short is decided there, from the framing.
        self.peer_fin = True

    def on_close(self, t: int, server_gone: bool = False) -> list[Exchange]:
        """The connection ended. ``server_gone``: it closed without a close() of the app
        (the process was killed or exited): an incomplete response is marked partial."""
        out: list[Exchange] = []
        a = self.active
        if a is not None:
            incomplete = (a.content_length is not None and a.body_out < a.content_length) or (
                a.chunked and not a.ended
            )
            a.client_aborted = incomplete and self.peer_fin
            a.partial = incomplete and server_gone and not self.peer_fin
            out.append(self._finish(a))
            self.active = None
        return self._end(out, partial_ws=False)

    def flush_inflight(self) -> list[Exchange]:
        """The agent is stopping: the response in progress (and a WebSocket exchange) as
        partial records covering what was written so far. Requests not answered yet are
        counted (``Stats.unanswered``), not recorded."""
        out: list[Exchange] = []
        a = self.active
        if a is not None:
            a.partial = True
            out.append(self._finish(a))
            self.active = None
        return self._end(out, partial_ws=True)

    def _end(self, out: list[Exchange], partial_ws: bool) -> list[Exchange]:
        """Both ends of a connection's life (closed, or the agent stopping): the WebSocket
        exchange in progress is emitted; requests never answered get no record (nothing
        was served), only a count."""
        if self.mode == "ws" and self.ws_cur is not None and self.ws_cur.t2:
            if partial_ws:
                self.ws_cur.partial = True
            out.append(self._finalize_fields(self.ws_cur))
        self.ws_cur = None
        self.stats.unanswered += len(self.pending)
        self.pending.clear()
        self.mode = "dead"
        return out

    def on_loss(self) -> None:
        """Events of this connection were lost (the kernel's ring was full): what is in
        flight can no longer be framed — a lost response head would match the next response
        to the wrong request. Drop it (counted) and pick up again at the next read that
        starts a request (or, on a WebSocket, the next client frame)."""
        dropped = len(self.pending) + (self.active is not None) + (self.ws_cur is not None)
        self.stats.lost_exchanges += dropped
        self.pending.clear()
        self.active = None
        self.ws_cur = None
        self.body_skip = 0
        self.buf.clear()
        if self.mode == "http":
            self.mode = "resync"

    def update_tcp(self, srtt_us: int, retrans: int) -> None:
        if srtt_us:
            self.srtt_us = srtt_us
        self.retrans = retrans

    def _finalize_fields(self, ex: Exchange) -> Exchange:
        if self.srtt_us:
            ex.srtt_us = self.srtt_us
        d = self.retrans - ex.retrans_start
        ex.retransmits = d if d > 0 else 0
        return ex

    _finish = _finalize_fields  # one call fewer per record than a wrapper

    # -- WebSocket ------------------------------------------------------------------
    def _ws_frames(self, data: bytes, n: int) -> int:
        """Count client data frames (text/binary) that start in this read."""
        count = 0
        pos = 0
        skip = self.ws_skip
        if skip >= n:
            self.ws_skip = skip - n
            return 0
        pos = skip
        self.ws_skip = 0
        while pos + 2 <= len(data):
            b0, b1 = data[pos], data[pos + 1]
            opcode = b0 & 0x0F
            ln = b1 & 0x7F
            hl = 2
            if ln == 126:
                if pos + 4 > len(data):
                    break
                ln = int.from_bytes(data[pos + 2 : pos + 4], "big")
                hl = 4
            elif ln == 127:
                if pos + 10 > len(data):
                    break
                ln = int.from_bytes(data[pos + 2 : pos + 10], "big")
                hl = 10
                if ln >> 63:
                    # RFC 6455 5.2: the top bit must be 0, and the server fails the
                    # connection. Not a length to skip (it would hide every later frame):
                    # the rest of this read is not framed, the next read starts afresh.
                    break
            if b1 & 0x80:
                hl += 4
            if opcode in (1, 2):
                count += 1
            end = pos + hl + ln
            if end > n:
                self.ws_skip = end - n
                break
            pos = end
        return count

    def _ws_read(self, t: int, n: int, data: bytes, t_arr: int) -> list[Exchange]:
        frames = self._ws_frames(data, n)
        if frames == 0 or self.ws_upgrade is None:
            return []
        out: list[Exchange] = []
        if self.ws_cur is not None and self.ws_cur.t2:
            out.append(self._finalize_fields(self.ws_cur))
        up = self.ws_upgrade
        self.ws_seq += frames
        self.ws_cur = Exchange(
            up.method,
            up.path,
            up.version,
            up.traceparent,
            up.traceparent_missed,
            t1=t,
            t_arr=t_arr,
            status=101,
            bytes_in=n,
            srtt_us=self.srtt_us,
            retrans_start=self.retrans,
            ws_seq=self.ws_seq,
            sample_th=up.sample_th,
        )
        return out

    def _ws_writes(
        self,
        t_last: int,
        times: list[int],
        n: int,
        nbytes: int,
        gap_max_ns: int,
        hold: Hold | None = None,
    ) -> list[Exchange]:
        ex = self.ws_cur
        if ex is None:
            return []
        if not ex.t2 and times:
            ex.t2 = times[0]
        self._merge_writes(ex, t_last, times, n, nbytes, gap_max_ns)
        if hold is not None:
            ex.hold = merge_hold(ex.hold, hold)
        return []
