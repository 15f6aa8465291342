"""Ollama's NDJSON streams (``/api/chat``: ``message.content`` / ``message.thinking`` /
``message.tool_calls``; ``/api/generate``: ``response`` / ``thinking``), ended by a line
with ``"done": true``, ``done_reason``, the token counts and the engine's own timings —
``load_duration``, ``prompt_eval_duration`` (prefill), ``eval_duration`` (decode), in ns.
An error is a line ``{"error": "…"}``."""

from __future__ import annotations

import msgspec

from agent.protocols.streams.dialect import NDJSON, Dialect
from agent.protocols.streams.dialects.common import ABSENT, decode, partial_by_keys, present
from agent.protocols.streams.stream import CONTENT, REASONING, Stream


class _Message(msgspec.Struct, gc=False):
    content: str | None = None
    thinking: str | None = None
    tool_calls: msgspec.Raw = ABSENT


class _Line(msgspec.Struct, gc=False):
    model: str | None = None
    message: _Message | None = None
    response: str | None = None
    thinking: str | None = None
    done: bool = False
    done_reason: str | None = None
    prompt_eval_count: int | None = None
    eval_count: int | None = None
    load_duration: int | None = None
    prompt_eval_duration: int | None = None
    eval_duration: int | None = None
    error: msgspec.Raw = ABSENT


_DEC = msgspec.json.Decoder(_Line)


def detect(name: bytes, data: bytes) -> bool:
    return data[:1] == b"{" and ((b'"done"' in data and b'"model"' in data) or b'"error"' in data)


def parse(s: Stream, name: bytes, data: bytes) -> None:
    ln = decode(s, _DEC, data)
    if ln is None:
        return
    if ln.error and present(ln.error):  # (absent: an empty Raw, falsy: no call)
        s.fail("error")  # (Ollama's errors are free text: only the fact leaves)
        return
    if ln.model and s.model is None:  # (the first one is kept: no call per event)
        s.set_model(ln.model)
    m = ln.message
    if m is not None:
        s.operation = "chat"
        if m.content or present(m.tool_calls):
            s.token(CONTENT)
        elif m.thinking:
            s.token(REASONING)
    elif ln.response:
        s.operation = "text_completion"
        s.token(CONTENT)
    elif ln.thinking:
        s.token(REASONING)
    if ln.done:
        s.usage(ln.prompt_eval_count, ln.eval_count)
        s.engine_timings(ln.prompt_eval_duration, ln.eval_duration, ln.load_duration)
        if ln.done_reason:
            s.finish(ln.done_reason)
        s.final()


def partial(s: Stream, name: bytes, head: bytes) -> None:
    partial_by_keys(
        s, head, (b'"content"', b'"response"'), (b'"thinking"',), tool_keys=(b'"tool_calls"',)
    )


DIALECT = Dialect("ollama", "ollama", "chat", NDJSON, detect, parse, partial)
