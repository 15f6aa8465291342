"""What the dialect modules share: decoding an event's JSON into a typed view (msgspec:
only the fields a dialect reads are built; text is never kept), and the classification of
an event seen only in part."""

from __future__ import annotations

from typing import TypeVar

import msgspec

from agent.protocols.streams.stream import CONTENT, REASONING, Stream

T = TypeVar("T")


def decode(dec: msgspec.json.Decoder[T], s: Stream, data: bytes) -> T | None:
    """``data`` as the dialect's typed view, or None (counted: ``garbage``)."""
    try:
        return dec.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        s.problem("garbage")
        return None


ABSENT = msgspec.Raw()  # the default of an optional raw field: absent


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
