"""Fills the ``pairs`` table as the second side of a pair reaches the store.

Each trace id written by the pipeline is marked; a background round reads both sides of the
marked traces (from its memory of recent rows, else from the store within a bounded
look-back: pairing.lookups), pairs them (pairing.rules) and writes the pairs that are new
or changed. A trace with one side only is looked at once more ``recheck_s`` later (the
other side may be in flight through another collector). A late beacon pairs when it is
written: its trace id is marked like any other. At start, browser entries of the look-back
window without a pair are marked again (pairs a crash interrupted).

With the embedded store the collector is its only writer, and a TraceIndex per side answers
"is the other side in the store?" from memory: a trace whose other side is nowhere is not
marked at all (its other side marks it when it is written), no store lookup is made for it,
and a one-sided trace is not looked at again ``recheck_s`` later (that recheck is for a
server store that other collectors write to as well).
"""

from __future__ import annotations

import functools
import heapq
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any

from collector.ingest.common import FUTURE_SLACK_NS
from collector.metrics import Metrics
from collector.pairing import coverage
from collector.pairing.lookups import present, read_traces
from collector.pairing.rules import Trace, by_trace, pairs_for
from collector.pairing.trace_index import TraceIndex
from collector.store import schema
from collector.store.client import Store
from collector.store.rows import EntryRow, PairRow, SpanRow

log = logging.getLogger("parallax.collector")

PAIR_NAMES = list(PairRow._fields)

# What the pairer holds of one trace and side: its row, or its rows once there are several.
_Held = SpanRow | EntryRow | list[SpanRow] | list[EntryRow]


def _hold(mem: OrderedDict[str, Any], t: str, row: SpanRow | EntryRow) -> None:
    held = mem.get(t)
    if held is None:
        mem[t] = row
    elif type(held) is list:
        held.append(row)
    else:
        mem[t] = [held, row]


as_span = functools.partial(tuple.__new__, SpanRow)
as_entry = functools.partial(tuple.__new__, EntryRow)


def _rows(held: Any) -> list[Any]:
    return list(held) if type(held) is list else [held]


def _maybe(index: TraceIndex, ids: list[str]) -> list[str]:
    """The ids the index cannot rule out."""
    return [t for t, m in zip(ids, index.maybe(ids), strict=True) if m]


