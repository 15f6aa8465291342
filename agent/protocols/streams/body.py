"""A response body read as an LLM stream: the writes the kernel copied → framing → the
exchange's :class:`~agent.protocols.streams.stream.Stream` (HTTP/1; a WebSocket
connection frames its server messages itself, agent.protocols.websocket)."""

from __future__ import annotations

from agent.protocols.streams.dialect import NDJSON, SSE
from agent.protocols.streams.dialects import BY_FRAMING
from agent.protocols.streams.framing import Dechunk, Framer, LineFramer, SseFramer
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

    __slots__ = ("framer", "stream", "top")

    def __init__(self, stream: Stream, framing: str, chunked: bool) -> None:
        self.stream = stream
        self.framer: Framer = (SseFramer if framing == SSE else LineFramer)(stream.event)
        self.top: Framer | Dechunk = Dechunk(self.framer) if chunked else self.framer

    def write(self, t: int, n: int, head: bytes, tail: bytes = b"") -> None:
        """One body write at ``t`` of ``n`` bytes: ``head`` its first bytes, ``tail`` its
        last ones (a write longer than the copy: the bytes between are a gap)."""
        self.stream.t_write = t
        top = self.top
        if len(head) >= n:
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


def open_body(framing: str, chunked: bool, t1: int, engine: Engine | None) -> BodyReader:
    return BodyReader(Stream(BY_FRAMING[framing], t1, engine), framing, chunked)
