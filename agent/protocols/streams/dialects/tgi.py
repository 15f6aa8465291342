"""Hugging Face TGI's own ``/generate_stream``: one event per token,
``{"token": {"text": …, "special": false}, "generated_text": null, "details": null}``; the
last carries ``generated_text`` and ``details`` (``finish_reason``, ``generated_tokens``).
(TGI's OpenAI route speaks openai.chat.)"""

from __future__ import annotations

import msgspec

from agent.protocols.streams.dialect import SSE, Dialect
from agent.protocols.streams.dialects.common import ABSENT, decode, partial_by_keys, present
from agent.protocols.streams.stream import CONTENT, Stream


class _Token(msgspec.Struct, gc=False):
    text: str | None = None
    special: bool = False


class _Details(msgspec.Struct, gc=False):
    finish_reason: str | None = None
    generated_tokens: int | None = None


class _Event(msgspec.Struct, gc=False):
    token: _Token | None = None
    generated_text: msgspec.Raw = ABSENT
    details: _Details | None = None
    error: msgspec.Raw = ABSENT
    error_type: str | None = None


_DEC = msgspec.json.Decoder(_Event)


def detect(name: bytes, data: bytes) -> bool:
    return data[:1] == b"{" and b'"token"' in data and b'"generated_text"' in data


def parse(s: Stream, name: bytes, data: bytes) -> None:
    e = decode(s, _DEC, data)
    if e is None:
        return
    if e.error and present(e.error):  # (absent: an empty Raw, falsy: no call)
        s.fail(e.error_type or "error")
        return
    if e.token is not None and not e.token.special and e.token.text:
        s.token(CONTENT)
    if e.details is not None:
        if e.details.finish_reason:
            s.finish(e.details.finish_reason)
        s.usage(None, e.details.generated_tokens)
        s.final()


def partial(s: Stream, name: bytes, head: bytes) -> None:
    partial_by_keys(s, head, (b'"text"',), ())


DIALECT = Dialect("tgi.generate", "tgi", "text_completion", SSE, detect, parse, partial)
