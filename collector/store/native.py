"""Native-format insert blocks for the store's tables, encoded by the compiled _native_fast.c.

clickhouse-connect encodes an insert in per-value Python loops; the compiled encoder writes
the same bytes (byte-identical: tests/collector/test_native_fast.py) from the rows or the
columns in C. The column types come from schema.py's column lists (one source of truth),
mapped here once per table and column list to the encoder's type codes.

``encode`` answers None — the caller then inserts through clickhouse-connect, the reference,
which raises its own errors for bad data — when the compiled module is not built
(``python -m parallax_contracts.compiled``) or older than its source, is turned off
(``PARALLAX_NATIVE_FAST=0``), the table or a column type is not one modelled here, the batch
is empty, or a value is not exactly of the type the encoder expects (see _native_fast.c).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from collector.store import schema
from parallax_contracts.compiled import load

# Type codes: the enum in _native_fast.c.
I64, U8, U16, U32, U64, BOOL, F64, STR, LC, MAP = range(1, 11)
NULLABLE, ARRAY = 0x10, 0x20

_SCALARS = {
    "Int64": I64,
    "UInt8": U8,
    "UInt16": U16,
    "UInt32": U32,
    "UInt64": U64,
    "Bool": BOOL,
    "Float64": F64,
    "String": STR,
    "LowCardinality(String)": LC,
}
_NULLABLE_OK = {I64, U16, U32, U64, F64}
_ARRAY_OK = {I64, F64, STR, LC}
# DateTime64 ticks (Python ints, as the rows hold them) are written as Int64.
_DATETIME64 = re.compile(r"DateTime64\([369], 'UTC'\)")
_WRAPPED = re.compile(r"(Nullable|Array)\((.*)\)")

TABLES: dict[str, tuple[schema.Column, ...]] = {
    schema.SPANS: schema.SPAN_COLUMNS,
    schema.ENTRIES: schema.ENTRY_COLUMNS,
    schema.PAIRS: schema.PAIR_COLUMNS,
    schema.GPU_SAMPLES: schema.GPU_SAMPLE_COLUMNS,
    schema.REQUEST_COUNTS: schema.REQUEST_COUNT_COLUMNS,
}


def _scalar(t: str) -> int | None:
    return I64 if _DATETIME64.fullmatch(t) else _SCALARS.get(t)


def type_code(t: str) -> int | None:
    """The encoder's code for a ClickHouse column type, None for one it does not model."""
    if t == "Map(LowCardinality(String), String)":
        return MAP
    m = _WRAPPED.fullmatch(t)
    if m is None:
        return _scalar(t)
    inner = _scalar(m.group(2))
    if m.group(1) == "Nullable":
        return inner | NULLABLE if inner in _NULLABLE_OK else None
    return inner | ARRAY if inner in _ARRAY_OK else None


def _leb128(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def column_header(name: str, type_: str) -> bytes:
    n, t = name.encode(), type_.encode()
    return _leb128(len(n)) + n + _leb128(len(t)) + t


Plan = tuple[tuple[bytes, int], ...]
_plans: dict[tuple[str, tuple[str, ...]], Plan | None] = {}


def plan(table: str, column_names: Sequence[str]) -> Plan | None:
    """(column header, type code) per column, or None if a column is not modelled."""
    key = (table, tuple(column_names))
    if key in _plans:
        return _plans[key]
    by_name = {c.name: c.type for c in TABLES.get(table, ())}
    out: list[tuple[bytes, int]] = []
    for name in column_names:
        t = by_name.get(name)
        code = type_code(t) if t is not None else None
        if t is None or code is None:
            _plans[key] = None
            return None
        # The type as the driver names it in the block (its insert_name): the schema's
        # spelling is already canonical (the tests compare the bytes with the driver's).
        out.append((column_header(name, t), code))
    _plans[key] = result = tuple(out)
    return result


_UNLOADED = ModuleType("unloaded")
_fast: ModuleType | None = _UNLOADED
_why_not = ""


def compiled() -> ModuleType | None:
    """The compiled encoder, imported on first use (a build in the same process — the
    tests' — comes first), or None: not built or turned off."""
    global _fast, _why_not  # a module-wide one-time import
    if _fast is _UNLOADED:
        src = Path(__file__).with_name("_native_fast.c")
        _fast, _why_not = load("collector.store._native_fast", src, "PARALLAX_NATIVE_FAST")
    return _fast


def describe() -> str:
    """One line for the start-up log: which encoder the inserts use."""
    m = compiled()
    if m is None:
        return f"Native insert encoder: clickhouse-connect (the compiled one {_why_not})"
    return f"Native insert encoder: compiled ({Path(m.__file__ or '?').name})"


def encode(table: str, column_names: Sequence[str], data: list[Any], by_rows: bool) -> bytes | None:
    """One Native block of ``data`` (row tuples if ``by_rows``, else columns), or None: insert
    it through clickhouse-connect instead. Never for no rows (the driver sends nothing)."""
    fast = compiled()
    if fast is None or not data:
        return None
    p = plan(table, column_names)
    if p is None:
        return None
    block: bytes | None = fast.encode(data, by_rows, p)
    return block or None
