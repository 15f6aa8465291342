"""Measures the compiled Native encoder against clickhouse-connect's encoding, in one process.

``python -m bench.native_encoder [--rows N] [--reps R] [--data-dir DIR]`` (wrap in
``flock /tmp/parallax-bench.lock`` on the shared machine). Rows: the bench's OTLP and
beacon bodies parsed, and their pairs. Prints, per table, µs per row (CPU,
alternating before/after R times: the median and the range):

- encode: the transposition the caller does plus the encoding — before: the driver's
  (InsertContext + NativeTransform.build_insert, as client.insert runs it); after: the
  compiled encoder (from columns for spans and entries, as the writer calls it; from the
  rows for pairs, as the pairer does); and the compiled encoder from rows for all three;
- insert: Store.insert / insert_rows into chDB, whole (before: the compiled encoder turned
  off, the driver's path), CPU of the process (chDB's threads included) and of the calling
  thread (the one that holds the GIL); merges stopped, so each insert pays only for itself.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from clickhouse_connect.datatypes.registry import get_from_name
from clickhouse_connect.driver.insert import InsertContext
from clickhouse_connect.driver.transform import NativeTransform

from bench.collector import _bodies
from collector.ingest import beacons, otlp
from collector.pairing import rules
from collector.store import native, schema
from collector.store.client import Store
from collector.store.rows import EntryRow, SpanRow

BATCH = 5000  # rows per insert, as bench.collector's stage measurement


def _cpu() -> float:
    return time.process_time()  # every thread of the process (chDB's too), ns resolution


def _rows(n: int) -> dict[str, list[tuple[Any, ...]]]:
    now = time.time_ns()
    spans_b, beacons_b = _bodies(n, 5)
    spans = [r for b in spans_b for r in otlp.parse(b, False, now, 0, now).rows]
    entries = [r for b in beacons_b for r in beacons.parse(beacons.load(b), now, 0, now).rows]
    pairs, _ = rules.pairs_for(
        rules.by_trace(map(SpanRow._make, spans), map(EntryRow._make, entries)), now
    )
    return {schema.SPANS: spans, schema.ENTRIES: entries, schema.PAIRS: [*pairs]}


def _driver_encode(table: str, rows: list[tuple[Any, ...]]) -> int:
    cols = native.TABLES[table]
    ctx = InsertContext(
        table,
        schema.column_names(cols),
        [get_from_name(c.type) for c in cols],
        list(zip(*rows, strict=True)),
        column_oriented=True,
    )
    return sum(len(b) for b in NativeTransform.build_insert(ctx))


def _fast_encode(table: str, by_rows: bool, rows: list[tuple[Any, ...]]) -> int:
    names = schema.column_names(native.TABLES[table])
    data = rows if by_rows else list(zip(*rows, strict=True))
    block = native.encode(table, names, data, by_rows)
    assert block is not None
    return len(block)


def _per_row(
    fn: Callable[[list[tuple[Any, ...]]], object], rows: list[tuple[Any, ...]]
) -> tuple[float, float]:
    """(process CPU, calling thread's CPU) µs per row. The cyclic GC: everything alive before
    is frozen (not scanned), and one collection at the end counts in — so each run pays for
    its own cyclic garbage (the driver's insert contexts are reference cycles), not for the
    previous run's or for scanning the rows under test."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        t, tt = _cpu(), time.thread_time()
        for i in range(0, len(rows), BATCH):
            fn(rows[i : i + BATCH])
        gc.collect()
        return (_cpu() - t) / len(rows) * 1e6, (time.thread_time() - tt) / len(rows) * 1e6
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.native_encoder")
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--data-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    fast = native.compiled()
    if fast is None:
        print("the compiled encoder is not built (python -m parallax_contracts.compiled)")
        return 1
    rows = _rows(args.rows)
    tmp = tempfile.TemporaryDirectory(prefix="native-bench-")
    data_dir = args.data_dir or Path(tmp.name)
    st = Store(f"chdb://{(data_dir / 'chdb').resolve()}")
    st.migrate(7)
    for table in rows:  # what an insert costs, not the background merges of earlier ones
        st.query(f"SYSTEM STOP MERGES {st.database}.{table}")
    for table, rs in rows.items():  # warm-up: the driver's first insert imports pandas
        names = schema.column_names(native.TABLES[table])
        st.insert(table, list(zip(*rs[:10], strict=True)), names)
    res: dict[tuple[str, str], list[float]] = {}
    k = 0
    for _ in range(args.reps):
        for table, rs in rows.items():
            names = schema.column_names(native.TABLES[table])
            by_rows = table == schema.PAIRS  # as the callers do
            runs: list[tuple[str, Callable[[list[tuple[Any, ...]]], object]]] = [
                ("encode: driver", partial(_driver_encode, table)),
                ("encode: compiled", partial(_fast_encode, table, by_rows)),
                ("encode: compiled, rows", partial(_fast_encode, table, True)),
            ]
            for label, fn in runs:
                res.setdefault((table, label), []).append(_per_row(fn, rs)[1])
            for label, on in (("insert: driver", False), ("insert: compiled", True)):
                native._fast = fast if on else None
                # Rows of their own each time: the tables deduplicate a repeated block.
                k += 1
                shifted = [(r[0] + k, *r[1:]) for r in rs]

                def ins(b: list[tuple[Any, ...]], t: str = table, n: list[str] = names) -> None:
                    if t == schema.PAIRS:
                        st.insert_rows(t, b, n)
                    else:
                        st.insert(t, list(zip(*b, strict=True)), n)

                cpu, thread = _per_row(ins, shifted)
                res.setdefault((table, label + " (process)"), []).append(cpu)
                res.setdefault((table, label + " (thread)"), []).append(thread)
            native._fast = fast
    print(f"µs per row, median of {args.reps} alternating repetitions, {args.rows} rows per table")
    for (table, label), v in res.items():
        print(f"{table:16} {label:24} {statistics.median(v):7.2f}  ({min(v):.2f}-{max(v):.2f})")
    st.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
