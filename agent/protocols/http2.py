"""HTTP/2 (h2c with prior knowledge, gRPC; h2 over TLS through the SSL probes): one
connection's kernel events → one :class:`agent.protocols.http1.Exchange` per stream (pure Python).

The kernel (bpf/agent/proto/http2.h) sends each read and write of a connection that began with the
client preface: its time, its byte count and its first bytes (a window). Here each direction
is framed as a byte stream — the remainder of a frame that spans reads or writes is carried
over — and the header blocks (HEADERS, CONTINUATION, PUSH_PROMISE) are decoded by
:mod:`agent.protocols.hpack_decode` (the ``hpack`` package's decoder, lean): one per
direction, the client's encoder's for requests and the server's for responses and trailers,
so that the dynamic tables stay in step. Every block is
decoded, those of streams that are not recorded too, or the tables would drift.

Per stream: t1 = the read carrying its request HEADERS frame, t2 = the write carrying its
first response HEADERS, every DATA frame with a payload written = one chunk (at its write),
the end = END_STREAM on the server's side (trailers: ``grpc-status``) or RST_STREAM.

What cannot be framed is never guessed: a frame header beyond the captured bytes, a header
block that does not decode, lost events — the connection is desynchronised (counted per
reason in :class:`H2Stats`) and emits no record from then on; its streams in flight are
counted as lost. Only ``:method``, ``:path``, ``:status``, ``traceparent``, ``content-type``
(is it gRPC?) and ``grpc-status`` are read from a block; the rest is dropped at once.
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass, field

from hpack import HPACKError

from agent.kernel import events
from agent.protocols.base import ConnParser
from agent.protocols.exchange import Exchange
from agent.protocols.hpack_decode import Decoder
from agent.protocols.http1_head import clean_path
from agent.protocols.streams.stream import Engine
from parallax_contracts import trace_context

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PUSH_PROMISE, CONTINUATION = 0, 1, 3, 4, 5, 9
END_STREAM, END_HEADERS, PADDED, PRIORITY = 0x1, 0x4, 0x8, 0x20
SETTINGS_HEADER_TABLE_SIZE = 1
MAX_BLOCK = 1 << 20  # a header block larger than this is not buffered: desync
MAX_STREAMS = 1024  # streams in flight per connection before new ones are not followed
_NEEDED = frozenset((HEADERS, CONTINUATION, PUSH_PROMISE, RST_STREAM, SETTINGS))  # payload read

# EV_H2 (bpf/agent/proto/http2.h): READ's layout, its ``skipped`` field carrying the
# direction, then the kernel's frame walk
_HDR_SIZE = events.HDR.size
_READ = events.READ_NOADDR.unpack_from
_WALK = events.H2_WALK.unpack_from
_WALK_AT = events.READ_DATA
_HDRS_AT = events.READ_DATA + events.H2_WALK.size
_DATA = events.H2_DATA


@dataclass(slots=True)
class H2Stats:
    desync: Counter[str] = field(default_factory=Counter)  # connections, per reason
    streams: int = 0  # stream records emitted
    lost_streams: int = 0  # streams in flight when their connection desynchronised
    unanswered: int = 0  # streams whose request was read but never answered


class _Dir:
    """One direction's framing state."""

    __slots__ = (
        "block",
        "block_end",
        "block_push",
        "block_sid",
        "decoder",
        "frame",
        "hdr",
        "payload",
        "skip",
        "t_frame",
        "t_hdr",
    )

    def __init__(self) -> None:
        self.decoder = Decoder()
        self.hdr = b""  # a frame header split across events (fewer than 9 bytes)
        self.skip = 0  # payload bytes of the current frame still to pass over
        self.frame: tuple[int, int, int, int] | None = None  # (len, type, flags, sid) whose
        self.payload = bytearray()  # payload is being gathered across events
        self.block = bytearray()  # a header block awaiting its CONTINUATION frames
        self.block_sid = 0
        self.block_end = False  # its HEADERS frame had END_STREAM
        self.block_push = False  # it is a PUSH_PROMISE's (decoded for the table only)
        self.t_frame = 0  # the event time of the frame whose payload is being gathered
        self.t_hdr = 0  # the event time of the split frame header's first bytes


