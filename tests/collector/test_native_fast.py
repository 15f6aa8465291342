"""The compiled Native encoder (collector/store/_native_fast.c) against clickhouse-connect.

The reference is the driver's own encoding (NativeTransform.build_insert, minus the INSERT
statement it puts first — as its chDB backend strips it): for the same data and column types
the encoder must give the same bytes, or None (give up) — never other bytes, and None
wherever the driver refuses the data. Then real chDB: the three tables' real rows inserted
through the encoder read back equal; a value it does not model goes through the driver.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from clickhouse_connect.datatypes.registry import get_from_name
from clickhouse_connect.driver.insert import InsertContext
from clickhouse_connect.driver.transform import NativeTransform
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from bench.collector import _bodies
from collector.ingest import beacons, otlp, otlp_metrics
from collector.pairing import rules
from collector.store import native, schema
from collector.store.rows import EntryRow, SpanRow
from parallax_contracts import compiled
from tests.collector.gpu_sdk import SdkExporter, sample_state
from tests.collector.helpers import run_store_script

# Every column type of the three tables, and a few neighbours the encoder must refuse.
SCHEMA_TYPES = sorted({c.type for cols in native.TABLES.values() for c in cols})
NOT_MODELLED = ["Nullable(String)", "Array(Nullable(Int64))", "Int32", "Map(String, Int64)"]


@pytest.fixture(scope="module")
def fast() -> Any:
    """The compiled encoder, built here if setup has not (skipped only without a C
    toolchain: a build that fails where one exists is a failure)."""
    missing = compiled.toolchain_missing()
    if missing is not None:
        pytest.skip(missing)
    ok, msg = compiled.build(compiled.NATIVE_SOURCE)
    assert ok, msg
    from collector.store import _native_fast

    assert native.compiled() is _native_fast  # Store.insert uses it (unless turned off)
    return _native_fast


def reference(
    types: Sequence[str], names: Sequence[str], rows: list[tuple[Any, ...]]
) -> bytes | None:
    """The driver's Native block for ``rows``, or None where it refuses them."""
    ctx = InsertContext(
        "t",
        list(names),
        [get_from_name(t) for t in types],
        [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in names],
        column_oriented=True,
    )
    ctx.block_row_count = len(rows) + 1  # one block, as the encoder writes
    try:
        out = b"".join(NativeTransform.build_insert(ctx, error_handler=_raise))
    except Exception:  # noqa: BLE001 — any refusal by the driver
        return None
    cols = ", ".join(f"`{n}`" for n in names)
    prefix = f"INSERT INTO t ({cols}) FORMAT Native\n".encode()
    assert out == b"" or out.startswith(prefix)
    return out[len(prefix) :]


def _raise(e: Exception) -> None:
    raise e


def plan_of(types: Sequence[str], names: Sequence[str]) -> tuple[tuple[bytes, int], ...]:
    codes = [native.type_code(t) for t in types]
    assert None not in codes
    return tuple(
        (native.column_header(n, t), c) for n, t, c in zip(names, types, codes, strict=True) if c
    )


# --- values per column type (the ones a row holds, edge values included) ------------------

_I64 = st.integers(-(2**63), 2**63 - 1)
_TEXT = st.text(max_size=12)  # non-ASCII included (no lone surrogates: never in a row)
_LC_TEXT = st.sampled_from(["", "GET", "POST", "ебпф", "ö", "app-1", "x" * 40])
_FLOAT = st.one_of(st.floats(), st.integers(-(2**70), 2**70))


def _scalar(t: str) -> st.SearchStrategy[Any]:
    if t.startswith("DateTime64") or t == "Int64":
        return _I64
    if t.startswith("UInt"):
        return st.integers(0, 2 ** int(t[4:]) - 1)
    return {
        "Bool": st.booleans(),
        "Float64": _FLOAT,
        "String": _TEXT,
        "LowCardinality(String)": _LC_TEXT | _TEXT,
    }[t]


def values(t: str) -> st.SearchStrategy[Any]:
    if t.startswith("Nullable("):
        return st.none() | _scalar(t[9:-1])
    if t.startswith("Array("):
        return st.lists(_scalar(t[6:-1]), max_size=5)
    if t.startswith("Map("):
        return st.dictionaries(_LC_TEXT | _TEXT, _TEXT, max_size=4)
    return _scalar(t)


# Anything at all, for the "same bytes or give up" property.
_ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**80), 2**80),
    st.floats(),
    st.text(max_size=5),
    st.binary(max_size=5),
    st.lists(
        st.one_of(st.integers(-3, 3), st.floats(), st.text(max_size=3), st.none()), max_size=3
    ),
    st.tuples(st.integers(0, 3)),
    st.dictionaries(
        st.text(max_size=3), st.one_of(st.text(max_size=3), st.integers(0, 3)), max_size=2
    ),
    st.just("\ud800"),  # not UTF-8 encodable
)


