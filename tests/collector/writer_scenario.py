"""Writer scenarios against a real chDB store, run in a child process by test_writer.py
(chDB allows one data directory per process): ``python -m tests.collector.writer_scenario
DIR`` prints one JSON object of observations.

1. Rows the store rejects for good — one value the driver cannot encode for its column (as if
   validation had let it through) and one the store refuses (a CHECK constraint) — among
   good rows: the good ones are written once, the bad ones quarantined, later segments go on.
2. The same segment inserted again (a replay after a crash mid-bisection): nothing doubles.
3. Segments that did not fit in memory are re-read from the spool while the live dedup set
   already holds their ids: every row is still written.
4. Many bad rows and a small bisection budget: every row ends up written or quarantined,
   none both, none twice.
5. A batch refused whole whose halves are accepted: all written, nothing quarantined.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from clickhouse_connect.driver.exceptions import DatabaseError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from collector import pipeline
from collector.api.ingest import Ingest, _dedup_spans
from collector.config import Settings
from collector.ingest import otlp
from collector.metrics import Metrics
from collector.pipeline import KIND_OTLP_PROTO, SPANS, Pipeline
from collector.store import schema
from collector.store.client import Store
from parallax_contracts.trace_context import new_span_id, new_trace_id

STATUS = schema.column_names(schema.SPAN_COLUMNS).index("status")


class Recorder(Metrics):
    def __init__(self) -> None:
        super().__init__()
        self.handed_to_pairer: list[str] = []
        self.quarantined_n = 0

    def rows_written(self, rows: dict[str, list[tuple[Any, ...]]]) -> None:
        self.handed_to_pairer += [r[4] for r in rows[SPANS]]

    def quarantined(self, source: str, rows: int) -> None:
        super().quarantined(source, rows)
        self.quarantined_n += rows


def body(n: int, status: int = 200) -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "writer"
    ss = rs.scope_spans.add()
    now = time.time_ns()
    for _ in range(n):
        sp = ss.spans.add()
        sp.trace_id, sp.span_id = bytes.fromhex(new_trace_id()), bytes.fromhex(new_span_id())
        sp.kind = Span.SpanKind.SPAN_KIND_SERVER
        sp.name = "GET /x"
        sp.start_time_unix_nano, sp.end_time_unix_nano = now, now + 1_000_000
        kv = sp.attributes.add()
        kv.key, kv.value.int_value = "http.response.status_code", status
    out: bytes = req.SerializeToString()
    return out


def drain(p: Pipeline, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (p.pending_rows or p.queue_segments()) and time.monotonic() < deadline:
        time.sleep(0.05)


def span_ids(store: Store) -> list[str]:
    rows = store.query("SELECT span_id FROM parallax.server_spans").result_rows
    return [r[0] for r in rows]


def main(base: Path) -> dict[str, Any]:
    store = Store(f"chdb://{base / 'chdb'}")
    store.migrate(7)
    # The store refuses this one value (a server-side rejection of the whole block).
    store.client().command(
        "ALTER TABLE parallax.server_spans ADD CONSTRAINT no_599 CHECK status != 599"
    )
    settings = Settings(data_dir=base)
    rec = Recorder()
    ingest = Ingest(settings, rec)
    out: dict[str, Any] = {}

    # --- 1. one segment of 40 rows with two bad ones, then two good segments ------------
    pipe = Pipeline(store, base / "spool", ingest.parse, rec, batch_rows=40, flush_interval_s=60)
    pipe.start()
    now = time.time_ns()
    p1 = otlp.parse(body(19), False, now, 0, now)
    p599 = otlp.parse(body(1, status=599), False, now, 0, now)
    p2 = otlp.parse(body(20), False, now, 0, now)
    # A value outside its column's type (UInt16) that "slipped through validation".
    bad_row = list(p2.rows[7])
    bad_row[STATUS] = 70_000
    p2.rows[7] = tuple(bad_row)
    bad_ids = {p599.rows[0][4], p2.rows[7][4]}
    for p in (p1, p599, p2):
        pipe.accept(KIND_OTLP_PROTO, b"x", now, p)  # the bodies do not matter here
    later = [otlp.parse(body(40), False, now, 0, now) for _ in range(2)]
    for p in later:
        pipe.accept(KIND_OTLP_PROTO, b"x", now, p)
    drain(pipe)
    ids = span_ids(store)
    good = {r[4] for p in (p1, p599, p2, *later) for r in p.rows} - bad_ids
    out["written"] = len(ids)
    out["written_distinct"] = len(set(ids))
    out["good_expected"] = len(good)
    out["good_all_written"] = good == set(ids)
    out["bad_written"] = sorted(bad_ids & set(ids))
    out["queue_left"] = pipe.pending_rows + pipe.queue_segments()
    out["last_error"] = pipe.last_error
    qfiles = sorted((base / "quarantine").glob("*.jsonl"))
    qrows = [json.loads(line) for f in qfiles for line in f.read_text().splitlines()]
    out["quarantine_files"] = len(qfiles)
    out["quarantined_ids_ok"] = {q["row"]["span_id"] for q in qrows} == bad_ids
    out["quarantine_errors"] = sorted(q["error"].split(":")[0] for q in qrows)
    out["quarantined_metric"] = rec.quarantined_n
    out["handed_to_pairer"] = len(rec.handed_to_pairer)
    out["bad_handed_to_pairer"] = sorted(bad_ids & set(rec.handed_to_pairer))

    # --- 2. the bad segment inserted again (replay after a crash): nothing doubles ------
    replay = {SPANS: p1.rows + p599.rows + p2.rows, "entries": []}
    seg_id = int(qfiles[0].name.split(".")[0])
    pipe._insert(seg_id, replay)
    out["after_replay"] = len(span_ids(store))
    pipe.stop()

    # --- 3. segments re-read from disk with the live dedup set already full --------------
    before = len(span_ids(store))
    pipe2 = Pipeline(
        store,
        base / "spool2",
        ingest.parse,
        rec,
        batch_rows=30,
        memory_rows=0,
        flush_interval_s=60,
    )
    pipe2.start()
    n = 0
    for _ in range(3):
        b = body(30)
        p = otlp.parse(b, False, now, 0, now)
        _dedup_spans(p, ingest.recent_spans)  # as the HTTP handler does
        pipe2.accept(KIND_OTLP_PROTO, b, time.time_ns(), p)
        n += 30
    drain(pipe2)
    out["reread_expected"] = n
    out["reread_written"] = len(span_ids(store)) - before
    pipe2.stop()

    # --- 4. many bad rows: the bisection's insert budget runs out ------------------------
    before_ids = set(span_ids(store))
    pipeline.BISECT_MAX_INSERTS = 6
    pipe3 = Pipeline(store, base / "spool3", ingest.parse, rec, batch_rows=64, flush_interval_s=60)
    pipe3.start()
    p4 = otlp.parse(body(64), False, now, 0, now)
    bad4 = set()
    for i in (1, 9, 17, 40, 41, 63):
        row = list(p4.rows[i])
        row[STATUS] = 70_000
        p4.rows[i] = tuple(row)
        bad4.add(row[4])
    pipe3.accept(KIND_OTLP_PROTO, b"x", now, p4)
    drain(pipe3)
    pipe3.stop()
    new_ids = [i for i in span_ids(store) if i not in before_ids]
    q4 = [
        json.loads(line)["row"]["span_id"]
        for f in sorted((base / "quarantine").glob("*.jsonl"))
        if f.name != qfiles[0].name
        for line in f.read_text().splitlines()
    ]
    all4 = {r[4] for r in p4.rows}
    out["budget_written"] = len(new_ids)
    out["budget_quarantined"] = len(q4)
    out["budget_accounted"] = set(new_ids) | set(q4) == all4 and not set(new_ids) & set(q4)
    out["budget_bad_quarantined"] = bad4 <= set(q4)
    out["budget_doubled"] = len(new_ids) != len(set(new_ids))

    # --- 5. a batch refused whole whose halves go in: nothing quarantined ----------------
    class Picky(Store):
        """The real store, refusing blocks over 20 rows as a data error."""

        def insert(self, table: str, columns: Any, column_names: Any, token: Any = None) -> None:
            if len(columns[0]) > 20:
                raise DatabaseError("Code: 53. DB::Exception: refused (test)", code=53)
            super().insert(table, columns, column_names, token)

    picky = Picky(store.dsn)
    before_ids = set(span_ids(store))
    n_quarantine = len(list((base / "quarantine").glob("*.jsonl")))
    pipe4 = Pipeline(picky, base / "spool4", ingest.parse, rec, batch_rows=40, flush_interval_s=60)
    pipe4.start()
    p5 = otlp.parse(body(40), False, now, 0, now)
    pipe4.accept(KIND_OTLP_PROTO, b"x", now, p5)
    drain(pipe4)
    pipe4.stop()
    new5 = [i for i in span_ids(store) if i not in before_ids]
    out["halves_written"] = len(new5) == len(set(new5)) == 40
    out["halves_quarantined"] = len(list((base / "quarantine").glob("*.jsonl"))) - n_quarantine
    out["halves_error"] = pipe4.last_error
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