class Pairer:
    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        lookback_s: int = 900,
        recheck_s: float = 5.0,
        interval_s: float = 0.5,
        max_batch: int = 10_000,
        coverage_interval_s: float = 30.0,
        memory_traces: int = 200_000,
        exclusive: bool | None = None,
        index_max_ids: int = 50_000_000,
        index_load_max: int = 1_000_000,
    ):
        self.store = store
        self.metrics = metrics
        self.lookback_s = lookback_s
        self.recheck_s = recheck_s
        self.interval_s = interval_s
        self.max_batch = max_batch
        self.coverage_interval_s = coverage_interval_s
        self._lock = threading.Lock()
        self._due: dict[str, tuple[float, int]] = {}  # id → (due, attempt)
        # The marks in due order, so a round takes what is due without scanning what is not
        # (thousands of traces wait 5 s for their other side): marks for now in arrival
        # order, later ones in a heap. A superseded mark stays queued and is skipped.
        self._now: deque[tuple[float, str]] = deque()
        self._later: list[tuple[float, str]] = []
        # (trace, browser span, seq) → what its last written pair was made of (see _changed)
        self._written: OrderedDict[tuple[str, str, int], int | str] = OrderedDict()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0
        self.store_lookups = 0
        # Rows this collector wrote recently, by trace id, per side: most pairs complete from
        # memory without reading both sides back from the store. A trace's one row is kept
        # as it is, several in a list: no container per trace for the cyclic GC to scan.
        self._mem_spans: OrderedDict[str, _Held] = OrderedDict()
        self._mem_entries: OrderedDict[str, _Held] = OrderedDict()
        self.memory_traces = memory_traces
        # The embedded store has no other writer: what is not in the indexes (once loaded
        # with what the store held at start) is not in the store.
        if exclusive is None:
            exclusive = bool(getattr(store, "is_embedded", False))
        self.exclusive = exclusive
        self.span_index = TraceIndex(lookback_s, index_max_ids)
        self.entry_index = TraceIndex(lookback_s, index_max_ids)
        self.index_load_max = index_load_max
        self.lookups_skipped = 0

    def authoritative(self) -> bool:
        """True when the indexes answer for the store (no other writer, loaded, complete)."""
        return (
            self.exclusive and self.span_index.authoritative() and self.entry_index.authoritative()
        )

    def load_index(self) -> None:
        """Fill the indexes with the trace ids the store holds in the look-back window (at
        start, before the sweep). More than ``index_load_max`` per side: not loaded, and the
        index says "maybe" until those rows have left the window (store lookups as before)."""
        if not self.exclusive:
            return
        db = self.store.database
        for index, table in (
            (self.span_index, schema.SPAN_TRACES),
            (self.entry_index, schema.ENTRY_TRACES),
        ):
            where = f"FROM {db}.{table} WHERE time >= now64() - toIntervalSecond({{lb:UInt32}})"
            p = {"lb": self.lookback_s}
            r = self.store.query(
                f"SELECT count(), toUnixTimestamp64Milli(max(time)) {where}", p
            ).result_rows
            n, newest_ms = int(r[0][0]), int(r[0][1])
            if n > self.index_load_max:
                index.incomplete(newest_ms / 1e3)
                log.info(
                    "pairing: %d trace ids in the store's %d s window, over %d: store "
                    "look-ups for every one-sided trace until they leave it",
                    n,
                    self.lookback_s,
                    self.index_load_max,
                )
                continue
            rows = (
                self.store.query(
                    f"SELECT trace_id, toUnixTimestamp64Milli(max(time)) {where} GROUP BY trace_id",
                    p,
                ).result_rows
                if n
                else []
            )
            index.loaded([x[0] for x in rows], (int(x[1]) for x in rows), 1e3)

    def offer(self, span_rows: list[tuple[Any, ...]], entry_rows: list[tuple[Any, ...]]) -> None:
        """Rows just written (in column order): remember them and mark their traces. A span
        without a parent cannot pair (no browser span) and marks nothing."""
        # The parsers' tuples as typed rows (the parsers make them ncols long: no checks).
        spans: list[SpanRow] = list(map(as_span, span_rows))
        entries: list[EntryRow] = list(map(as_entry, entry_rows))
        now: list[str] = []
        later: list[str] = []
        # Into the indexes before anything else sees these rows: a trace visible in memory
        # is in the index too (memory forgets, the index covers the look-back window).
        try:
            if spans:  # event times: span start in ns, entry start in µs
                self.span_index.add([r.trace_id for r in spans], (r.time for r in spans), 1e9)
            if entries:
                self.entry_index.add([r.trace_id for r in entries], (r.time for r in entries), 1e6)
        except Exception:
            # These rows are in the store but perhaps not in an index: neither may say "not
            # there" while they can be in the window (event times up to a day ahead).
            until = (time.time_ns() + FUTURE_SLACK_NS) / 1e9
            self.span_index.incomplete(until)
            self.entry_index.incomplete(until)
            raise
        auth = self.authoritative()
        # Traces whose other side is not in memory, asked of the other side's index.
        want_entry: list[str] = []
        want_span: list[str] = []
        ms, me = self._mem_spans, self._mem_entries
        with self._lock:
            for r in entries:
                t = r.trace_id
                _hold(me, t, r)
                if t in ms or not auth:
                    now.append(t)
                else:
                    want_span.append(t)
            for s in spans:
                t = s.trace_id
                _hold(ms, t, s)
                if s.parent_span_id:
                    # The beacon usually comes after the span (it is sent when the stream
                    # has ended): look for it in the store only if it has not come here.
                    if t in me:
                        now.append(t)
                    elif auth:
                        want_entry.append(t)
                    else:
                        later.append(t)
            for mem in (ms, me):
                while len(mem) > self.memory_traces:
                    mem.popitem(last=False)
        # The other side may be in the store (written before memory forgot it): look now.
        # Where the index is sure it is not, nothing to do — when it is written, its own
        # offer finds this side in memory or in the index and marks the trace.
        for ids, index in ((want_entry, self.entry_index), (want_span, self.span_index)):
            kept = _maybe(index, ids)
            now += kept
            self.lookups_skipped += len(ids) - len(kept)
        self.mark(now)
        self.mark(later, delay_s=self.recheck_s, attempt=1)

    def mark(self, trace_ids: Iterable[str], delay_s: float = 0.0, attempt: int = 0) -> None:
        """Pair these traces after ``delay_s`` (an earlier mark wins)."""
        due = time.monotonic() + delay_s
        with self._lock:
            for t in trace_ids:
                cur = self._due.get(t)
                if cur is None or due < cur[0]:
                    self._due[t] = (due, attempt if cur is None else min(attempt, cur[1]))
                    if delay_s <= 0:
                        self._now.append((due, t))
                    else:
                        heapq.heappush(self._later, (due, t))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="parallax-pairer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5.0)

    def sweep(self) -> int:
        """Mark the look-back window's unpaired browser entries (after a restart)."""
        db = self.store.database
        rows = self.store.query(
            f"SELECT DISTINCT trace_id FROM {db}.browser_entries "  # noqa: S608 — checked db
            "WHERE time >= now64() - toIntervalSecond({lb:UInt32}) "
            f"AND (trace_id, span_id, seq) NOT IN (SELECT trace_id, span_id, seq FROM "
            f"{db}.pairs WHERE time >= now64() - toIntervalSecond({{lb:UInt32}}) - 3600) "
            "LIMIT 100000",
            {"lb": self.lookback_s},
        ).result_rows
        self.mark(r[0] for r in rows)
        return len(rows)

    def _take_due(self) -> list[tuple[str, int]]:
        now = time.monotonic()
        out: list[tuple[str, int]] = []
        with self._lock:
            while self._now and self._now[0][0] <= now and len(out) < self.max_batch:
                self._take_one(*self._now.popleft(), out)
            while self._later and self._later[0][0] <= now and len(out) < self.max_batch:
                self._take_one(*heapq.heappop(self._later), out)
        return out

    def _take_one(self, due: float, t: str, out: list[tuple[str, int]]) -> None:
        cur = self._due.get(t)
        if cur is not None and cur[0] == due:  # else superseded by an earlier mark, or taken
            out.append((t, cur[1]))
            del self._due[t]

    def _run(self) -> None:
        next_cov = time.monotonic() + min(2.0, self.coverage_interval_s)
        while not self._stop.wait(self.interval_s):
            try:
                while (batch := self._take_due()) and not self._stop.is_set():
                    self.pair_round(batch)
                if time.monotonic() >= next_cov:
                    next_cov = time.monotonic() + self.coverage_interval_s
                    self.update_coverage()
            except Exception as e:  # noqa: BLE001 — store trouble: the ids are re-marked
                log.warning("pairing round failed: %s", str(e).splitlines()[0][:200])
                self.store.reset()

    def pair_round(self, batch: list[tuple[str, int]]) -> int:
        t = time.perf_counter()
        ids = [b[0] for b in batch]
        try:
            in_mem, spans, entries, lonely = self._gather(ids)
            version = time.time_ns()
            rows, one_sided = pairs_for(in_mem + by_trace(spans, entries), version)
            one_sided |= lonely
            fresh, memo = self._changed(rows)
            n_fresh = len(fresh)
            if fresh:
                self.store.insert_rows(schema.PAIRS, fresh, PAIR_NAMES)
                self._remember(memo)
                self.metrics.pairs_written.inc(len(fresh))
        except Exception:
            self.mark(ids, delay_s=self.recheck_s)
            raise
        if not self.authoritative():  # another writer may bring the other side: look again
            attempts = dict(batch)
            self.mark(
                (i for i in one_sided if attempts.get(i, 1) == 0),
                delay_s=self.recheck_s,
                attempt=1,
            )
        self.rounds += 1
        self.metrics.pairing_seconds.observe(time.perf_counter() - t)
        return n_fresh

    def _gather(
        self, ids: list[str]
    ) -> tuple[list[Trace], list[SpanRow], list[EntryRow], set[str]]:
        """Both sides of these traces: (traces with both sides in memory;
        spans and entries of the others, read from the store where it has them; traces
        whose entries are in memory and whose spans are nowhere yet)."""
        in_mem: list[Trace] = []
        spans: list[SpanRow] = []
        entries: list[EntryRow] = []
        no_entries, neither = [], []
        no_spans: dict[str, list[EntryRow]] = {}
        ms, me = self._mem_spans, self._mem_entries
        with self._lock:
            for t in ids:
                s, e = ms.get(t), me.get(t)
                if s is not None and e is not None:
                    in_mem.append((_rows(s), _rows(e)))
                elif s is not None:
                    no_entries.append(t)
                elif e is not None:
                    no_spans[t] = _rows(e)
                else:
                    neither.append(t)
        lb = self.lookback_s
        if self.authoritative():
            # What the indexes are sure of needs no store lookup.
            n0 = len(no_entries) + len(no_spans) + len(neither)
            no_entries = _maybe(self.entry_index, no_entries)
            no_spans = {t: no_spans[t] for t in _maybe(self.span_index, list(no_spans))}
            neither = _maybe(self.entry_index, _maybe(self.span_index, neither))
            self.lookups_skipped += n0 - len(no_entries) - len(no_spans) - len(neither)
        self.store_lookups += len(no_entries) + len(no_spans) + len(neither)
        # Which of the missing sides exist at all (primary-key lookups in the small trace-id
        # tables); only those traces are read. The usual answer is "none yet".
        has_entry = present(self.store, schema.ENTRY_TRACES, no_entries + neither, lb)
        has_span = present(self.store, schema.SPAN_TRACES, [*no_spans, *neither], lb)
        read_both = sorted(
            {t for t in no_entries if t in has_entry}
            | {t for t in neither if t in has_entry and t in has_span}
        )
        read_spans = [t for t in no_spans if t in has_span]
        # An entry whose spans are nowhere yet pairs with nothing: not paired at all.
        lonely = {t for t in no_spans if t not in has_span}
        for t in read_spans:
            entries.extend(no_spans[t])
        s1, e1 = read_traces(self.store, read_both, lb)
        s2, _ = read_traces(self.store, read_spans, lb, (True, False))
        spans += s1 + s2
        entries += e1
        return in_mem, spans, entries, lonely

    def _changed(
        self, rows: list[PairRow]
    ) -> tuple[list[PairRow], list[tuple[tuple[str, str, int], int | str]]]:
        """The pairs that differ from what was last written under their key, and what to
        remember of them once they are written. A pair changes only when the spans it is
        made of change (the entry is immutable and the rest is derived from both): one hop
        and nothing linked — the common case — is told by its span id, anything else by a
        hash of its hops, links and reconnects."""
        get = self._written.get
        fresh: list[PairRow] = []
        memo: list[tuple[tuple[str, str, int], int | str]] = []
        for r in rows:
            key = (r.trace_id, r.span_id, r.seq)
            hops, linked, reconnects = r.hop_span_ids, r.linked_span_ids, r.reconnects
            if len(hops) == 1 and not linked and not reconnects:
                h: int | str = hops[0]
            else:
                h = hash((tuple(hops), tuple(linked), reconnects))
            if get(key) != h:
                fresh.append(r)
                memo.append((key, h))
        return fresh, memo

    def _remember(self, memo: list[tuple[tuple[str, str, int], int | str]]) -> None:
        written = self._written
        written.update(memo)
        for _ in range(len(written) - 200_000):
            written.popitem(last=False)

    def update_coverage(self) -> None:
        """Pairing coverage per route (collector/pairing/coverage.py): the share of server
        spans with a browser entry, and of the browser entries the agent would have traced
        that found their server span — an entry whose trace the agent's sampling dropped
        is counted as not sampled, not as a miss."""
        spans, entries, m = coverage.compute(self.store)
        self.metrics.coverage.clear()
        self.metrics.pairing_entries.clear()
        for route, total, paired in spans:
            if total:
                self.metrics.coverage.labels(route, "spans").set(min(1.0, paired / total))
        for route, total, paired, not_sampled in entries:
            traced = total - not_sampled
            if traced:
                self.metrics.coverage.labels(route, "entries").set(min(1.0, paired / traced))
            counts = {
                coverage.PAIRED: paired,
                coverage.NOT_SAMPLED: not_sampled,
                coverage.MISSING: max(0, traced - paired),
            }
            for state, k in counts.items():
                self.metrics.pairing_entries.labels(route, state).set(k * m)
