"""The typed rows (collector/store/rows.py) are the schema's columns, and the one place
that builds a pair row positionally (pairing.rules.derive, for speed) names every field in
column order."""

from __future__ import annotations

import ast
import inspect
import textwrap

from collector.pairing import rules
from collector.store import rowgen, schema
from collector.store.llm_columns import PAIR_LLM_COLUMNS
from collector.store.rows import EntryRow, PairRow, SpanRow


def test_rows_py_is_generated_from_the_schema() -> None:
    assert rowgen.main(["--check"]) == 0
    assert list(SpanRow._fields) == schema.column_names(schema.SPAN_COLUMNS)
    assert list(EntryRow._fields) == schema.column_names(schema.ENTRY_COLUMNS)
    assert list(PairRow._fields) == schema.column_names(schema.PAIR_COLUMNS)


def test_rowgen_types_follow_the_column_types() -> None:
    assert rowgen.py_type("Nullable(DateTime64(9, 'UTC'))") == ("int | None", "ns since the epoch")
    assert rowgen.py_type("Array(LowCardinality(String))") == ("list[str]", "")
    assert rowgen.py_type("Map(LowCardinality(String), String)") == ("dict[str, str]", "")
    assert rowgen.py_type("Nullable(UInt32)") == ("int | None", "")


def test_derive_builds_the_pair_row_field_by_field() -> None:
    """derive() builds PairRow from a tuple of locals: each must be named as its field
    (``time_`` for ``time``, ``len(hops)`` for ``hops``), the LLM columns spread in place."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(rules.derive)))
    ret = next(n for n in ast.walk(tree) if isinstance(n, ast.Return))
    assert isinstance(ret.value, ast.Call)
    built = ret.value.args[1]
    assert isinstance(built, ast.Tuple)
    names = [
        "*" + ast.unparse(el.value) if isinstance(el, ast.Starred) else ast.unparse(el)
        for el in built.elts
    ]
    aliases = {"time_": "time", "len(hops)": "hops", "linked_span_ids or []": "linked_span_ids"}
    llm = len(PAIR_LLM_COLUMNS)
    at = names.index("*llm_columns")
    fields = list(PairRow._fields)
    assert [aliases.get(n, n) for n in names[:at]] == fields[:at]
    assert fields[at : at + llm] == schema.column_names(PAIR_LLM_COLUMNS)
    assert names[at + 1 :] == fields[at + llm :]
