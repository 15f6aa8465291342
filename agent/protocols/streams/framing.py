"""Framing a response body into events, across writes, in bounded memory (pure Python).

What the kernel sends of a body write (bpf/agent/proto/stream.h) is its first bytes and,
for a write longer than that copy, its last ones: the bytes between are unknown (a
``gap``). Layers, each fed in order:

- :class:`Dechunk` takes HTTP/1's chunked transfer coding off (chunk sizes seen in the copy
  let it follow the framing across a gap that lies inside a chunk's data);
- :class:`SseFramer` cuts Server-Sent Events (``data:`` lines, ``event:``, comments,
  ``\\n\\n`` / ``\\r\\n\\r\\n`` / ``\\r\\r``), :class:`LineFramer` NDJSON lines;
- :class:`WsFramer` takes a WebSocket server's frames apart (text messages; permessage-deflate
  inflated with the connection's context).

An event that a gap touched, or that outgrew :data:`MAX_EVENT`, comes out marked
``truncated`` with what was seen of it (its head); the stream counts why.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

MAX_EVENT = 64 * 1024  # an event longer than this is not buffered whole: its head is kept
KEEP_HEAD = 4096  # what is kept of an event too long or truncated, for its classification
MAX_SIZE_LINE = 32  # a chunk-size line longer than this is not HTTP/1 chunked coding

# (event name or b"" , payload, truncated) — payload: SSE data lines joined, an NDJSON line,
# a WebSocket message
Sink = Callable[[bytes, bytes, bool], None]


class Dechunk:
    """HTTP/1 chunked transfer coding → the body's bytes, piece by piece."""

    __slots__ = ("crlf", "done", "left", "line", "lost", "out")

    def __init__(self, out: Framer) -> None:
        self.out = out
        self.left = 0  # data bytes of the current chunk still to come
        self.crlf = 0  # bytes of the CRLF after a chunk's data still to pass over
        self.line = b""  # a chunk-size line split across writes
        self.done = False  # the last chunk (size 0) was seen
        self.lost = False  # the framing could not be followed (a gap over a size line)

    def feed(self, data: bytes) -> None:
        if not self.left and not self.crlf and not self.line and not self.lost and not self.done:
            # the common case: a write that is one whole chunk (a server's event per write)
            i = data.find(b"\r\n")
            if 0 < i <= MAX_SIZE_LINE and data.endswith(b"\r\n"):
                try:
                    size = int(data[:i], 16)
                except ValueError:
                    size = -1
                if size > 0 and len(data) == i + 4 + size:
                    self.out.feed(data[i + 2 : i + 2 + size])
                    return
        pos, n = 0, len(data)
        while pos < n and not self.lost and not self.done:
            if self.left:
                take = min(self.left, n - pos)
                self.out.feed(data[pos : pos + take])
                self.left -= take
                pos += take
                if not self.left:
                    self.crlf = 2
                continue
            if self.crlf:
                take = min(self.crlf, n - pos)
                self.crlf -= take
                pos += take
                continue
            end = data.find(b"\n", pos)
            if end < 0:
                self.line += data[pos:]
                if len(self.line) > MAX_SIZE_LINE:
                    self.lost = True
                return
            line = (self.line + data[pos:end]).split(b";", 1)[0].strip()
            self.line = b""
            pos = end + 1
            try:
                size = int(line, 16)
            except ValueError:
                self.lost = True
                return
            if size == 0:
                self.done = True
            self.left = size

    def gap(self, nbytes: int) -> None:
        """``nbytes`` not copied: followed only while they lie inside one chunk's data."""
        if self.lost or self.done:
            return
        if self.left >= nbytes and not self.line and not self.crlf:
            self.left -= nbytes
            if not self.left:
                self.crlf = 2
            self.out.gap(nbytes)
        else:
            self.lost = True
            self.out.gap(nbytes)


