"""A chat server's own token frames over WebSocket: JSON messages that carry the text under
``token``, ``delta``, ``content`` or ``text``, and mark the end with ``"done": true`` or a
``type`` of ``done`` / ``end``; an ``error`` field is an error. Only these shapes are taken:
a WebSocket that sends anything else keeps message (chunk) semantics."""

from __future__ import annotations

import msgspec

from agent.protocols.streams.dialect import WS, Dialect
from agent.protocols.streams.dialects.common import ABSENT, decode, partial_by_keys, present
from agent.protocols.streams.stream import CONTENT, Stream

_TEXT = ("token", "delta", "content", "text")
_END = frozenset(("done", "end", "complete", "completed", "finished", "stop"))


class _Frame(msgspec.Struct, gc=False):
    type: str | None = None
    token: str | None = None
    delta: str | None = None
    content: str | None = None
    text: str | None = None
    done: bool = False
    error: msgspec.Raw = ABSENT
    model: str | None = None
    finish_reason: str | None = None


_DEC = msgspec.json.Decoder(_Frame)


def detect(name: bytes, data: bytes) -> bool:
    if data[:1] != b"{":
        return False
    try:
        f = _DEC.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return any(isinstance(getattr(f, k), str) for k in _TEXT) or f.done or f.type in _END


def parse(s: Stream, name: bytes, data: bytes) -> None:
    f = decode(s, _DEC, data)
    if f is None:
        return
    if f.error and present(f.error):  # (absent: an empty Raw, falsy: no call)
        s.fail(f.type if f.type and f.type != "error" else "error")
        return
    if f.model and s.model is None:  # (the first one is kept: no call per event)
        s.set_model(f.model)
    if f.token or f.delta or f.content or f.text:
        s.token(CONTENT)
    if f.finish_reason:
        s.finish(f.finish_reason)
    if f.done or f.type in _END:
        s.final()


def partial(s: Stream, name: bytes, head: bytes) -> None:
    partial_by_keys(s, head, tuple(b'"%s"' % k.encode() for k in _TEXT), ())


DIALECT = Dialect("chat.frames", "chat", "chat", WS, detect, parse, partial)
