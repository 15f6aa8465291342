"""WebSocket after an HTTP/1.1 ``101 Switching Protocols`` (pure Python): one exchange per
turn — each client data frame starts one; the server's frames until the next client frame
belong to it (a chat: the prompt, then the streamed answer).

The kernel sends the connection's reads (client frames, masked: only their headers are
read, to count data frames) and aggregates the server's writes (control frames — ping, pong,
close — are left out in the kernel: a keepalive would stretch a turn to the idle time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.kernel import events
from agent.kernel.events import Hold
from agent.protocols.base import ConnParser
from agent.protocols.exchange import Exchange
from agent.protocols.streams.dialect import WS
from agent.protocols.streams.dialects import BY_FRAMING
from agent.protocols.streams.framing import WsFramer
from agent.protocols.streams.stream import Engine, Stream

if TYPE_CHECKING:
    from agent.protocols.http1 import Stats

_READ = events.READ_NOADDR.unpack_from
_READ_DATA = events.READ_DATA
_HDR_SIZE = events.HDR.size
_AGG = events.AGG.unpack_from
_BODY = events.BODY.unpack_from
_BODY_DATA = events.BODY_DATA


class WsConn:
    """One upgraded connection (agent.protocols.base.ConnParser)."""

    upgraded: ConnParser | None = None

    def __init__(
        self,
        upgrade: Exchange,
        stats: Stats,
        requests: int,
        extensions: bytes = b"",
        engine: Engine | None = None,
    ) -> None:
        self.up = upgrade  # the upgrade request: method, path and trace of every turn
        self.stats = stats
        self.requests = requests
        self.srtt_us = upgrade.srtt_us
        self.retrans = 0
        self.rtx_wait_us = 0
        self.rtx_timed = 0
        self.cur: Exchange | None = None
        self.seq = 0  # client data frames so far
        self.skip = 0  # bytes of a client frame still to come in later reads
        self.closed = False
        self.engine = engine
        # the server's messages (EV_BODY) → the turn's stream (LLM dialects over WebSocket)
        self.framer = WsFramer(
            self._message,
            deflate=b"permessage-deflate" in extensions,
            takeover=b"server_no_context_takeover" not in extensions,
        )

    def _message(self, name: bytes, data: bytes, truncated: bool) -> None:
        if self.cur is not None and self.cur.stream is not None:
            self.cur.stream.event(name, data, truncated)

    @property
    def gave_up_unparsed(self) -> bool:
        return False

    # -- events -------------------------------------------------------------------------
    def on_event(self, typ: int, raw: bytes, t: int, sample_th: int) -> list[Exchange]:
        if self.closed:
            return []
        if typ == events.EV_READ:
            _te, _ta, t_arr, n, caplen = _READ(raw, _HDR_SIZE)[:5]
            return self.on_read(t, n, raw[_READ_DATA : _READ_DATA + caplen], t_arr)
        if typ == events.EV_WAGG:
            t_first, t_last, nbytes, gap, n, flags = _AGG(raw, _HDR_SIZE)
            offs = events.offsets(raw, events.OFFS_AT, n)
            return self.on_writes(t_last, t_first, offs, n, nbytes, gap, flags, events.hold_at(raw))
        if typ == events.EV_BODY:
            n, caplen, tail, _ = _BODY(raw, _HDR_SIZE)
            end = _BODY_DATA + caplen
            self.on_body(t, n, raw[_BODY_DATA:end], raw[end : end + tail])
        return []  # (a response head on a WebSocket: nothing the server would send)

    def on_body(self, t: int, n: int, head: bytes, tail: bytes = b"") -> None:
        """The server's frames in one write, with their bytes."""
        if self.cur is not None and self.cur.stream is not None:
            self.cur.stream.t_write = t
        f = self.framer
        if len(head) >= n:
            f.feed(head[:n])
            return
        have = len(head) + len(tail)
        if have >= n:
            f.feed(head + tail[have - n :])
            return
        f.feed(head)
        f.gap(n - have)
        if tail:
            f.feed(tail)

    def frames(self, data: bytes, n: int) -> int:
        """Client data frames (text, binary) that start in this read of ``n`` bytes, of
        which ``data`` were captured."""
        count = 0
        skip = self.skip
        if skip >= n:
            self.skip = skip - n
            return 0
        pos = skip
        self.skip = 0
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
                self.skip = end - n
                break
            pos = end
        return count

    def on_read(self, t: int, n: int, data: bytes, t_arr: int = 0) -> list[Exchange]:
        frames = self.frames(data, n) if n > 0 else 0
        if frames == 0:
            return []
        out: list[Exchange] = []
        # the connection's retransmits, shared out by turn: the previous turn's (or the
        # upgrade request's) share ends where this one begins
        tcp = (self.retrans, self.rtx_wait_us, self.rtx_timed)
        self.up.end_tcp(*tcp)
        if self.cur is not None and self.cur.t2:
            self.cur.end_tcp(*tcp)
            out.append(self.cur.finish_tcp(self.srtt_us, *tcp))
        up = self.up
        self.seq += frames
        self.cur = Exchange(
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
            retrans_start=tcp[0],
            rtx_wait_start=tcp[1],
            rtx_timed_start=tcp[2],
            tcp_hold=True,
            ws_seq=self.seq,
            sample_th=up.sample_th,
        )
        self.cur.stream = Stream(BY_FRAMING[WS], t, self.engine)
        return out

    def on_writes(
        self,
        t_last: int,
        t_first: int,
        offs_us: tuple[int, ...],
        n: int,
        nbytes: int,
        gap_max_ns: int,
        flags: int = 0,
        hold: Hold | None = None,
    ) -> list[Exchange]:
        """Server frames the kernel aggregated: they belong to the turn in progress (a
        turn ends at the next client frame, never at a write's flags)."""
        ex = self.cur
        if ex is None:
            return []
        if not ex.t2 and offs_us:
            ex.t2 = t_first + offs_us[0] * 1000
        ex.merge_writes(t_last, t_first, offs_us, n, nbytes, gap_max_ns, hold)
        return []

    # -- the end ------------------------------------------------------------------------
    def on_peer_fin(self, t: int) -> None:
        if self.cur is not None and not self.cur.t_peer_fin:
            self.cur.t_peer_fin = t
            if self.cur.stream is not None:
                self.cur.stream.client_left(t)

    def _end(self, partial: bool) -> list[Exchange]:
        out: list[Exchange] = []
        if self.cur is not None and self.cur.t2:
            self.cur.partial = partial
            out.append(
                self.cur.finish_tcp(self.srtt_us, self.retrans, self.rtx_wait_us, self.rtx_timed)
            )
        self.cur = None
        self.closed = True
        return out

    def on_close(self, t: int, server_gone: bool) -> list[Exchange]:
        return self._end(partial=False)

    def flush_inflight(self) -> list[Exchange]:
        return self._end(partial=True)

    def on_loss(self) -> None:
        if self.cur is not None:
            self.stats.lost_exchanges += 1
        self.cur = None  # the next client frame starts afresh

    def in_flight(self) -> list[int]:
        return [self.cur.t1] if self.cur is not None and self.cur.t1 else []

    def after_error(self) -> ConnParser | None:
        self.on_loss()
        self.skip = 0
        return self
