"""An LLM exchange in a pair: what each side read of the stream, in the pair's LLM columns
(collector/store/llm_columns.py PAIR_LLM_COLUMNS; docs/store.md, docs/sla.md "LLM routes").

The server side is the origin hop's (the agent's parallax_contracts.genai attributes), read
from its ``attributes`` as the OTLP parsers wrote them (text): the same whether the pairer
has the span in memory or read it back (pairing/lookups.py). The browser side is the
beacon v2 ``llm`` object's columns.
Absent stays absent: a side that did not read tokens gives NULLs, never 0.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collector.store import schema
from collector.store.llm_columns import PAIR_LLM_COLUMNS
from collector.store.rows import EntryRow
from parallax_contracts import genai
from parallax_contracts.attr import Attr

P95 = 0.95
PAIR_LLM_NAMES = schema.column_names(PAIR_LLM_COLUMNS)


def bucket_mid_us(i: int) -> float:
    """The representative gap of a beacon's gap_hist bucket i = ⌊2·log2(gap µs)⌋ (the
    agent's buckets, parallax_contracts.beacon.Llm.gap_hist): its geometric middle."""
    return float(round(2 ** ((i + 0.5) / 2)))


def gap_p95_ms(token_ms: Sequence[float], gap_hist: Sequence[int]) -> float | None:
    """The P95 of one answer's inter-token gaps as the browser saw them (ms): the exact gaps
    between its first 1024 tokens and, beyond them, the histogram's counts at their buckets'
    middles. Nearest rank, as the agent ranks its own (agent/protocols/streams/gaps.py)."""
    exact = sorted(b - a for a, b in itertools.pairwise(token_ms))
    binned = [(bucket_mid_us(i) / 1000.0, c) for i, c in enumerate(gap_hist) if c > 0]
    n = len(exact) + sum(c for _, c in binned)
    if not n:
        return None
    rank = max(1, math.ceil(P95 * n))
    if not binned:
        return exact[rank - 1]
    seen = 0
    for value, count in sorted([*((g, 1) for g in exact), *binned]):
        seen += count
        if seen >= rank:
            return value
    return None  # unreachable: the counts add up to n


@dataclass(frozen=True, slots=True)
class ServerStream:
    """The origin hop's reading of an LLM stream (µs from t1, as the agent sends them)."""

    dialect: str
    model: str
    end: str
    first_token_us: int | None  # parallax.ttft_us: the first answer token's write
    tokens: int | None
    gap_p95_us: int | None
    queue_us: int | None
    prefill_us: int | None
    first_output_us: int | None
    last_output_us: int | None


DIALECT_ATTR = genai.DIALECT.name
_FIELDS: dict[str, Attr] = {
    "model": genai.GEN_AI_RESPONSE_MODEL,
    "end": genai.END,
    "tokens": genai.GEN_AI_USAGE_OUTPUT_TOKENS,
    "gap_p95_us": genai.GAP_P95_US,
    "queue_us": genai.QUEUE_US,
    "prefill_us": genai.PREFILL_US,
    "first_output_us": genai.FIRST_OUTPUT_US,
    "last_output_us": genai.LAST_OUTPUT_US,
}


def _from_text(v: Any, as_int: bool) -> Any:
    """An attribute as the parsers keep it (text) → its value; a count or time that is not a
    whole non-negative number is no measurement (None), as the store's columns read it."""
    if not as_int:
        return v if isinstance(v, str) else ""
    try:
        n = int(v)
    except (TypeError, ValueError):
        return None
    return n if n >= 0 else None


def server_stream(attrs: Mapping[str, str] | None, ttft_us: int | None) -> ServerStream | None:
    """A span's LLM stream from its ``attributes`` as the OTLP parsers write them (text) and
    its ``ttft_us``; None when it spoke no dialect."""
    attrs = attrs or {}
    dialect = _from_text(attrs.get(genai.DIALECT.name), False)
    if not dialect:
        return None
    get = {k: _from_text(attrs.get(a.name), a.type == "int") for k, a in _FIELDS.items()}
    return ServerStream(
        dialect=dialect,
        model=get["model"] or "",
        end=get["end"] or "",
        first_token_us=int(ttft_us) if ttft_us is not None else None,
        tokens=get["tokens"],
        gap_p95_us=get["gap_p95_us"],
        queue_us=get["queue_us"],
        prefill_us=get["prefill_us"],
        first_output_us=get["first_output_us"],
        last_output_us=get["last_output_us"],
    )


@dataclass(frozen=True, slots=True)
class UserStream:
    """The browser entry's llm object, as its columns hold it (ms after time_origin)."""

    dialect: str
    first_token_ms: float | None
    token_ms: Sequence[float]
    gap_hist: Sequence[int]
    tokens: int | None
    end: str


def user_stream(entry: EntryRow) -> UserStream | None:
    """The entry's llm object (the browser_entries columns), None when it had none."""
    if not entry.llm_dialect:
        return None
    return UserStream(
        dialect=entry.llm_dialect,
        first_token_ms=entry.llm_first_token_ms,
        token_ms=entry.llm_token_ms or (),
        gap_hist=entry.llm_gap_hist or (),
        tokens=entry.llm_tokens,
        end=entry.llm_end or "",
    )


def _ms(us: int | None) -> float | None:
    return None if us is None else us / 1000.0


# The pair's LLM columns when neither side read a stream dialect.
NO_LLM: tuple[Any, ...] = ("", "", "", "", *([None] * (len(PAIR_LLM_NAMES) - 4)))


def pair_values(
    t0: float | None, user: UserStream | None, server: ServerStream | None
) -> tuple[Any, ...]:
    """The pair's LLM columns (PAIR_LLM_COLUMNS order) from both sides' readings; all
    absent ('' and NULL) when neither side read an LLM stream."""
    if user is None and server is None:
        return NO_LLM
    u_first = None
    if user is not None and user.first_token_ms is not None and t0 is not None:
        u_first = user.first_token_ms - t0
    decode = None
    if server is not None and server.first_output_us is not None:
        last = server.last_output_us
        if last is not None and last >= server.first_output_us:
            decode = (last - server.first_output_us) / 1000.0
    return (
        server.dialect if server is not None else user.dialect if user is not None else "",
        server.model if server is not None else "",
        server.end if server is not None else "",
        user.end if user is not None else "",
        u_first,
        _ms(server.first_token_us) if server is not None else None,
        gap_p95_ms(user.token_ms, user.gap_hist) if user is not None else None,
        _ms(server.gap_p95_us) if server is not None else None,
        user.tokens if user is not None else None,
        server.tokens if server is not None else None,
        _ms(server.queue_us) if server is not None else None,
        _ms(server.prefill_us) if server is not None else None,
        decode,
    )


def pair_columns(
    t0: float | None, entry: EntryRow, attrs: Mapping[str, str] | None, ttft_us: int | None
) -> tuple[Any, ...]:
    """pair_values of an entry and its origin hop (its ``attributes`` and ``ttft_us``; None
    without a hop)."""
    if not entry.llm_dialect and not (attrs and DIALECT_ATTR in attrs):
        return NO_LLM  # the common case: neither side read a stream dialect
    return pair_values(t0, user_stream(entry), server_stream(attrs, ttft_us))
