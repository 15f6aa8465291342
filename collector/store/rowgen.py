"""Writes ``collector/store/rows.py``: a typed NamedTuple per written table, generated from
the tables' columns in ``schema.py`` (the one declaration), so every reader names a field
(``span.ttfb_us``) where it used to count positions, and mypy checks the types.

    python -m collector.store.rowgen           # rewrite rows.py
    python -m collector.store.rowgen --check   # exit 1 if rows.py differs from the schema

A row holds what the ingest writes (and what the pairing reads back in the same form): a
DateTime64 as an integer count of its precision's units since the epoch (ns, µs or ms, said
in the comment); tests/collector/test_rows.py holds the file to the schema.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from collector.store import schema
from collector.store.column import Column

ROWS_PY = Path(__file__).with_name("rows.py")

# (class, table constant, columns, what one row is)
_TABLES: tuple[tuple[str, str, tuple[Column, ...], str], ...] = (
    ("SpanRow", "SPANS", schema.SPAN_COLUMNS, "One server span as the OTLP parsers write it."),
    (
        "EntryRow",
        "ENTRIES",
        schema.ENTRY_COLUMNS,
        "One browser entry as the beacon parser writes it.",
    ),
    ("PairRow", "PAIRS", schema.PAIR_COLUMNS, "One pair as the pairing writes it."),
    (
        "GpuSampleRow",
        "GPU_SAMPLES",
        schema.GPU_SAMPLE_COLUMNS,
        "One GPU metric point as the OTLP metrics parser writes it.",
    ),
    (
        "CountRow",
        "REQUEST_COUNTS",
        schema.REQUEST_COUNT_COLUMNS,
        "One request-count point as the OTLP metrics parser writes it.",
    ),
)
_UNITS = {"9": "ns", "6": "µs", "3": "ms"}
_SCALAR = {"String": "str", "Bool": "bool", "Float64": "float", "Float32": "float"}


def py_type(ch: str) -> tuple[str, str]:
    """(Python type, a note on its unit) of a ClickHouse column type as the rows hold it."""
    if m := re.fullmatch(r"Nullable\((.*)\)", ch):
        t, note = py_type(m[1])
        return f"{t} | None", note
    if m := re.fullmatch(r"LowCardinality\((.*)\)", ch):
        return py_type(m[1])
    if m := re.fullmatch(r"Array\((.*)\)", ch):
        t, note = py_type(m[1])
        return f"list[{t}]", note
    if m := re.fullmatch(r"Map\((.*), (.*)\)", ch):
        return f"dict[{py_type(m[1])[0]}, {py_type(m[2])[0]}]", ""
    if m := re.fullmatch(r"DateTime64\((\d), 'UTC'\)", ch):
        return "int", f"{_UNITS[m[1]]} since the epoch"
    if re.fullmatch(r"U?Int(8|16|32|64)", ch):
        return "int", ""
    if ch in _SCALAR:
        return _SCALAR[ch], ""
    raise ValueError(f"no Python type for the column type {ch!r}")


def render() -> str:
    out = [
        '"""The rows of the written tables, one typed NamedTuple each, in column order.',
        "",
        "Generated from collector/store/schema.py by ``python -m collector.store.rowgen``: do not",
        "edit; a column added there is added here by running it (tests/collector/test_rows.py",
        'checks the two agree)."""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import NamedTuple",
    ]
    for cls, table, cols, doc in _TABLES:
        out += ["", "", f"class {cls}(NamedTuple):", f'    """{doc} (schema.{table})"""', ""]
        for c in cols:
            t, note = py_type(c.type)
            out.append(f"    {c.name}: {t}" + (f"  # {note}" if note else ""))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m collector.store.rowgen", description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 if rows.py is not up to date")
    a = ap.parse_args(argv)
    text = render()
    if a.check:
        if ROWS_PY.read_text() != text:
            print(f"{ROWS_PY} is out of date: run python -m collector.store.rowgen")
            return 1
        return 0
    ROWS_PY.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