@st.composite
def batches(draw: st.DrawFn, wild: bool) -> tuple[list[str], list[str], list[tuple[Any, ...]]]:
    types = draw(st.lists(st.sampled_from(SCHEMA_TYPES), min_size=1, max_size=6))
    names = [f"c{i}" for i in range(len(types))]
    n = draw(st.integers(1, 12))
    rows = []
    for _ in range(n):
        row = []
        for t in types:
            row.append(draw(_ANY if wild and draw(st.integers(0, 9)) == 0 else values(t)))
        rows.append(tuple(row))
    return types, names, rows


def _check(
    fast: Any, types: list[str], names: list[str], rows: list[tuple[Any, ...]]
) -> bytes | None:
    plan = plan_of(types, names)
    by_rows = fast.encode(rows, True, plan)
    by_cols = fast.encode([list(c) for c in zip(*rows, strict=True)], False, plan)
    assert by_rows == by_cols
    if by_rows is not None:
        ref = reference(types, names, rows)
        assert ref is not None, "the encoder accepted what the driver refuses"
        assert by_rows == ref
    result: bytes | None = by_rows
    return result


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(wild=False))
def test_byte_identical_for_every_column_type(fast: Any, batch: Any) -> None:
    types, names, rows = batch
    # Values of the column's own type: always encoded (never given up), and the same bytes.
    assert _check(fast, types, names, rows) is not None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(wild=True))
def test_any_value_same_bytes_or_give_up(fast: Any, batch: Any) -> None:
    _check(fast, *batch)


def test_edges(fast: Any) -> None:
    # Empty batch: the driver sends no block at all.
    plan = plan_of(["Int64"], ["a"])
    assert fast.encode([], True, plan) == b"" == reference(["Int64"], ["a"], [])
    assert native.encode(schema.SPANS, ["pid"], [], True) is None  # Store: the driver's path
    # All-None Nullable columns, all-empty arrays and maps (LowCardinality inside: prefix only).
    types = ["Nullable(Float64)", "Nullable(DateTime64(9, 'UTC'))", "Array(LowCardinality(String))"]
    types += ["Map(LowCardinality(String), String)", "Array(String)", "Array(Float64)"]
    names = [f"c{i}" for i in range(len(types))]
    assert _check(fast, types, names, [(None, None, [], {}, [], [])] * 3) is not None
    # LowCardinality key widths: UInt8 up to 255 distinct values, UInt16 from 256.
    for n in (255, 256, 257, 70_000):
        rows = [(f"v{i % n}", [f"w{i % n}"]) for i in range(max(n, 300))]
        assert _check(
            fast, ["LowCardinality(String)", "Array(LowCardinality(String))"], ["a", "b"], rows
        )
    # Range edges of every integer type, NaN and infinities.
    edges: list[tuple[Any, ...]] = [
        (0, 0, 0, 0, -(2**63), math.nan),
        (255, 65535, 2**32 - 1, 2**64 - 1, 2**63 - 1, -math.inf),
    ]
    types = ["UInt8", "UInt16", "UInt32", "UInt64", "Int64", "Float64"]
    assert _check(fast, types, [f"c{i}" for i in range(6)], edges) is not None


@pytest.mark.parametrize(
    ("type_", "bad"),
    [
        ("Int64", 1.5),
        ("Int64", True),
        ("Int64", 2**63),
        ("UInt16", -1),
        ("UInt16", 65536),
        ("UInt8", "1"),
        ("UInt64", 2**64),
        ("UInt64", -1),
        ("Bool", 1),
        ("Float64", "1.0"),
        ("Float64", 2**1100),
        ("String", None),
        ("String", b"x"),
        ("String", "\ud800"),
        ("LowCardinality(String)", None),
        ("Nullable(Int64)", 1.0),
        ("Array(Int64)", "123"),
        ("Array(String)", ["a", 1]),
        ("Map(LowCardinality(String), String)", [("a", "b")]),
        ("Map(LowCardinality(String), String)", {"a": 1}),
        ("DateTime64(9, 'UTC')", None),
    ],
)
def test_gives_up_on_a_value_it_does_not_model(fast: Any, type_: str, bad: Any) -> None:
    plan = plan_of([type_, "Int64"], ["a", "b"])
    candidates: tuple[Any, ...] = ([], {}, "s", 1, False, 1.0)
    good = next(v for v in candidates if _check(fast, [type_], ["a"], [(v,)]))
    assert fast.encode([(good, 1), (bad, 2)], True, plan) is None
    assert fast.encode([[good, bad], [1, 2]], False, plan) is None