class Framer:
    """What a body's bytes go to (SSE or NDJSON events)."""

    __slots__ = ("buf", "cut", "over", "sink")

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.buf = bytearray()
        self.cut = False  # the event in the buffer lost bytes (a gap, or it grew too long)
        self.over = False  # the event in the buffer outgrew MAX_EVENT: bytes dropped

    def feed(self, data: bytes) -> None:
        raise NotImplementedError

    def gap(self, nbytes: int) -> None:
        """Bytes of the body that were not copied: the event they fall in is truncated."""
        self.cut = True

    def _grow(self, data: bytes) -> None:
        """Append to an unfinished event, within bounds."""
        if self.over:
            return
        self.buf += data
        if len(self.buf) > MAX_EVENT:
            del self.buf[KEEP_HEAD:]
            self.over = self.cut = True


def _next_sep(buf: bytearray | bytes, start: int) -> tuple[int, int]:
    """The first blank line (SSE's event end) at or after ``start``: (its start, its length),
    or (-1, 0)."""
    best, ln = -1, 0
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        i = buf.find(sep, start)
        if i >= 0 and (best < 0 or i < best):
            best, ln = i, len(sep)
    return best, ln


def sse_event(block: bytes) -> tuple[bytes, bytes] | None:
    """The common SSE event without the general parse: one ``data:`` line, or an
    ``event:`` line then one ``data:`` line, LF-separated. None: anything else. (``13 in``:
    an int is looked for with memchr, several times faster than ``b"\\r" in``.)"""
    if 13 in block:
        return None
    name = b""
    if block.startswith(b"event:"):
        nl = block.find(b"\n")
        if nl < 0:
            return None
        name = block[7:nl] if block[6:7] == b" " else block[6:nl]
        block = block[nl + 1 :]
    if not block.startswith(b"data:") or 10 in block:
        return None
    return name, block[6:] if block[5:6] == b" " else block[5:]


class SseFramer(Framer):
    """Server-Sent Events: an event ends at a blank line; its ``data:`` lines are joined
    with ``\\n``; comment lines (``:``) are heartbeats; ``event:`` names it."""

    __slots__ = ()

    def feed(self, data: bytes) -> None:
        if not self.buf and not self.over and data.endswith(b"\n\n") and b"\r" not in data:
            # the common case: whole events, LF-separated, nothing pending
            blocks = data.split(b"\n\n")
            for block in blocks[:-1]:
                if block:
                    self._emit(block)
            return
        if self.over:  # dropping an over-long event's bytes until its end
            i, ln = _next_sep(data, 0)
            if i < 0:
                return
            self._emit(bytes(self.buf))
            data = data[i + ln :]
        buf = self.buf
        start = max(0, len(buf) - 3)  # a separator may straddle the old and new bytes
        buf += data
        while True:
            i, ln = _next_sep(buf, start)
            if i < 0:
                break
            self._emit(bytes(buf[:i]))
            del buf[: i + ln]
            start = 0
        if len(buf) > MAX_EVENT:
            del buf[KEEP_HEAD:]
            self.over = self.cut = True

    def _emit(self, block: bytes) -> None:
        truncated = self.cut
        self.cut = self.over = False
        common = sse_event(block)
        if common is not None:
            self.sink(common[0], common[1], truncated)
            return
        name = b""
        data: list[bytes] = []
        for line in block.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n"):
            if not line or line[0] == 58:  # ":" a comment (a heartbeat)
                continue
            field, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if field == b"data":
                data.append(value)
            elif field == b"event":
                name = value
        if data or name:
            self.sink(name, b"\n".join(data), truncated)
        # (a block of comments only: a heartbeat, no event)


class LineFramer(Framer):
    """Newline-delimited JSON (Ollama): one event per non-empty line."""

    __slots__ = ()

    def feed(self, data: bytes) -> None:
        if self.over:
            i = data.find(b"\n")
            if i < 0:
                return
            self._emit(bytes(self.buf))
            data = data[i + 1 :]
        buf = self.buf
        start = len(buf)  # (the buffer holds no newline: each was cut at)
        buf += data
        pos = 0
        while True:
            i = buf.find(b"\n", max(pos, start))
            if i < 0:
                break
            self._emit(bytes(buf[pos:i]))
            pos = i + 1
        if pos:
            del buf[:pos]
        if len(buf) > MAX_EVENT:
            del buf[KEEP_HEAD:]
            self.over = self.cut = True

    def _emit(self, line: bytes) -> None:
        truncated = self.cut
        self.cut = self.over = False
        line = line.strip()
        if line:
            self.sink(b"", line, truncated)


