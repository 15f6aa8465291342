"""What the dialect modules share: optional raw fields, the ``type`` of a first event, and
the classification of an event seen only in part. Each dialect decodes its events into its
own typed view (msgspec: only the fields it reads are built; text is never kept) with
``decode``, in its ``parse`` as it runs per event: a ``msgspec.DecodeError`` (a
ValidationError is one) is counted as ``garbage``; the views' objects more than one dialect
reads (``Usage``, ``TypedError``) are here. The views are ``gc=False`` structs: they hold
no cycles, and untracked objects are cheaper to make and drop."""

from __future__ import annotations

from typing import TypeVar

import msgspec

from agent.protocols.streams.stream import CONTENT, REASONING, Stream

ABSENT = msgspec.Raw()  # the default of an optional raw field: absent
T = TypeVar("T")


class Usage(msgspec.Struct, gc=False):
    """A ``usage`` object under the names Anthropic's and OpenAI's typed events share."""

    input_tokens: int | None = None
    output_tokens: int | None = None


class TypedError(msgspec.Struct, gc=False):
    """An ``error`` object of which only the ``type`` is read."""

    type: str | None = None


def error_type(err: TypedError | None) -> str:
    """What an ``error`` event fails the stream with: its type, else ``error``."""
    return err.type if err is not None and err.type else "error"


def decode(s: Stream, dec: msgspec.json.Decoder[T], data: bytes) -> T | None:
    """One whole event in the dialect's view; None, counted as ``garbage``, when it is not
    JSON of that shape."""
    try:
        return dec.decode(data)
    except msgspec.DecodeError:  # (a ValidationError is one)
        s.problem("garbage")
        return None


def present(raw: msgspec.Raw) -> bool:
    """An optional raw field (a tool call, an error) is there and not null."""
    return bool(raw) and bytes(raw) != b"null"


def type_of(data: bytes) -> str | None:
    """The ``type`` field of a JSON object event (the first events: detection only)."""
    try:
        return _TYPED.decode(data).type
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


class _Typed(msgspec.Struct):
    type: str | None = None


_TYPED = msgspec.json.Decoder(_Typed)


def nonempty_string_after(head: bytes, key: bytes) -> bool:
    """``"key":"x…`` with a first character, in the head of a truncated event."""
    i = head.find(key)
    if i < 0:
        return False
    j = i + len(key)
    while j < len(head) and head[j] in b" \t:":
        j += 1
    return j + 1 < len(head) and head[j] == 34 and head[j + 1] != 34  # '"' then not '"'


def partial_by_keys(
    s: Stream,
    head: bytes,
    content: tuple[bytes, ...],
    reasoning: tuple[bytes, ...],
    tool_keys: tuple[bytes, ...] = (),
) -> None:
    """A truncated event counts as a token when its head shows a non-empty content string,
    or one of the ``tool_keys`` (a tool call): an event too long to copy is almost
    always a long delta."""
    if any(k in head for k in tool_keys) or any(nonempty_string_after(head, k) for k in content):
        s.token(CONTENT)
    elif any(nonempty_string_after(head, k) for k in reasoning):
        s.token(REASONING)