class _Capture:
    """What the kernel copied of one read or write: its first bytes (``head``) and, for a
    plain buffer longer than the copy, its last ones (``tail``, from offset ``tail_at``)."""

    __slots__ = ("head", "tail", "tail_at")

    def __init__(self, head: bytes, tail: bytes, tail_at: int) -> None:
        if tail and tail_at <= len(head):  # the two meet: the whole event was copied
            head, tail = head[:tail_at] + tail, b""
        self.head, self.tail, self.tail_at = head, tail, tail_at

    def get(self, a: int, b: int) -> bytes | None:
        """Bytes [a, b) of the event, or None where they were not copied."""
        if b <= len(self.head):
            return self.head[a:b]
        if self.tail and a >= self.tail_at and b - self.tail_at <= len(self.tail):
            return self.tail[a - self.tail_at : b - self.tail_at]
        return None


_FRAME_HDR = struct.Struct(">BHBBI")  # length's high byte and low 16 bits, type, flags, sid


def _header(h: bytes, at: int = 0) -> tuple[int, int, int, int]:
    """The (length, type, flags, stream id) of the frame header at ``h[at:at + 9]``."""
    hi, lo, typ, flags, sid = _FRAME_HDR.unpack_from(h, at)
    return hi << 16 | lo, typ, flags, sid & 0x7FFFFFFF


