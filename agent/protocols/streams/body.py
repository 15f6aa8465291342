"""A response body read as an LLM stream: the writes the kernel copied → framing → the
exchange's :class:`~agent.protocols.streams.stream.Stream` (HTTP/1; a WebSocket
connection frames its server messages itself, agent.protocols.websocket)."""

from __future__ import annotations

import re

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


# The common write, one whole chunk (or a plain write) holding one event, as one match:
# groups (the chunk-size line, the SSE event name, the data or the NDJSON line; b"" where
# there is none). ``.`` stops at a newline, not at a CR: the SSE case is tested for CRs
# after. The size line is what precedes the first CRLF (1 to 8 bytes; read by int()):
# hex digits, as servers write it, tried first only because that is matched faster.
_SIZE = rb"([0-9a-f]{1,8}|(?:[^\r]|\r(?!\n)){1,8}?)\r\n"
_ONE_EVENT = {
    (SSE, True): _SIZE + rb"(?:event: ?(.*)\n)?data: ?(.*)\n\n\r\n",
    (SSE, False): rb"()(?:event: ?(.*)\n)?data: ?(.*)\n\n",
    (NDJSON, True): _SIZE + rb"()(.*)\n\r\n",
    (NDJSON, False): rb"()()(.*)\n",
}
_ONE_EVENT_MATCH = {k: re.compile(v).fullmatch for k, v in _ONE_EVENT.items()}


def _size_is(line: bytes, k: int) -> bool:
    """A chunk-size line not written "%x" (upper case, leading zeros, spaces …): int()
    reads ``k`` in it."""
    try:
        return int(line, 16) == k
    except ValueError:
        return False


class BodyReader:
    """One response's body writes, in order, into its stream."""

    __slots__ = ("dechunk", "framer", "idle", "one_event", "sse", "stream", "top")

    def __init__(self, stream: Stream, framing: str, chunked: bool) -> None:
        self.stream = stream
        self.framer: Framer = (SseFramer if framing == SSE else LineFramer)(stream.event)
        self.dechunk = Dechunk(self.framer) if chunked else None
        self.top: Framer | Dechunk = self.dechunk or self.framer
        self.sse = framing == SSE
        self.one_event = _ONE_EVENT_MATCH[SSE if self.sse else NDJSON, chunked]
        # nothing pending in the layers (no chunk or event begun, the coding followed): a
        # write may be taken whole. Set again after each write the layers take.
        self.idle = True

    def write(self, t: int, n: int, head: bytes, tail: bytes = b"") -> None:
        """One body write at ``t`` of ``n`` bytes: ``head`` its first bytes, ``tail`` its
        last ones (a write longer than the copy: the bytes between are a gap)."""
        s = self.stream
        s.t_write = t
        if len(head) == n and self.idle:
            # the common write, without the layers (the same outcome in fewer steps): one
            # whole chunk (or a plain write) holding one SSE event of one data line, or one
            # NDJSON line
            m = self.one_event(head)
            if m is not None:
                size, name, data = m.groups(b"")  # (no event: line: b"")
                k = n - 4 - len(size)  # the chunk's length, if the write is that one chunk
                if not size or size == b"%x" % k or _size_is(size, k):  # (most are "%x")
                    if self.sse:
                        # (a truncation left pending by a gap that ended on an event's
                        # boundary is not put on this event; the layers would)
                        if 13 not in data and not (name and 13 in name):  # (13: CR)
                            s.event(name, data, False)
                            return
                    elif not self.framer.cut:  # (else the line is marked truncated)
                        line = data.strip()
                        if line:
                            s.event(b"", line, False)
                        return
        top = self.top
        if len(head) >= n:
            top.feed(head[:n])
        else:
            have = len(head) + len(tail)
            if have >= n:  # head and tail overlap: the whole write
                top.feed(head + tail[have - n :])
            else:
                top.feed(head)
                top.gap(n - have)
                if tail:
                    top.feed(tail)
        d, f = self.dechunk, self.framer
        self.idle = not (f.buf or f.over) and (
            d is None or not (d.left or d.crlf or d.line or d.lost or d.done)
        )


def open_body(framing: str, chunked: bool, t1: int, engine: Engine | None) -> BodyReader:
    return BodyReader(Stream(BY_FRAMING[framing], t1, engine), framing, chunked)
