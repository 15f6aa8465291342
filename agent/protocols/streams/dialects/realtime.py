"""OpenAI Realtime over WebSocket: one JSON message per event. ``response.output_text.delta``
(``response.text.delta`` in the beta), ``response.output_audio.delta`` (what the user hears),
``response.function_call_arguments.delta`` are output; their transcript deltas shadow the
audio and are not counted again; ``response.done`` ends a response with its usage and
status; ``error`` carries a type."""

from __future__ import annotations

import msgspec

from agent.protocols.streams.dialect import WS, Dialect
from agent.protocols.streams.dialects.common import (
    TypedError,
    Usage,
    decode,
    error_type,
    partial_by_keys,
    type_of,
)
from agent.protocols.streams.stream import CONTENT, Stream


class _Response(msgspec.Struct, gc=False):
    status: str | None = None
    usage: Usage | None = None


class _Event(msgspec.Struct, gc=False):
    type: str = ""
    delta: str | None = None
    response: _Response | None = None
    error: TypedError | None = None


_DEC = msgspec.json.Decoder(_Event)
_OUTPUT = frozenset(
    (
        "response.output_text.delta",
        "response.text.delta",
        "response.output_audio.delta",
        "response.audio.delta",
        "response.function_call_arguments.delta",
    )
)


def detect(name: bytes, data: bytes) -> bool:
    t = type_of(data) if data[:1] == b"{" else None
    return t is not None and t.startswith(("session.", "response.", "conversation.", "rate_limits"))


def parse(s: Stream, name: bytes, data: bytes) -> None:
    e = decode(s, _DEC, data)
    if e is None:
        return
    typ = e.type
    if typ in _OUTPUT:
        if e.delta:
            s.token(CONTENT)
    elif typ == "response.done":
        r = e.response
        if r is not None:
            if r.usage is not None:
                s.usage(r.usage.input_tokens, r.usage.output_tokens)
            if r.status:
                s.finish(r.status)
                if r.status == "failed":
                    s.fail("failed")
        s.final()
    elif typ == "error":
        s.fail(error_type(e.error))


def partial(s: Stream, name: bytes, head: bytes) -> None:
    if any(t.encode() in head[:120] for t in _OUTPUT):
        partial_by_keys(s, head, (b'"delta"',), ())


DIALECT = Dialect("openai.realtime", "openai", "chat", WS, detect, parse, partial)
