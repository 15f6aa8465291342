"""A response body read as an LLM stream: the writes the kernel copied → framing → the
exchange's :class:`~agent.protocols.streams.stream.Stream` (HTTP/1; a WebSocket
connection frames its server messages itself, agent.protocols.websocket)."""

from __future__ import annotations

from agent.protocols.streams.dialect import NDJSON, SSE
from agent.protocols.streams.dialects import BY_FRAMING
from agent.protocols.streams.framing import Dechunk, Framer, LineFramer, SseFramer, sse_event
from agent.protocols.streams.stream import Engine, Stream


def framing_of(content_type: bytes) -> str | None:
    """The framing a response's Content-Type (its value) announces: SSE, NDJSON, or None
    for a body that is no event stream. The kernel applies the same rule to decide which
    responses' writes it copies (bpf/agent/proto/stream.h)."""
    ct = content_type.lower()
    if b"event-stream" in ct:
        return SSE
    if b"ndjson" in ct or b"jsonl" in ct:
        return NDJSON
    return None


class BodyReader:
    """One response's body writes, in order, into its stream."""

    __slots__ = ("dechunk", "framer", "sse", "stream", "top")

    def __init__(self, stream: Stream, framing: str, chunked: bool) -> None:
        self.stream = stream
        self.framer: Framer = (SseFramer if framing == SSE else LineFramer)(stream.event)
        self.dechunk = Dechunk(self.framer) if chunked else None
        self.top: Framer | Dechunk = self.dechunk or self.framer
        self.sse = framing == SSE

    def write(self, t: int, n: int, head: bytes, tail: bytes = b"") -> None:
        """One body write at ``t`` of ``n`` bytes: ``head`` its first bytes, ``tail`` its
        last ones (a write longer than the copy: the bytes between are a gap)."""
        self.stream.t_write = t
        top = self.top
        if len(head) >= n:
            if self.sse and len(head) == n and self._one_event(head):
                return
            top.feed(head[:n])
            return
        have = len(head) + len(tail)
        if have >= n:  # head and tail overlap: the whole write
            top.feed(head + tail[have - n :])
            return
        top.feed(head)
        top.gap(n - have)
        if tail:
            top.feed(tail)

    def _one_event(self, w: bytes) -> bool:
        """The common write, handled without the layers: one whole chunk (or a plain
        write) holding one SSE event of one ``data:`` line, nothing pending. False: the
        layers take it."""
        d = self.dechunk
        if d is not None:
            if d.left or d.crlf or d.line or d.lost or d.done:
                return False
            i = w.find(b"\r\n")
            if not 0 < i <= 8 or w[-2:] != b"\r\n":
                return False
            try:
                size = int(w[:i], 16)
            except ValueError:
                return False
            if size <= 0 or len(w) != i + 4 + size:
                return False
            w = w[i + 2 : -2]
        f = self.framer
        if f.buf or f.over or w[-2:] != b"\n\n":
            return False
        ev = sse_event(w[:-2])
        if ev is None:
            return False
        self.stream.event(ev[0], ev[1], False)
        return True


def open_body(framing: str, chunked: bool, t1: int, engine: Engine | None) -> BodyReader:
    return BodyReader(Stream(BY_FRAMING[framing], t1, engine), framing, chunked)