def test_gives_up_on_a_malformed_batch(fast: Any) -> None:
    plan = plan_of(["Int64", "String"], ["a", "b"])
    assert fast.encode([(1, "x"), (2,)], True, plan) is None  # a short row
    assert fast.encode([(1, "x"), {"a": 1, "b": "y"}], True, plan) is None  # not a tuple
    assert fast.encode([[1, 2], ["x"]], False, plan) is None  # columns of unequal length
    assert fast.encode([[1, 2]], False, plan) is None  # a column missing
    with pytest.raises(TypeError):
        fast.encode([(1, "x")], True, ((b"x", "I64"),))


def test_every_schema_type_is_modelled() -> None:
    for t in SCHEMA_TYPES:
        assert native.type_code(t) is not None, t
        # The block names each type as the driver does.
        assert get_from_name(t).insert_name == t
    for t in NOT_MODELLED:
        assert native.type_code(t) is None, t
    for table, cols in native.TABLES.items():
        assert native.plan(table, schema.column_names(cols)) is not None
    assert native.plan(schema.SPANS, ["time", "no_such_column"]) is None
    assert native.plan("some_other_table", ["time"]) is None


def real_rows() -> dict[str, list[tuple[Any, ...]]]:
    """The three tables' rows as the collector makes them: the bench's OTLP and beacon bodies
    parsed, then paired (one hop; two hops — an edge and an origin span with one
    parent)."""
    now = time.time_ns()
    spans_b, beacons_b = _bodies(300, 3)
    spans = [r for b in spans_b for r in otlp.parse(b, False, now, 0, now).rows]
    entries = [r for b in beacons_b for r in beacons.parse(beacons.load(b), now, 0, now).rows]
    span_rows, entry_rows = list(map(SpanRow._make, spans)), list(map(EntryRow._make, entries))
    edge = span_rows[200:]
    origin = [s._replace(span_id=s.span_id[::-1], time=s.time + 1000) for s in edge]
    one_hop, _ = rules.pairs_for(rules.by_trace(span_rows[:200], entry_rows[:200]), now)
    multi, _ = rules.pairs_for(rules.by_trace(edge + origin, entry_rows[200:]), now)
    assert len(one_hop) == 200 and len(multi) == 100
    assert any(len(r.hop_span_ids) == 2 for r in multi)
    # GPU spans (the agent's parallax.gpu.* attributes) and GPU metric points from the SDK.
    spans += [r for r in otlp.parse(_gpu_span_body(), False, now, 0, now).rows]
    e = SdkExporter(None)
    samples = [
        r
        for step in range(3)
        for r in otlp_metrics.parse(e.body(sample_state(step)), False, now, 0, now).rows
    ]
    e.close()
    assert samples and any(r[1] is not None for r in samples)  # cumulative sums' start
    return {
        schema.SPANS: spans,
        schema.ENTRIES: entries,
        schema.PAIRS: [*one_hop, *multi],
        schema.GPU_SAMPLES: samples,
    }


def _gpu_span_body() -> bytes:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    now = time.time_ns()
    for i in range(20):
        sp = ss.spans.add()
        sp.trace_id, sp.span_id, sp.kind = os.urandom(16), os.urandom(8), Span.SPAN_KIND_SERVER
        sp.start_time_unix_nano, sp.end_time_unix_nano = now - 10**9, now
        for k, v in (
            ("parallax.gpu.prefill_launches", 40 + i),
            ("parallax.gpu.decode_wait_us", 1000 * i),
        ):
            kv = sp.attributes.add()
            kv.key, kv.value.int_value = k, v
        for k, d in (
            ("parallax.gpu.prefill_sm_util_pct", 97.5),
            ("parallax.gpu.sample_coverage", 0.5),
        ):
            if i % 3:  # some absent: NULL
                kv = sp.attributes.add()
                kv.key, kv.value.double_value = k, d
        kv = sp.attributes.add()
        kv.key, kv.value.string_value = "parallax.gpu.uuid", f"GPU-{i % 2}"
    out: bytes = req.SerializeToString()
    return out


def test_real_rows_byte_identical(fast: Any) -> None:
    for table, rows in real_rows().items():
        cols = native.TABLES[table]
        names = schema.column_names(cols)
        block = native.encode(table, names, rows, True)
        assert block is not None, table
        assert block == native.encode(
            table, names, [list(c) for c in zip(*rows, strict=True)], False
        )
        assert block == reference([c.type for c in cols], names, rows), table


