"""Accepted data → spool on disk → batched, column-oriented, idempotent inserts.

Every accepted request body is appended to the open spool segment *before* the request is
answered, and its parsed rows to the segment's in-memory batch. A segment is closed when it
holds ``batch_rows`` rows or is ``flush_interval_s`` old; the writer thread inserts closed
segments strictly in order, one insert per table with the dedup token ``<segment>:<table>``,
then deletes the file. A failed insert is retried with backoff while new data keeps being
spooled (bounded by ``spool_max_bytes``: beyond it the collector answers 503 instead of
accepting what it cannot keep). After a crash the remaining segments are replayed in order
from their bodies; a segment that was inserted just before the crash is dropped by the
store's token deduplication, so nothing is lost and nothing doubled.

A store that *rejects* rows (a value outside a column's type that slipped through
validation, a constraint) would block every later segment if retried for ever: such a
permanent failure (see ``is_permanent``) is answered by bisecting the batch — halves are
inserted with their own dedup tokens until the rejected rows are isolated — writing the good
rows and moving the rejected ones to ``<data-dir>/quarantine/<segment>.<table>.jsonl``
(fsync'ed before the segment is deleted), with a metric and one log line. Transient failures
(connection refused, timeouts, a restarting store) are retried as before.

A record is acknowledged only once it is wholly in the segment file (collector/spool.py:
a failed or short write is undone, the request answered 503 + Retry-After, and a full disk
is a state that ends by itself when space returns). A ``write()`` that has returned
survives a SIGKILL of the collector (the kernel holds the page); ``fsync=True`` also
survives a power loss, at the cost of one fsync per request.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import secrets
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clickhouse_connect.driver.exceptions import DatabaseError, DataError

from collector import spool
from collector.ingest.common import Parsed
from collector.store import schema

log = logging.getLogger("parallax.collector")
# The driver logs a traceback for every value it cannot encode, before raising the error to
# the writer — which says it once per segment (bisection would repeat it a dozen times).
logging.getLogger("clickhouse_connect.driver.transform").setLevel(logging.CRITICAL)

KIND_OTLP_PROTO, KIND_OTLP_JSON, KIND_BEACON = 1, 2, 3
KIND_METRICS_PROTO, KIND_METRICS_JSON = 4, 5  # OTLP metrics (/v1/metrics)
SPANS, ENTRIES, GPU_SAMPLES = "spans", "entries", "gpu_samples"
REQUEST_COUNTS = schema.REQUEST_COUNTS  # filled beside gpu_samples (Parsed.more)
_KIND_SOURCE = {  # every kind the spool frames (spool.KINDS; a test holds the two together)
    KIND_OTLP_PROTO: SPANS,
    KIND_OTLP_JSON: SPANS,
    KIND_BEACON: ENTRIES,
    KIND_METRICS_PROTO: GPU_SAMPLES,
    KIND_METRICS_JSON: GPU_SAMPLES,
}
# Each source's table, inserted in this order per segment.
_TABLES = (
    (SPANS, schema.SPANS, schema.SPAN_COLUMNS),
    (ENTRIES, schema.ENTRIES, schema.ENTRY_COLUMNS),
    (GPU_SAMPLES, schema.GPU_SAMPLES, schema.GPU_SAMPLE_COLUMNS),
    (REQUEST_COUNTS, schema.REQUEST_COUNTS, schema.REQUEST_COUNT_COLUMNS),
)

Reparse = Callable[[int, bytes, int], Parsed]
Rows = list[tuple[Any, ...]]

# ClickHouse error codes meaning "these values cannot be stored" (the same rows fail on every
# retry), as opposed to "the store is unwell" (anything else: retried with backoff).
DATA_ERROR_CODES = frozenset(
    {
        6,  # CANNOT_PARSE_TEXT
        26,  # CANNOT_PARSE_QUOTED_STRING
        27,  # CANNOT_PARSE_INPUT_ASSERTION_FAILED
        38,  # CANNOT_PARSE_DATE
        41,  # CANNOT_PARSE_DATETIME
        43,  # ILLEGAL_TYPE_OF_ARGUMENT
        53,  # TYPE_MISMATCH
        69,  # ARGUMENT_OUT_OF_BOUND
        70,  # CANNOT_CONVERT_TYPE
        72,  # CANNOT_PARSE_NUMBER
        117,  # INCORRECT_DATA
        131,  # TOO_LARGE_STRING_SIZE
        190,  # SIZES_OF_ARRAYS_DONT_MATCH
        321,  # VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
        349,  # CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
        469,  # VIOLATED_CONSTRAINT
    }
)
_CODE = re.compile(r"\bCode:\s*(\d+)")
# Inserts one bisection may make: well inside the tables' deduplication window
# (schema.DEDUP_WINDOW blocks), so a replay after a crash mid-bisection doubles nothing.
BISECT_MAX_INSERTS = schema.DEDUP_WINDOW // 4


IDENTITY = "identity"  # the spool's name in insert tokens, a file beside its segments


def spool_identity(spool_dir: Path, last_segment: int) -> tuple[str, int]:
    """This spool's name in insert tokens, and the newest segment made before it had one.

    Segment ids are clock readings (ns), and a token stands for a block of the whole table
    (on a cluster, shard by shard): two collectors writing one store that opened segments
    in the same nanosecond would have the second's rows dropped as a repeat of the first's.
    A random name kept beside the segments makes each spool's tokens its own and stays the
    same across restarts (a replay must repeat the token). Segments a version without it
    left keep the token they may already have been inserted with."""
    path = spool_dir / IDENTITY
    try:
        name, _, upto = path.read_text().partition(" ")
        if re.fullmatch(r"[0-9a-f]{16}", name):
            return name, int(upto)
    except (FileNotFoundError, ValueError):
        pass
    name = secrets.token_hex(8)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        f.write(f"{name} {last_segment}")
        f.flush()
        os.fsync(f.fileno())  # before any insert carries it
    os.replace(tmp, path)
    return name, last_segment


def is_permanent(e: BaseException) -> bool:
    """True when the store (or the driver, serializing the block) rejects the data itself."""
    if isinstance(e, DataError | ValueError | TypeError | OverflowError | struct.error):
        return True  # clickhouse-connect could not encode a value for its column type
    if isinstance(e, DatabaseError):
        code = getattr(e, "code", None)
        if code is None:
            m = _CODE.search(str(e))
            code = int(m.group(1)) if m else None
        return code in DATA_ERROR_CODES
    return False


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


class SpoolLockedError(Exception):
    """Another process owns this spool directory."""


class SpoolFullError(Exception):
    """The spool cannot keep this request now — it holds spool_max_bytes, its disk is full,
    or the write failed: refuse (503 + Retry-After) rather than accept and lose. The message
    is the one-line reason."""


def _empty_rows() -> dict[str, list[tuple[Any, ...]]]:
    return {source: [] for source, _, _ in _TABLES}


@dataclass(slots=True)
class Segment:
    id: int
    path: Path
    opened: float
    rows: dict[str, list[tuple[Any, ...]]] | None = field(default_factory=_empty_rows)
    trace_ids: list[str] = field(default_factory=list)
    nrows: int = 0
    nbytes: int = 0


class Hooks:
    """Callbacks into metrics and pairing; the defaults do nothing."""

    def written(self, source: str, rows: int, seconds: float) -> None: ...

    def store_error(self, error: BaseException) -> None: ...

    def rows_written(self, rows: dict[str, list[tuple[Any, ...]]]) -> None:
        """After a segment is in the store: its rows by source (spans, entries, gpu_samples,
        request_counts)."""

    def quarantined(self, source: str, rows: int) -> None:
        """Rows the store rejected for good, moved to the quarantine directory."""

    def spool_write_failed(self, reason: str) -> None:
        """A spool write failed (undone; the request was refused with 503)."""

    def spool_skipped(self, nbytes: int) -> None:
        """Replay skipped a torn or damaged stretch of a segment."""


class Pipeline:
    def __init__(
        self,
        store: Any,
        spool_dir: Path,
        reparse: Reparse,
        hooks: Hooks | None = None,
        batch_rows: int = 20_000,
        flush_interval_s: float = 0.5,
        spool_max_bytes: int = 1 << 30,
        memory_rows: int = 1_000_000,
        fsync: bool = False,
        quarantine_dir: Path | None = None,
    ):
        self.store = store
        self.dir = spool_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.reparse = reparse
        # Next to the spool by default: <data-dir>/quarantine.
        self.quarantine_dir = quarantine_dir or spool_dir.parent / "quarantine"
        self.quarantined_rows = 0
        self.hooks = hooks or Hooks()
        self.batch_rows = batch_rows
        self.flush_interval_s = flush_interval_s
        self.spool_max_bytes = spool_max_bytes
        self.memory_rows = memory_rows
        self.fsync = fsync
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._pending: deque[Segment] = deque()
        self._open: Segment | None = None
        self._file: spool.SegmentFile | None = None
        self.disk = spool.DiskState(spool_dir)
        self._logged_error: tuple[int | None, float] = (None, 0.0)
        self._last_id = 0
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self.spool_bytes = 0
        self.pending_rows = 0
        self.memory_pending_rows = 0
        self.last_error: str | None = None
        self.replayed_segments = 0
        # start() reads the spool's name; until then tokens are the bare segment's
        self._spool_name, self._unnamed_upto = "", 1 << 63

    # --- life cycle --------------------------------------------------------------
    def start(self) -> None:
        """Queue the segments a previous run left (in order), then start the threads."""
        # One process per spool: a second collector on the same data dir must not replay
        # (and delete) segments the first one is writing.
        self._lockfile = (self.dir / ".lock").open("w")
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise SpoolLockedError(
                f"spool {self.dir} is in use by another collector (one process per data dir): "
                "stop it, or give this one another --data-dir"
            ) from None
        for p in sorted(self.dir.glob("*.seg")):
            seg_id = int(p.stem)
            size = p.stat().st_size
            seg = Segment(seg_id, p, time.monotonic(), rows=None, nbytes=size)
            self._pending.append(seg)
            self.spool_bytes += size
            self._last_id = max(self._last_id, seg_id)
            self.replayed_segments += 1
        self._spool_name, self._unnamed_upto = spool_identity(self.dir, self._last_id)
        if self.replayed_segments:
            log.info("spool: replaying %d segment(s) left by the previous run", len(self._pending))
        for target, name in ((self._writer, "writer"), (self._ticker, "flush-timer")):
            t = threading.Thread(target=target, name=f"parallax-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Close the open segment and give the writer ``timeout_s`` to drain. True if drained;
        whatever is left stays in the spool for the next start."""
        with self._cv:
            self._rotate_locked()
            deadline = time.monotonic() + timeout_s
            # A failing store will not drain: leave the rest in the spool without waiting.
            while self._pending and time.monotonic() < deadline and self.last_error is None:
                self._cv.wait(0.05)
            drained = not self._pending
            self._stopping = True
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout=2.0)
        return drained

    # --- ingest side -------------------------------------------------------------
    def accept(self, kind: int, body: bytes, received_ns: int, parsed: Parsed) -> None:
        """Spool ``body`` and queue its rows; when this returns, the data is safe. Raises
        SpoolFullError (nothing kept, nothing half-written) when it cannot be."""
        source = _KIND_SOURCE[kind]
        rec = spool.frame(kind, received_ns, body)
        with self._cv:
            if self.spool_bytes + len(rec) > self.spool_max_bytes:
                raise SpoolFullError("spool full: the store is unreachable")
            if not self.disk.may_write(len(rec)):
                raise SpoolFullError("spool disk full")
            try:
                seg = self._open
                if seg is None:
                    seg = self._new_segment_locked()
                assert self._file is not None
                self._file.append(rec)
            except OSError as e:
                raise SpoolFullError(self._write_failed_locked(e)) from None
            self.disk.wrote()
            seg.nbytes += len(rec)
            self.spool_bytes += len(rec)
            if parsed.rows or parsed.more:
                assert seg.rows is not None
                seg.rows[source].extend(parsed.rows)
                for other, more in parsed.more.items():
                    seg.rows[other].extend(more)
                seg.trace_ids.extend(parsed.trace_ids)
                n = parsed.row_count
                seg.nrows += n
                self.pending_rows += n
            if seg.nrows >= self.batch_rows:
                self._rotate_locked()

    def _write_failed_locked(self, e: OSError) -> str:
        """The write was undone (SegmentFile.append): say why once, count it, and leave the
        segment when its file can no longer be trusted. Returns the 503's reason."""
        name = errno.errorcode.get(e.errno or 0, "EIO")
        self.hooks.spool_write_failed(name)
        if e.errno in spool.NO_SPACE:
            self.disk.failed(e)
            reason = "spool disk full"
        else:
            # EIO, a failed fsync, …: logged once per errno a minute, not per request.
            last, at = self._logged_error
            if e.errno != last or time.monotonic() - at > 60:
                self._logged_error = (e.errno, time.monotonic())
                log.error("spool: write failed (%s), answering 503: %s", name, e)
            reason = f"spool write failed: {name}"
        # After anything but a clean undo on a full disk, the next record starts a new
        # segment file (pages a failed fsync dropped, or a tail the undo could not cut).
        if e.errno not in spool.NO_SPACE or (self._file is not None and self._file.broken):
            self._rotate_locked()
        return reason

    def _new_segment_locked(self) -> Segment:
        seg_id = max(time.time_ns(), self._last_id + 1)
        self._last_id = seg_id
        path = self.dir / f"{seg_id:020d}.seg"
        self._file = spool.SegmentFile(path, self.fsync)
        seg = Segment(seg_id, path, time.monotonic())
        self._open = seg
        return seg

    def _rotate_locked(self) -> None:
        seg = self._open
        if seg is None:
            return
        if self._file is not None:
            self._file.close()
        self._file = None
        self._open = None
        if seg.nbytes == 0:
            seg.path.unlink(missing_ok=True)
            return
        if self.memory_pending_rows + seg.nrows > self.memory_rows:
            seg.rows = None  # the writer re-reads it from disk when its turn comes
        else:
            self.memory_pending_rows += seg.nrows
        self._pending.append(seg)
        self._cv.notify_all()

    def _ticker(self) -> None:
        while True:
            with self._cv:
                if self._stopping:
                    return
                seg = self._open
                if seg is not None and time.monotonic() - seg.opened >= self.flush_interval_s:
                    self._rotate_locked()
                self._cv.wait(self.flush_interval_s / 4)

    # --- writer side -------------------------------------------------------------
    def _writer(self) -> None:
        failures = 0
        while True:
            with self._cv:
                while not self._pending and not self._stopping:
                    self._cv.wait(1.0)
                if not self._pending:
                    return
                seg = self._pending[0]
            try:
                in_memory = seg.rows is not None
                rows, trace_ids = self._rows_of(seg)
                written = self._insert(seg.id, rows)
            except Exception as e:  # noqa: BLE001 — a transient store failure: back off, retry
                failures += 1
                self.last_error = _one_line(e)
                if failures == 1 or failures % 20 == 0:
                    log.warning("store write failed (attempt %d): %s", failures, self.last_error)
                self.hooks.store_error(e)
                with contextlib.suppress(Exception):
                    self.store.reset()
                with self._cv:
                    if self._stopping:
                        return
                    self._cv.wait(min(5.0, 0.1 * 2 ** min(failures, 6)))
                continue
            if failures:
                log.info("store writes recovered after %d failed attempt(s)", failures)
            failures = 0
            self.last_error = None
            seg.path.unlink(missing_ok=True)
            with self._cv:
                self._pending.popleft()
                self.spool_bytes -= seg.nbytes
                n = sum(len(r) for r in rows.values())
                self.pending_rows = max(0, self.pending_rows - n)
                if in_memory:
                    self.memory_pending_rows -= seg.nrows
                self._cv.notify_all()
            if trace_ids:
                try:
                    self.hooks.rows_written(written)
                except Exception as e:  # noqa: BLE001 — pairing must never stop the writes
                    log.warning("pairing hand-over failed (writes go on): %s", _one_line(e))

    def _rows_of(self, seg: Segment) -> tuple[dict[str, list[tuple[Any, ...]]], list[str]]:
        if seg.rows is not None:
            return seg.rows, seg.trace_ids
        rows = _empty_rows()
        trace_ids: list[str] = []
        records, damage = spool.read_segment(seg.path)
        if damage.bytes:
            self.hooks.spool_skipped(damage.bytes)
        for kind, received_ns, body in records:
            try:
                parsed = self.reparse(kind, body, received_ns)
            except Exception as e:  # noqa: BLE001 — it was accepted once; skip, say so
                log.warning("spool: dropping an unparseable record in %s: %s", seg.path.name, e)
                continue
            rows[_KIND_SOURCE[kind]].extend(parsed.rows)
            for other, more in parsed.more.items():
                rows[other].extend(more)
            trace_ids.extend(parsed.trace_ids)
        seg.rows, seg.trace_ids = rows, trace_ids
        if seg.nrows == 0:  # replayed from a previous run: count it in now
            seg.nrows = sum(len(r) for r in rows.values())
            with self._cv:
                self.pending_rows += seg.nrows
                self.memory_pending_rows += seg.nrows
        return rows, trace_ids

    def _insert(self, seg_id: int, rows: dict[str, Rows]) -> dict[str, Rows]:
        """Insert a segment's rows; returns the rows now in the store, by source. A transient
        failure raises (the segment is retried); rows the store rejects are quarantined."""
        written: dict[str, Rows] = {}
        for source, table, cols in _TABLES:
            batch = rows.get(source, [])
            written[source] = batch
            if not batch:
                continue
            names = schema.column_names(cols)
            t = time.perf_counter()
            try:
                self._insert_rows(table, names, batch, self._token(seg_id, table))
            except Exception as e:
                if not is_permanent(e):
                    raise
                bad: dict[int, BaseException] = {}
                budget = [BISECT_MAX_INSERTS]
                self._bisect(seg_id, table, names, batch, 0, len(batch), e, bad, budget)
                if bad:  # else the halves went in where the whole did not: nothing to keep
                    self._quarantine(seg_id, source, table, names, batch, bad)
                written[source] = [r for i, r in enumerate(batch) if i not in bad]
            self.hooks.written(source, len(written[source]), time.perf_counter() - t)
        return written

    def _token(self, seg_id: int, table: str, lo: int = -1, hi: int = -1) -> str:
        """The insert deduplication token of a segment's table (``<spool>:<segment>:<table>``),
        of rows lo–hi of it for a bisection."""
        base = (
            f"{seg_id}:{table}"
            if seg_id <= self._unnamed_upto
            else f"{self._spool_name}:{seg_id}:{table}"
        )
        return base if lo < 0 else f"{base}:{lo}-{hi}"

    def _insert_rows(self, table: str, names: list[str], rows: Rows, token: str) -> None:
        self.store.insert(table, list(zip(*rows, strict=True)), names, token=token)

    def _bisect(
        self,
        seg_id: int,
        table: str,
        names: list[str],
        batch: Rows,
        lo: int,
        hi: int,
        error: BaseException,
        bad: dict[int, BaseException],
        budget: list[int],
    ) -> None:
        """``batch[lo:hi]`` was rejected with ``error``: insert its halves (each with a token
        of its own, so a replay after a crash repeats nothing) until the rejected rows are
        isolated in ``bad`` (index → error). A transient failure on the way raises: the
        segment is retried later, and the halves already written deduplicate then. After
        ``budget`` inserts (many bad rows: 2·k·log₂ n inserts for k of n), a range still
        rejected is quarantined whole — its good rows too, kept in the quarantine file —
        so one segment stays within the store's deduplication window and finishes soon."""
        if hi - lo == 1 or budget[0] <= 0:
            for i in range(lo, hi):
                bad[i] = error
            return
        mid = (lo + hi) // 2
        for a, b in ((lo, mid), (mid, hi)):
            budget[0] -= 1
            try:
                self._insert_rows(table, names, batch[a:b], self._token(seg_id, table, a, b))
            except Exception as e:
                if not is_permanent(e):
                    raise
                self._bisect(seg_id, table, names, batch, a, b, e, bad, budget)

    def _quarantine(
        self,
        seg_id: int,
        source: str,
        table: str,
        names: list[str],
        batch: Rows,
        bad: dict[int, BaseException],
    ) -> None:
        """Write the rejected rows (one JSON object per line: table, error, the row by column)
        durably before the segment that holds them is deleted."""
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        path = self.quarantine_dir / f"{seg_id:020d}.{table}.jsonl"
        tmp = path.with_suffix(".tmp")
        with tmp.open("w") as f:
            for i in sorted(bad):
                row = dict(zip(names, batch[i], strict=True))
                doc = {"segment": seg_id, "table": table, "error": _one_line(bad[i]), "row": row}
                f.write(json.dumps(doc, default=repr) + "\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)  # a replay after a crash rewrites the same file
        self.quarantined_rows += len(bad)
        self.hooks.quarantined(source, len(bad))
        first = bad[min(bad)]
        log.error(
            "store rejected %d %s row(s) of segment %d (%s); the other %d were written; "
            "rejected rows moved to %s",
            len(bad),
            table,
            seg_id,
            _one_line(first),
            len(batch) - len(bad),
            path,
        )

    def queue_segments(self) -> int:
        with self._lock:
            return len(self._pending) + (1 if self._open is not None else 0)
