"""Reading both sides of traces back from the store, by trace id: the pairer's look-ups for
a side that is not in its memory, and the query API's ``/v1/requests/{trace_id}``."""

from __future__ import annotations

import re
from typing import Any

from collector.store import schema
from collector.store.client import Store
from collector.store.column import Column
from collector.store.llm_columns import SPAN_LLM_COLUMNS
from collector.store.rows import EntryRow, SpanRow

_UNIX = {"9": "Nano", "6": "Micro", "3": "Milli"}


def _select(cols: tuple[Column, ...], table: str) -> str:
    """A table's columns in order, as the ingest writes them: a DateTime64 as its integer
    count of ns/µs/ms since the epoch (collector/store/rows.py)."""

    def one(c: Column) -> str:
        m = re.search(r"DateTime64\((\d)", c.type)
        return f"toUnixTimestamp64{_UNIX[m[1]]}({c.name}) AS _{c.name}" if m else c.name

    return f"SELECT {', '.join(one(c) for c in cols)}\nFROM {{db}}.{table}\n"


SPAN_SELECT = _select(schema.SPAN_COLUMNS, schema.SPANS)
ENTRY_SELECT = _select(schema.ENTRY_COLUMNS, schema.ENTRIES)
LOOKUP_CHUNK = 256  # ids per store lookup: a bloom filter answers well for few ids only
PRESENT_CHUNK = 5000  # ids per existence lookup (33 bytes each: well under max_query_size)
_HEX32 = re.compile(r"[0-9a-f]{32}")


def read_traces(
    store: Store,
    trace_ids: list[str],
    lookback_s: int | None,
    want: tuple[bool, bool] = (True, True),
) -> tuple[list[SpanRow], list[EntryRow]]:
    """(spans, entries) of these traces, as the ingest wrote them; ``lookback_s`` None = any
    age; ``want`` = which of (spans, entries) to read."""
    spans: list[SpanRow] = []
    entries: list[EntryRow] = []
    for i in range(0, len(trace_ids), LOOKUP_CHUNK):
        where, params = _where(trace_ids[i : i + LOOKUP_CHUNK], lookback_s)
        db = store.database
        if want[0]:
            q = store.query(SPAN_SELECT.format(db=db) + where, params)
            spans += map(SpanRow._make, q.result_rows)
        if want[1]:
            q = store.query(ENTRY_SELECT.format(db=db) + where, params)
            entries += map(EntryRow._make, q.result_rows)
    # Client retries may have left copies that a merge has not collapsed yet.
    spans = list({(s.trace_id, s.span_id): s for s in spans}.values())
    entries = list({(e.trace_id, e.span_id, e.seq): e for e in entries}.values())
    return spans, entries


def _where(trace_ids: list[str], lookback_s: int | None) -> tuple[str, dict[str, Any]]:
    # Trace ids are checked 32-hex at ingest (and here): a literal list is safe, and much
    # cheaper than the driver's parameter formatting for thousands of ids.
    ids = ",".join(f"'{t}'" for t in trace_ids if _HEX32.fullmatch(t))
    where = "WHERE trace_id IN (" + (ids or "''") + ")"
    params: dict[str, Any] = {}
    if lookback_s is not None:
        where += " AND time >= now64() - toIntervalSecond({lb:UInt32})"
        params["lb"] = lookback_s
    return where, params


_SPAN_LLM = ", ".join(c.name for c in SPAN_LLM_COLUMNS)


def read_span_llm(store: Store, trace_id: str) -> dict[str, dict[str, Any]]:
    """The LLM stream columns the store computes from one trace's spans (not written: the
    query API shows them), by span id."""
    where, params = _where([trace_id], None)
    rows = store.rows(
        f"SELECT span_id, {_SPAN_LLM} FROM {store.database}.{schema.SPANS} {where}",  # noqa: S608
        params,
    )
    return {r.pop("span_id"): r for r in rows}


def present(store: Store, table: str, trace_ids: list[str], lookback_s: int) -> set[str]:
    """The trace ids that have a row in ``table`` (span_traces / entry_traces)."""
    found: set[str] = set()
    ids = [t for t in trace_ids if _HEX32.fullmatch(t)]
    for i in range(0, len(ids), PRESENT_CHUNK):
        # One string literal split in SQL: the store parses it far faster than thousands of
        # literals (≈ 40 % less CPU per id, measured), and it stays under max_query_size.
        lit = ",".join(ids[i : i + PRESENT_CHUNK])
        rows = store.query(
            f"SELECT DISTINCT trace_id FROM {store.database}.{table} "  # noqa: S608 — hex ids
            f"WHERE trace_id IN (SELECT arrayJoin(splitByChar(',', '{lit}'))) "
            "AND time >= now64() - toIntervalSecond({lb:UInt32})",
            {"lb": lookback_s},
        ).result_rows
        found.update(r[0] for r in rows)
    return found
