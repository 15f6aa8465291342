"""OpenAI Responses streaming: typed events — ``response.created`` (model),
``response.output_text.delta`` and ``response.refusal.delta`` (the answer),
``response.function_call_arguments.delta`` (a tool call), ``response.reasoning_*.delta``
(thinking), ``response.completed`` / ``response.incomplete`` with usage (reasoning tokens
apart), ``response.failed`` and ``error``."""

from __future__ import annotations

import msgspec

from agent.protocols.streams.dialect import SSE, Dialect
from agent.protocols.streams.dialects.common import decode, partial_by_keys, type_of
from agent.protocols.streams.stream import CONTENT, REASONING, Stream


class _Details(msgspec.Struct, gc=False):
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    input_tokens: int | None = None
    output_tokens: int | None = None
    output_tokens_details: _Details | None = None


class _Incomplete(msgspec.Struct, gc=False):
    reason: str | None = None


class _Error(msgspec.Struct, gc=False):
    code: str | None = None
    type: str | None = None


class _Response(msgspec.Struct, gc=False):
    model: str | None = None
    status: str | None = None
    usage: _Usage | None = None
    incomplete_details: _Incomplete | None = None
    error: _Error | None = None


class _Event(msgspec.Struct, gc=False):
    type: str = ""
    delta: str | None = None
    response: _Response | None = None
    code: str | None = None


_DEC = msgspec.json.Decoder(_Event)
_ANSWER = frozenset(
    (
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
    )
)


def detect(name: bytes, data: bytes) -> bool:
    if name.startswith(b"response."):
        return True
    t = type_of(data) if data[:1] == b"{" else None
    return t is not None and t.startswith("response.")


def parse(s: Stream, name: bytes, data: bytes) -> None:
    e = decode(s, _DEC, data)
    if e is None:
        return
    typ = e.type
    if typ in _ANSWER:  # (the common event first: one set lookup)
        if e.delta:
            s.token(CONTENT)
        return
    if typ.endswith(".delta"):
        if typ.startswith("response.reasoning") and e.delta:
            s.token(REASONING)
        return
    r = e.response
    if r is not None and r.model:
        s.set_model(r.model)
    if typ in ("response.completed", "response.incomplete"):
        if r is not None:
            u = r.usage
            if u is not None:
                det = u.output_tokens_details
                s.usage(u.input_tokens, u.output_tokens, det.reasoning_tokens if det else None)
            why = r.incomplete_details.reason if r.incomplete_details is not None else None
            s.finish(why or r.status or typ.rsplit(".", 1)[1])
        s.final()
    elif typ == "response.failed":
        err = r.error if r is not None else None
        s.fail((err.code or err.type or "failed") if err is not None else "failed")
    elif typ == "error":
        s.fail(e.code or "error")


def partial(s: Stream, name: bytes, head: bytes) -> None:
    if b"reasoning" in head[:80]:
        partial_by_keys(s, head, (), (b'"delta"',))
    else:
        partial_by_keys(s, head, (b'"delta"',), ())


DIALECT = Dialect("openai.responses", "openai", "chat", SSE, detect, parse, partial)