_CHDB_SCRIPT = """
import json, sys, time
import clickhouse_connect.driver.client as cc
from collector.store import native, schema
from collector.store.client import Store
from collector.pipeline import is_permanent
from tests.collector.test_native_fast import real_rows
driver_inserts = []
orig = cc.Client.insert
def counting(self, *a, **kw):
    driver_inserts.append(a[0] if a else kw.get('table'))
    return orig(self, *a, **kw)
cc.Client.insert = counting
st = Store('chdb://' + sys.argv[1]); st.migrate(7)
def select(col):
    if col.type.startswith(('DateTime64', 'Nullable(DateTime64')):
        p = col.type.split('(')[-1][0] if col.type.startswith('N') else col.type[11]
        unit = {'3': 'Milli', '6': 'Micro', '9': 'Nano'}[p]
        return f'toUnixTimestamp64{unit}(`{col.name}`)'
    return f'`{col.name}`'
def norm(v):
    return [norm(x) for x in v] if isinstance(v, (list, tuple)) else v
def read(table, key):
    cols = native.TABLES[table]
    sql = f"SELECT {', '.join(select(c) for c in cols)} FROM parallax.{table} ORDER BY {key}"
    return [norm(r) for r in st.query(sql).result_rows]
out = {}
rows = real_rows()
keys = {schema.SPANS: ['span_id'], schema.ENTRIES: ['span_id'], schema.PAIRS: ['span_id'],
        schema.GPU_SAMPLES: ['hw_id', 'metric', 'pid', 'time']}
for table, rs in rows.items():
    names = schema.column_names(native.TABLES[table])
    st.insert_rows(table, rs, names, token='t-' + table)
    ix = [names.index(k) for k in keys[table]]
    want = sorted((norm(r) for r in rs), key=lambda r: [r[i] for i in ix])
    out[table] = read(table, ', '.join(keys[table])) == want
out['fast_driver_inserts'] = len(driver_inserts)
# A value the encoder does not model but the driver takes (True in UInt32 `pid`): the driver.
names = schema.column_names(schema.SPAN_COLUMNS)
pid = names.index('pid')
odd = [r[:pid] + (True,) + r[pid + 1:] for r in rows[schema.SPANS][:3]]
odd = [r[:4] + (f'{i + 1:016x}',) + r[5:] for i, r in enumerate(odd)]  # span ids of their own
st.insert_rows(schema.SPANS, odd, names)
got = st.rows("SELECT pid FROM parallax.server_spans WHERE span_id LIKE '00000000000000%'")
out['odd_via_driver'] = len(driver_inserts) == 1 and sorted(r['pid'] for r in got) == [1, 1, 1]
# A bad value (a non-number str in UInt16 `status`): the driver's own error, permanent (the
# writer bisects and quarantines on it); nothing written.
status = names.index('status')
bad = [r[:status] + ('ok',) + r[status + 1:] for r in rows[schema.SPANS][:2]]
def count(table):
    return st.query(f'SELECT count() FROM parallax.{table}').result_rows[0][0]
n0 = count(schema.SPANS)
try:
    st.insert_rows(schema.SPANS, bad, names)
    out['bad'] = 'accepted'
except Exception as e:
    out['bad'] = type(e).__name__ if is_permanent(e) else 'transient: ' + repr(e)
out['bad_nothing_written'] = count(schema.SPANS) == n0
# The same batch and token once more: deduplicated (the token reaches the store).
names = schema.column_names(schema.ENTRY_COLUMNS)
st.insert_rows(schema.ENTRIES, rows[schema.ENTRIES], names, token='t-' + schema.ENTRIES)
out['dedup'] = count(schema.ENTRIES) == len(rows[schema.ENTRIES])
print(json.dumps(out))
"""


def test_chdb_insert_reads_back_equal_and_falls_back(fast: Any, tmp_path: Path) -> None:
    out = run_store_script(_CHDB_SCRIPT, tmp_path / "chdb")
    assert out[schema.SPANS] and out[schema.ENTRIES] and out[schema.PAIRS], out
    assert out[schema.GPU_SAMPLES], out
    assert out["fast_driver_inserts"] == 0, out  # all four through the compiled encoder
    assert out["odd_via_driver"], out
    assert out["bad"] in ("DataError", "ValueError", "TypeError"), out
    assert out["bad_nothing_written"], out
    assert out["dedup"], out


def test_turned_off_by_the_environment(fast: Any) -> None:
    code = (
        "from collector.store import native, schema; "
        "print(native.describe(), native.encode(schema.SPANS, ['pid'], [(1,)], True) is None)"
    )
    root = Path(__file__).resolve().parents[2]
    for env, want in (("1", "compiled (_native_fast"), ("0", "clickhouse-connect")):
        p = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=root,
            env={**os.environ, "PARALLAX_NATIVE_FAST": env},
        )
        assert p.returncode == 0, p.stderr
        assert want in p.stdout, p.stdout
        assert p.stdout.strip().endswith(str(env == "0")), p.stdout
