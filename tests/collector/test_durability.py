"""Data answered 2xx is never lost and never doubled: store outage, SIGKILL, replay.

Counts are read from the stopped collector's chDB directory in a separate process (chDB
allows one process per directory), raw ``count()`` without FINAL: exactness must not
depend on a merge.
"""

from __future__ import annotations

import gzip
import json
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)

from demo.stack import free_port
from tests.collector.faults import otlp_request
from tests.collector.helpers import beacon, entry, post_beacon, start_collector

_COUNT = (
    "import json, sys, clickhouse_connect\n"
    "c = clickhouse_connect.get_client(dsn='chdb://' + sys.argv[1])\n"
    "out = {t: c.query(f'SELECT count() FROM parallax.{t}').result_rows[0][0]\n"
    "       for t in ('server_spans', 'browser_entries')}\n"
    "out['distinct_spans'] = c.query('SELECT uniqExact(span_id) FROM "
    "parallax.server_spans').result_rows[0][0]\n"
    "print(json.dumps(out))\n"
)


def count_rows(data_dir: Path) -> dict[str, int]:
    p = subprocess.run(
        [sys.executable, "-c", _COUNT, str((data_dir / "chdb").resolve())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    counts: dict[str, int] = json.loads(p.stdout.strip().splitlines()[-1])
    return counts


def otlp_body(n_spans: int) -> bytes:
    return otlp_request(n_spans)[0]


def post_load(ingest: str, posts: int, spans_per_post: int, entries_per_post: int) -> None:
    """``posts`` OTLP requests and ``posts`` beacons from 4 threads; all must be 2xx."""

    def one(i: int) -> None:
        body = otlp_body(spans_per_post)
        if i % 2:  # half of them gzip-compressed, as SDK exporters send
            r = httpx.post(
                f"{ingest}/v1/traces",
                content=gzip.compress(body),
                timeout=10,
                headers={"content-type": "application/x-protobuf", "content-encoding": "gzip"},
            )
        else:
            r = httpx.post(
                f"{ingest}/v1/traces",
                content=body,
                timeout=10,
                headers={"content-type": "application/x-protobuf"},
            )
        assert r.status_code == 200, r.text
        assert not ExportTraceServiceResponse.FromString(r.content).partial_success.rejected_spans
        doc = beacon([entry() for _ in range(entries_per_post)], session=f"sess-{i:06d}")
        rb = post_beacon(ingest, doc)
        assert rb.status_code == 200 and rb.json()["accepted"] == entries_per_post, rb.text

    with ThreadPoolExecutor(4) as ex:
        list(ex.map(one, range(posts)))


def spool_files(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "spool").glob("*.seg"))


def test_store_outage_then_recovery_exactly_n(tmp_path: Path) -> None:
    """The store is a ClickHouse server DSN whose port refuses connections: every post is
    still answered 200 (spooled). The store comes back (here: the same data dir served by
    the embedded store) and exactly the accepted rows are written."""
    data = tmp_path / "data"
    dead = f"http://127.0.0.1:{free_port()}/parallax"
    c = start_collector(data, "--store", dead, "--rate", "0")
    try:
        c.wait_ready(need_store=False)
        r = httpx.get(f"{c.query}/readyz", timeout=5)
        assert r.status_code == 503 and "unreachable" in r.text
        post_load(c.ingest, posts=40, spans_per_post=25, entries_per_post=5)
        assert spool_files(data), "accepted data must be on disk"
        metrics = httpx.get(f"{c.query}/metrics", timeout=5).text
        assert "parallax_collector_spool_bytes" in metrics
    finally:
        assert c.stop() == 0
    assert spool_files(data), "undelivered data stays in the spool across a restart"
    c2 = start_collector(data)
    try:
        c2.wait_ready()
        deadline = time.monotonic() + 60
        while spool_files(data) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not spool_files(data), c2.tail()
    finally:
        assert c2.stop() == 0
    counts = count_rows(data)
    assert counts == {"server_spans": 1000, "browser_entries": 200, "distinct_spans": 1000}


def test_sigkill_before_flush_nothing_lost_nothing_doubled(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # A long flush interval: the answered data sits in the spool, not yet in the store.
    c = start_collector(data, "--flush-interval", "60", "--batch-rows", "1000000", "--rate", "0")
    c.wait_ready()
    post_load(c.ingest, posts=30, spans_per_post=10, entries_per_post=4)
    c.stop(signal.SIGKILL)
    assert c.proc.returncode == -signal.SIGKILL
    segs = spool_files(data)
    assert segs
    # Keep a copy of the segment: replaying it after it was written is the other crash
    # window (killed between the insert and the spool file's removal).
    saved = tmp_path / "saved"
    saved.mkdir()
    for s in segs:
        shutil.copy(s, saved / s.name)
    c2 = start_collector(data)
    try:
        c2.wait_ready()
        deadline = time.monotonic() + 60
        while spool_files(data) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not spool_files(data), c2.tail()
    finally:
        assert c2.stop() == 0
    assert count_rows(data) == {"server_spans": 300, "browser_entries": 120, "distinct_spans": 300}
    for s in saved.iterdir():
        shutil.copy(s, data / "spool" / s.name)
    c3 = start_collector(data)
    try:
        c3.wait_ready()
        deadline = time.monotonic() + 60
        while spool_files(data) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not spool_files(data), c3.tail()
    finally:
        assert c3.stop() == 0
    assert count_rows(data) == {"server_spans": 300, "browser_entries": 120, "distinct_spans": 300}


def test_client_retry_is_not_double_counted(tmp_path: Path) -> None:
    data = tmp_path / "data"
    c = start_collector(data, "--rate", "0")
    try:
        c.wait_ready()
        body = otlp_body(50)
        doc = beacon([entry() for _ in range(7)])
        for _ in range(3):  # the exporter and the probe retry after a lost answer
            r = httpx.post(
                f"{c.ingest}/v1/traces",
                content=body,
                timeout=10,
                headers={"content-type": "application/x-protobuf"},
            )
            assert r.status_code == 200
            assert post_beacon(c.ingest, doc).status_code == 200
        time.sleep(1.0)
    finally:
        assert c.stop() == 0
    assert count_rows(data) == {"server_spans": 50, "browser_entries": 7, "distinct_spans": 50}


def test_the_spool_replays_every_kind_the_pipeline_writes() -> None:
    """A kind the spool's reader does not know is skipped as damage on replay: acknowledged
    records lost (the OTLP metrics kinds were, once)."""
    from collector import pipeline, spool

    assert set(pipeline._KIND_SOURCE) == spool.KINDS
    data = b"".join(spool.frame(kind, 123 + kind, b"body") for kind in sorted(spool.KINDS))
    records, _ = spool.parse_segment(data)
    assert [(k, t) for k, t, _ in records] == [(k, 123 + k) for k in sorted(spool.KINDS)]