class WsFramer(Framer):
    """A WebSocket server's frames (unmasked) → one event per text or binary message.
    Control frames carry no tokens (the kernel leaves them out already). A message compressed
    with permessage-deflate is inflated with the connection's shared window, which a gap
    breaks for good (counted by the stream: ``deflate_lost``)."""

    __slots__ = (
        "frag",
        "hdr",
        "inflate",
        "left",
        "masked",
        "msg_rsv1",
        "opcode",
        "takeover",
        "zlost",
    )

    def __init__(self, sink: Sink, deflate: bool = False, takeover: bool = True) -> None:
        super().__init__(sink)
        self.hdr = b""  # a frame header split across writes
        self.left = 0  # payload bytes of the current frame still to come
        self.opcode = 0
        self.frag = False  # inside a fragmented message
        self.msg_rsv1 = False  # the message is compressed
        self.masked = False
        self.inflate = zlib.decompressobj(-15) if deflate else None
        self.zlost = False
        self.takeover = takeover  # the server keeps its deflate window across messages

    def feed(self, data: bytes) -> None:
        pos, n = 0, len(data)
        while pos < n:
            if self.left:
                take = min(self.left, n - pos)
                if self.opcode in (1, 2, 0):
                    self._grow(data[pos : pos + take])
                self.left -= take
                pos += take
                if not self.left:
                    self._frame_end()
                continue
            need = 2
            h = self.hdr + data[pos : pos + 14]
            if len(h) >= 2:
                ln = h[1] & 0x7F
                need = 2 + (2 if ln == 126 else 8 if ln == 127 else 0) + (4 if h[1] & 0x80 else 0)
            if len(h) < need:
                self.hdr = h
                return
            used = need - len(self.hdr)
            self.hdr = b""
            pos += used
            b0, b1 = h[0], h[1]
            ln = b1 & 0x7F
            if ln == 126:
                ln = int.from_bytes(h[2:4], "big")
            elif ln == 127:
                ln = int.from_bytes(h[2:10], "big")
            opcode = b0 & 0x0F
            if opcode in (1, 2):
                self.msg_rsv1 = bool(b0 & 0x40)
            if opcode in (1, 2, 0):
                self.opcode = opcode
                self.frag = not b0 & 0x80
            else:
                self.opcode = opcode  # a control frame (ping, pong, close): skipped
            self.masked = bool(b1 & 0x80)
            self.left = ln
            if not ln:
                self._frame_end()

    def _frame_end(self) -> None:
        if self.opcode not in (0, 1, 2) or self.frag:
            return
        payload = bytes(self.buf)
        truncated = self.cut
        self.buf.clear()
        self.cut = self.over = False
        if self.msg_rsv1 and self.inflate is not None:
            if truncated or self.zlost:
                self.zlost = True
                self.sink(b"deflate_lost", b"", True)
                return
            try:
                payload = self.inflate.decompress(payload + b"\x00\x00\xff\xff", MAX_EVENT)
            except zlib.error:
                self.zlost = True
                self.sink(b"deflate_lost", b"", True)
                return
            if not self.takeover:
                self.inflate = zlib.decompressobj(-15)
        self.sink(b"", payload, truncated)

    def gap(self, nbytes: int) -> None:
        """Bytes not copied: followed while they lie inside one frame's payload."""
        if self.left >= nbytes and not self.hdr:
            self.left -= nbytes
            self.cut = True
            if not self.left:
                self._frame_end()
        else:
            self.left = 0
            self.hdr = b""
            self.cut = True
            self.zlost = self.inflate is not None or self.zlost
