"""W3C Trace Context (``traceparent``), the one Python implementation.

Format: ``<version>-<trace-id>-<parent-id>-<flags>``, lowercase hex, version ``00`` today.
Per the spec, a parser accepts a *future* version (not ``ff``) if it starts with the
version-00 fields and continues only after a ``-``. All-zero ids are invalid.
"""

from __future__ import annotations

import re
import secrets
from typing import NamedTuple

_HEX = re.compile(r"[0-9a-f]+")
# the common value, a version-00 traceparent, in one match (the general rules below decide
# everything else, a future version included)
_V00 = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
FLAG_SAMPLED = 0x01
FLAG_RANDOM = 0x02  # Trace Context level 2: the trace id's right 7 bytes are random
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


class TraceContext(NamedTuple):
    """Immutable; a named tuple rather than a frozen dataclass: one is built per request
    on the agent's hot path, and a frozen dataclass sets each field through
    ``object.__setattr__``."""

    trace_id: str  # 32 lowercase hex, not all zero
    span_id: str  # 16 lowercase hex, not all zero (the sender's span: our parent)
    flags: int = FLAG_SAMPLED
    version: int = 0

    @property
    def sampled(self) -> bool:
        return bool(self.flags & FLAG_SAMPLED)

    def header(self) -> str:
        """Serialise as version 00 (we never emit a version we do not know)."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"


def _is_hex(s: str, n: int) -> bool:
    return len(s) == n and _HEX.fullmatch(s) is not None


def parse(value: str | bytes | None) -> TraceContext | None:
    """Return the context in a ``traceparent`` value, or None when it is invalid."""
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    value = value.strip(" \t")  # header values may carry optional whitespace (OWS)
    m = _V00.fullmatch(value)
    if m is not None:
        trace_id, span_id, flags = m.groups()
        if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
            return None
        return TraceContext(trace_id, span_id, int(flags, 16), 0)
    if len(value) < 55:
        return None
    version, trace_id, span_id, flags = value[0:2], value[3:35], value[36:52], value[53:55]
    if value[2] != "-" or value[35] != "-" or value[52] != "-":
        return None
    if not (_is_hex(version, 2) and _is_hex(trace_id, 32) and _is_hex(span_id, 16)):
        return None
    if not _is_hex(flags, 2) or version == "ff":
        return None
    if version == "00":
        if len(value) != 55:
            return None
    elif len(value) > 55 and value[55] != "-":
        return None
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return TraceContext(trace_id, span_id, int(flags, 16), int(version, 16))


def is_valid_trace_id(trace_id: str) -> bool:
    return _is_hex(trace_id, 32) and trace_id != _ZERO_TRACE


def is_valid_span_id(span_id: str) -> bool:
    return _is_hex(span_id, 16) and span_id != _ZERO_SPAN


def new_trace_id() -> str:
    while True:
        t = secrets.token_hex(16)
        if t != _ZERO_TRACE:
            return t


def new_span_id() -> str:
    while True:
        s = secrets.token_hex(8)
        if s != _ZERO_SPAN:
            return s


def generate(sampled: bool = True) -> TraceContext:
    """A fresh root context (random ids, so the level-2 random flag is set)."""
    flags = FLAG_RANDOM | (FLAG_SAMPLED if sampled else 0)
    return TraceContext(new_trace_id(), new_span_id(), flags)