class Desync(Exception):  # noqa: N818  (control flow inside the framer, never raised out)
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class H2Conn:
    """One HTTP/2 connection (agent.protocols.base.ConnParser). Feed its events in kernel
    order; each call returns the stream exchanges it completed."""

    upgraded: ConnParser | None = None
    engine: Engine | None = None  # (LLM streams over HTTP/2 are not read yet)

    def __init__(self, stats: H2Stats) -> None:
        self.stats = stats
        self.rx = _Dir()  # client → server (reads)
        self.tx = _Dir()  # server → client (writes)
        self.preface_left = len(PREFACE)
        self.streams: dict[int, Exchange] = {}
        self.dead: str | None = None  # the desync reason
        self.requests = 0
        self.t_acc = 0
        self.t_est = 0
        self.t_arr = 0  # the arrival of the read being framed
        self.srtt_us = 0
        self.retrans = 0
        self.rtx_wait_us = 0
        self.rtx_timed = 0
        self.peer_fin = False
        self._out: list[Exchange] = []

    @property
    def gave_up_unparsed(self) -> bool:
        return False  # (the kernel saw its preface: it is HTTP/2, desynchronised or not)

    # -- the seam ---------------------------------------------------------------------
    def on_event(self, typ: int, raw: bytes, t: int, sample_th: int) -> list[Exchange]:
        """An EV_H2 record: a read (direction 0) or a write (1) of the connection, the
        bytes the kernel copied, the frame headers its walk found past the copy (by offset)
        and a long plain buffer's last bytes."""
        t_est, t_acc, t_arr, n, caplen, _lp, _rp, _fam, direction = _READ(raw, _HDR_SIZE)
        data = raw[_DATA : _DATA + caplen]
        walk = _WALK(raw, _WALK_AT)
        past: dict[int, bytes] | None = None
        if walk[1]:  # frame headers past the copy, found by the kernel's walk
            past = {
                walk[3 + i]: bytes(raw[_HDRS_AT + 12 * i : _HDRS_AT + 12 * i + 9])
                for i in range(min(walk[1], events.H2_HDRS))
            }
        tail = raw[_DATA + caplen : _DATA + caplen + walk[2]] if walk[2] else b""
        if direction == 0:
            return self.on_read(t, n, data, t_arr, t_acc, t_est, past, tail)
        return self.on_write(t, n, data, past, tail)

    def in_flight(self) -> list[int]:
        """Its streams answered and open."""
        return [ex.t1 for ex in list(self.streams.values()) if ex.t2]

    def after_error(self) -> ConnParser | None:
        """An HTTP/2 connection is not picked up again (its HPACK state is lost)."""
        self.on_loss()
        return self

    # -- events -----------------------------------------------------------------------
    def on_read(
        self,
        t: int,
        n: int,
        data: bytes,
        t_arr: int = 0,
        t_acc: int = 0,
        t_est: int = 0,
        past: dict[int, bytes] | None = None,
        tail: bytes = b"",
    ) -> list[Exchange]:
        """``past``: frame headers past the captured bytes, by offset (the kernel's walk);
        ``tail``: the event's last bytes (a long plain buffer's)."""
        if t_acc:
            self.t_acc = t_acc
        if t_est:
            self.t_est = t_est
        if self.dead is not None or n <= 0:
            return []
        self.t_arr = t_arr
        pos = 0
        if self.preface_left:
            take = min(self.preface_left, n)
            if data[:take] != PREFACE[len(PREFACE) - self.preface_left :][:take]:
                self._desync("preface")
                return []
            self.preface_left -= take
            pos = take
        return self._feed(self.rx, t, n, _Capture(data, tail, n - len(tail)), pos, True, past)

    def on_write(
        self,
        t: int,
        n: int,
        data: bytes,
        past: dict[int, bytes] | None = None,
        tail: bytes = b"",
    ) -> list[Exchange]:
        if self.dead is not None or n <= 0:
            return []
        return self._feed(self.tx, t, n, _Capture(data, tail, n - len(tail)), 0, False, past)

    def on_loss(self) -> None:
        """Events were lost: neither the framing nor the HPACK tables can be trusted."""
        self._desync("lost_events")

    def on_peer_fin(self, t: int = 0) -> None:
        self.peer_fin = True

    def on_close(self, t: int = 0, server_gone: bool = False) -> list[Exchange]:
        """The connection ended: answered streams still open are emitted (cut short by the
        client, or partial when the server went away), unanswered ones counted."""
        return self._end(partial=server_gone and not self.peer_fin, aborted=self.peer_fin)

    def flush_inflight(self) -> list[Exchange]:
        """The agent is stopping: answered streams still open as partial records."""
        return self._end(partial=True, aborted=False)

    def _end(self, partial: bool, aborted: bool) -> list[Exchange]:
        out: list[Exchange] = []
        for ex in self.streams.values():
            if ex.t2 and self.dead is None:
                ex.partial = partial
                ex.client_aborted = aborted
                out.append(self._finish(ex))
            elif not ex.t2:
                self.stats.unanswered += 1
        self.streams.clear()
        self.dead = self.dead or "closed"
        return out

    # -- framing ----------------------------------------------------------------------
    def _desync(self, reason: str) -> None:
        if self.dead is None:
            self.stats.desync[reason] += 1
            self.stats.lost_streams += len(self.streams)
        self.dead = reason
        self.streams.clear()

    def _feed(
        self,
        d: _Dir,
        t: int,
        n: int,
        cv: _Capture,
        pos: int,
        rx: bool,
        past: dict[int, bytes] | None = None,
    ) -> list[Exchange]:
        """Frame ``n`` bytes of one direction, of which ``cv`` holds what was captured and
        ``past`` the frame headers the kernel's walk found beyond; ``pos``: where framing
        starts."""
        self._out = []
        try:
            while pos < n:
                if d.skip:  # the rest of a payload that is not needed
                    take = min(d.skip, n - pos)
                    d.skip -= take
                    pos += take
                    continue
                if d.frame is not None:  # a needed payload gathered across events
                    ln = d.frame[0] - len(d.payload)
                    take = min(ln, n - pos)
                    got = cv.get(pos, pos + take)
                    if got is None:
                        raise Desync("payload_beyond_capture")
                    d.payload += got
                    pos += take
                    if len(d.payload) == d.frame[0]:
                        frame, d.frame = d.frame, None
                        self._frame(d, frame, bytes(d.payload), d.t_frame, rx)
                        d.payload.clear()
                    continue
                if not d.hdr and pos + 9 <= len(cv.head) and pos + 9 <= n:
                    # the common case first: a whole frame header in the copy's head
                    pos = self._frame_start(d, _header(cv.head, pos), t, n, cv, pos + 9, rx)
                    continue
                need = 9 - len(d.hdr)
                hb = cv.get(pos, pos + min(need, n - pos))
                if hb is None:
                    h = past.get(pos) if past is not None and not d.hdr else None
                    if h is None:
                        raise Desync("header_beyond_capture")
                    # a header the kernel's walk read past the copy (a large frame before it)
                    pos = self._frame_start(d, _header(h), t, n, cv, pos + 9, rx)
                    continue
                if n - pos < need:  # the header continues in the next event
                    if not d.hdr:
                        d.t_hdr = t
                    d.hdr += hb
                    break
                # a frame's time is that of the event its first byte came in
                t_f = t
                if d.hdr:
                    h, t_f = d.hdr + hb, d.t_hdr
                    d.hdr = b""
                else:
                    h = hb
                pos += need
                pos = self._frame_start(d, _header(h), t_f, n, cv, pos, rx)
        except Desync as e:
            self._desync(e.reason)
            return []
        return self._out

    def _frame_start(
        self,
        d: _Dir,
        frame: tuple[int, int, int, int],
        t: int,
        n: int,
        cv: _Capture,
        pos: int,
        rx: bool,
    ) -> int:
        """A frame header was read at ``t``: act on what the header alone says, then pass
        over its payload or gather it. Returns the new position."""
        ln, typ, flags, sid = frame
        if d.block and typ != CONTINUATION:
            raise Desync("continuation_expected")
        if typ not in _NEEDED:
            if typ == DATA:
                self._data(sid, ln, flags, t, rx)
            # (PING, PRIORITY, WINDOW_UPDATE, GOAWAY, unknown: nothing needed.) The payload
            # is passed over: what this event holds of it now, the rest in the next events.
            take = min(ln, n - pos)
            d.skip = ln - take
            return pos + take
        if ln > MAX_BLOCK:
            raise Desync("frame_too_large")
        end = pos + ln
        if end <= n:  # the whole payload is in this event
            got = cv.get(pos, end)
            if got is None:
                raise Desync("payload_beyond_capture")
            self._frame(d, frame, bytes(got), t, rx)
            return end
        d.frame = frame
        d.t_frame = t
        d.payload.clear()
        return pos

    def _frame(self, d: _Dir, frame: tuple[int, int, int, int], p: bytes, t: int, rx: bool) -> None:
        """A whole frame whose payload is needed (t: the event its header came in)."""
        ln, typ, flags, sid = frame
        if typ == SETTINGS:
            if not flags & 0x1:  # not an ACK: a table size bounds the *other* side's encoder
                other = self.tx if rx else self.rx
                for i in range(0, len(p) - 5, 6):
                    if int.from_bytes(p[i : i + 2], "big") == SETTINGS_HEADER_TABLE_SIZE:
                        size = int.from_bytes(p[i + 2 : i + 6], "big")
                        other.decoder.max_allowed_table_size = size
            return
        if typ == RST_STREAM:
            ex = self.streams.pop(sid, None)
            if ex is not None:
                ex.bytes_in += 9 + ln if rx else 0
                if ex.t2:
                    if not rx:  # (t_end stays the last response write, as in HTTP/1)
                        ex.t_end = max(ex.t_end, t)
                    ex.client_aborted = rx
                    ex.partial = not rx
                    self._out.append(self._finish(ex))
                else:
                    self.stats.unanswered += 1
            return
        if typ == CONTINUATION:
            if not d.block or sid != d.block_sid:
                raise Desync("continuation_unexpected")
            d.block += p
            if len(d.block) > MAX_BLOCK:
                raise Desync("frame_too_large")
            if flags & END_HEADERS:
                block, d.block = bytes(d.block), bytearray()
                self._block(d, d.block_sid, block, d.t_frame, d.block_end, d.block_push, rx, ln + 9)
            return
        # HEADERS or PUSH_PROMISE: padding and priority fields around the block
        start, stop = 0, len(p)
        if flags & PADDED:
            if not p:
                raise Desync("bad_frame")
            stop -= p[0]
            start = 1
        if typ == HEADERS and flags & PRIORITY:
            start += 5
        elif typ == PUSH_PROMISE:
            start += 4  # the promised stream id: server push is not recorded
        if start > stop:
            raise Desync("bad_frame")
        block = p[start:stop]
        end, push = bool(flags & END_STREAM) and typ == HEADERS, typ == PUSH_PROMISE
        if not flags & END_HEADERS:
            d.block = bytearray(block)
            d.block_sid, d.block_end, d.block_push, d.t_frame = sid, end, push, t
            return
        self._block(d, sid, block, t, end, push, rx, ln + 9)

    def _block(
        self, d: _Dir, sid: int, block: bytes, t: int, end: bool, push: bool, rx: bool, size: int
    ) -> None:
        """A whole header block: decoded (always: the dynamic table), then read."""
        try:
            headers = d.decoder.decode(block)
        except HPACKError:
            raise Desync("hpack") from None
        if push:
            return  # server push is not recorded (decoded for the dynamic table only)
        if rx:
            self._request(sid, headers, t, size)
        else:
            self._response(sid, headers, t, end, size)

    def _request(self, sid: int, headers: list[tuple[bytes, bytes]], t: int, size: int) -> None:
        ex = self.streams.get(sid)
        if ex is not None:  # the client's trailers: the request's end
            ex.bytes_in += size
            return
        method = path = tp = ctype = None
        for name, value in headers:
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
            elif name == b"traceparent":
                tp = value
            elif name == b"content-type":
                ctype = value
        if method is None or path is None:
            return
        self.requests += 1
        if len(self.streams) >= MAX_STREAMS:
            return
        ctx = trace_context.parse(tp.decode("latin-1")) if tp is not None else None
        ex = Exchange(
            method.decode("latin-1"),
            clean_path(path.decode("latin-1")),
            "2",
            ctx,
            False,
            t1=t,
            t_arr=self.t_arr,
            srtt_us=self.srtt_us,
            bytes_in=size,
        )
        if self.requests > 1:  # (the first stream's count begins with the connection's)
            ex.retrans_start, ex.rtx_wait_start = self.retrans, self.rtx_wait_us
            ex.rtx_timed_start = self.rtx_timed
        self.t_arr = 0  # one arrival per read: the next stream of the read has none
        if ctype is not None and ctype.startswith(b"application/grpc"):
            ex.rpc_system = "grpc"
        if self.requests == 1:
            ex.t_acc, ex.t_est = self.t_acc, self.t_est
        self.streams[sid] = ex

    def _response(
        self, sid: int, headers: list[tuple[bytes, bytes]], t: int, end: bool, size: int
    ) -> None:
        ex = self.streams.get(sid)
        if ex is None:
            return
        ex.bytes_out += size
        status = grpc_status = None
        for name, value in headers:
            if name == b":status":
                status = value
            elif name == b"grpc-status":
                grpc_status = value
        if status is not None:
            code = int(status) if status.isdigit() else 0
            if 100 <= code < 200:
                return  # interim: the final head follows
            if not ex.t2:
                ex.t2 = t
                ex.status = code
        if grpc_status is not None and grpc_status.isdigit():
            ex.grpc_status = int(grpc_status)
        ex.t_end = max(ex.t_end, t)
        if end:
            self._close_stream(sid, ex)

    def _data(self, sid: int, ln: int, flags: int, t: int, rx: bool) -> None:
        ex = self.streams.get(sid)
        if ex is None:
            return
        if rx:
            ex.bytes_in += 9 + ln
            return
        if not ex.t2:
            return  # DATA before the response's HEADERS: a protocol error
        ex.bytes_out += 9 + ln
        if ln:
            ex.add_body_write(t)
            ex.body_out += ln
        ex.t_end = max(ex.t_end, t)
        if flags & END_STREAM:
            self._close_stream(sid, ex)

    def _close_stream(self, sid: int, ex: Exchange) -> None:
        del self.streams[sid]
        ex.ended = True
        self._out.append(self._finish(ex))

    def _finish(self, ex: Exchange) -> Exchange:
        self.stats.streams += 1
        return ex.finish_tcp(self.srtt_us, self.retrans, self.rtx_wait_us, self.rtx_timed)
