"""OpenAI Chat Completions streaming — and what speaks it: vLLM, TGI's OpenAI route,
llama.cpp's servers, LiteLLM, DeepSeek; the legacy Completions stream too.

``data: {"choices":[{"delta":{"role":"assistant"}}]}`` (role only: no token), then content,
tool-call or reasoning deltas (``reasoning_content``: DeepSeek, vLLM; ``reasoning``), a
chunk with ``finish_reason``, the ``usage`` chunk of ``stream_options.include_usage``, and
``data: [DONE]``. An error arrives as ``{"error": {...}}`` inside the 200 stream.
"""

from __future__ import annotations

import msgspec

from agent.protocols.streams.dialect import SSE, Dialect
from agent.protocols.streams.dialects.common import ABSENT, decode, partial_by_keys, present
from agent.protocols.streams.stream import CONTENT, REASONING, Stream


class _Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: msgspec.Raw = ABSENT
    function_call: msgspec.Raw = ABSENT
    refusal: str | None = None


class _Choice(msgspec.Struct, gc=False):
    delta: _Delta | None = None
    text: str | None = None  # the legacy Completions stream
    finish_reason: str | None = None


class _Details(msgspec.Struct, gc=False):
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    completion_tokens_details: _Details | None = None


class _Error(msgspec.Struct, gc=False):
    type: str | None = None
    code: msgspec.Raw = ABSENT


class _Chunk(msgspec.Struct, gc=False):  # (only what parse reads: each field decoded costs)
    choices: list[_Choice] | None = None
    model: str | None = None
    usage: _Usage | None = None
    error: _Error | str | None = None


_DEC = msgspec.json.Decoder(_Chunk)


def detect(name: bytes, data: bytes) -> bool:
    return data[:1] == b"{" and (
        b'"choices"' in data or b"chat.completion" in data or b'"text_completion"' in data
    )


def parse(s: Stream, name: bytes, data: bytes) -> None:
    if data == b"[DONE]":
        s.final()
        return
    c = decode(s, _DEC, data)
    if c is None:
        return
    if c.error is not None:
        e = c.error
        s.fail(e if isinstance(e, str) else e.type or _code(e.code) or "error")
        return
    if c.model and s.model is None:  # (the first one is kept: no call per event)
        s.set_model(c.model)
    for ch in c.choices or ():
        d = ch.delta
        if d is not None:
            if d.content or present(d.tool_calls) or present(d.function_call) or d.refusal:
                s.token(CONTENT)
            elif d.reasoning_content or d.reasoning:
                s.token(REASONING)
        elif ch.text:
            s.token(CONTENT)
        if ch.finish_reason:
            s.finish(ch.finish_reason)
            s.final()
    u = c.usage
    if u is not None:
        det = u.completion_tokens_details
        s.usage(u.prompt_tokens, u.completion_tokens, det.reasoning_tokens if det else None)


def _code(raw: msgspec.Raw) -> str | None:
    v = bytes(raw).strip(b'"')
    return v.decode("ascii", "replace")[:64] if v and v != b"null" else None


def partial(s: Stream, name: bytes, head: bytes) -> None:
    partial_by_keys(
        s,
        head,
        (b'"content"', b'"text"'),
        (b'"reasoning_content"', b'"reasoning"'),
        tool_keys=(b'"tool_calls"', b'"function_call"'),
    )


DIALECT = Dialect("openai.chat", "openai", "chat", SSE, detect, parse, partial)
