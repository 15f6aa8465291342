"""The trace index never says "not in the store" for a trace the store has, and the pairer
skips the store lookups it rules out — pairing still happens, including across a restart
(the index is loaded from the store) and for a late side written long after the first."""

from __future__ import annotations

import os
import time
from pathlib import Path

from collector.pairing.trace_index import TraceIndex
from tests.collector.helpers import run_store_script


def _ids(n: int) -> list[str]:
    return [os.urandom(16).hex() for _ in range(n)]


def _now_s(n: int, offset_s: float = 0.0) -> list[int]:
    """n event times (Unix s) ``offset_s`` from now."""
    return [int(time.time() + offset_s)] * n


def test_index_answers_only_once_loaded_and_never_misses() -> None:
    ix = TraceIndex(lookback_s=900)
    have = _ids(20_000)
    ix.add(have[:10_000], _now_s(10_000), 1)
    assert ix.maybe(_ids(5)) == [True] * 5  # not loaded: it cannot answer for the store
    ix.loaded(have[10_000:], _now_s(10_000), 1)
    assert ix.authoritative()
    for i in range(0, 20_000, 100):  # many small batches: merged runs stay few
        ix.add(have[i : i + 100], _now_s(100), 1)
    assert all(ix.maybe(have))
    assert len(ix._runs) <= 16
    others = _ids(20_000)
    false_pos = sum(ix.maybe(others))
    assert false_pos <= 5  # ≈ 40,000 / 2³² per id: about 0.0002 expected


def test_index_drops_what_left_the_window_and_says_maybe_after_overflow() -> None:
    ix = TraceIndex(lookback_s=60, max_ids=1_000)
    ix.loaded([], [], 1)
    old, new = _ids(300), _ids(300)
    ix.add(old, _now_s(300, -61), 1)  # events already out of the look-back window
    ix.add(new, _now_s(300), 1)
    assert ix.maybe(old) == [False] * 300  # the store lookup would not find them either
    assert all(ix.maybe(new))
    assert ix.authoritative()
    ix.add(_ids(900), _now_s(900), 1)  # over max_ids: the oldest run in the window goes
    assert not ix.authoritative()  # …so "not here" no longer means "not in the store"
    assert all(ix.maybe(_ids(50)))
    ix2 = TraceIndex(lookback_s=60)
    ix2.incomplete(time.time())  # a start-up load that was too large
    assert not ix2.authoritative()
    ix2.incomplete(time.time() - 61)  # …whose rows have left the window: it answers
    assert not ix2.authoritative()  # (the later of the two gaps counts)
    ix3 = TraceIndex(lookback_s=60, max_ids=100)
    ix3.add(_ids(300), _now_s(300, -30), 1)  # overflow before the start-up load
    ix3.loaded([], [], 1)
    assert not ix3.authoritative()  # the overflow's gap still holds


def test_rows_ahead_of_the_clock_do_not_keep_the_others_alive() -> None:
    """A browser whose clock is an hour ahead: its entry stays findable in the store for an
    hour and a window, the rest of its batch only for the window."""
    ix = TraceIndex(lookback_s=60)
    ix.loaded([], [], 1)
    ahead, rest = _ids(3), _ids(300)
    t = time.time()
    ms = [int((t + 3600) * 1000)] * 3 + [int((t - 61) * 1000)] * 300
    ix.add(ahead + rest, ms, 1e3)
    ix.add(_ids(10), _now_s(10), 1)  # a later batch expires what left the window
    assert ix.maybe(ahead) == [True] * 3
    assert ix.maybe(rest) == [False] * 300
    assert ix.size == 13


_SCRIPT = """
import json, os, sys, time
from bench.collector import _bodies
from collector.ingest import beacons, otlp
from collector.metrics import Metrics
from collector.pairing.pairer import Pairer
from collector.store import schema
from collector.store.client import Store

st = Store('chdb://' + sys.argv[1]); st.migrate(7)
now = time.time_ns()
spans_b, beacons_b = _bodies(600, 3)  # 600 traces: one span + one entry each
sr = [r for b in spans_b for r in otlp.parse(b, False, now, 0, now).rows]
er = [r for b in beacons_b for r in beacons.parse(beacons.load(b), now, 0, now).rows]
def write(table, cols, rows):
    st.insert(table, list(zip(*rows)), schema.column_names(cols))
def drain(p):
    while (b := p._take_due()):
        p.pair_round(b)
def pairs():
    q = 'SELECT count() FROM (SELECT DISTINCT trace_id FROM parallax.pairs)'
    return int(st.query(q).result_rows[0][0])
out = {}
# A previous run wrote the entries of traces 0-99 and the spans of 100-199 (not paired yet).
write(schema.ENTRIES, schema.ENTRY_COLUMNS, er[:100])
write(schema.SPANS, schema.SPAN_COLUMNS, sr[100:200])
p = Pairer(st, Metrics(), recheck_s=0.0, memory_traces=50)
out['exclusive'] = p.exclusive
p.load_index()
out['authoritative'] = p.authoritative()
# Entries of 200-399 alone: nothing can pair, the index rules every lookup out.
write(schema.ENTRIES, schema.ENTRY_COLUMNS, er[200:400]); p.offer([], er[200:400]); drain(p)
out['lonely'] = [p.store_lookups, p.lookups_skipped, pairs()]
# Spans of 0-99 (their entries from the "previous run": loaded, looked up in the store),
# entries of 100-199 (spans from before), spans of 200-399 (entries written above, mostly
# forgotten by memory: memory_traces=50): all 400 pair.
write(schema.SPANS, schema.SPAN_COLUMNS, sr[:100] + sr[200:400])
write(schema.ENTRIES, schema.ENTRY_COLUMNS, er[100:200])
p.offer(sr[:100] + sr[200:400], er[100:200]); drain(p)
out['late'] = [p.store_lookups, pairs()]
# Spans of 400-599 alone: no entry anywhere, no lookup, no delayed recheck.
write(schema.SPANS, schema.SPAN_COLUMNS, sr[400:600]); p.offer(sr[400:600], []); drain(p)
out['spans_alone'] = [p.store_lookups, len(p._due), pairs()]
# The same rows with a store that others may write to: every lookup is made, as before.
q = Pairer(st, Metrics(), recheck_s=0.0, exclusive=False)
q.load_index(); q.offer(sr[400:600], er[200:400]); time.sleep(0.01); drain(q); drain(q)
out['shared'] = [q.authoritative(), q.store_lookups, pairs()]
print(json.dumps(out))
"""


def test_pairer_skips_lookups_the_index_rules_out_and_still_pairs(tmp_path: Path) -> None:
    out = run_store_script(_SCRIPT, tmp_path / "chdb")
    assert out["exclusive"] and out["authoritative"]
    assert out["lonely"] == [0, 200, 0]
    # 0-99: their entries are in the store (loaded); 100-199: their spans are; 200-399:
    # their entries are in the index (written by this run) but forgotten by memory. Each
    # of those needs its store lookup (the index says "maybe"), and all 400 traces pair.
    assert out["late"][0] >= 350  # at most the last 50 traces are still in memory
    assert out["late"][1] == 400
    assert out["spans_alone"] == [out["late"][0], 0, 400]
    # Shared store: spans of 400-599 are marked for later (recheck 0 s) and looked up; the
    # entries of 200-399 are looked up (already paired: no new trace pairs).
    assert out["shared"][0] is False
    assert out["shared"][1] == 400
    assert out["shared"][2] == 400


def test_an_index_that_failed_to_take_written_rows_stops_answering() -> None:
    """Rows the store has but an index may lack: "not there" would lose their pairs for good,
    so the indexes say "maybe" (store lookups) for as long as those rows can be in the window."""
    import pytest

    from collector.metrics import Metrics
    from collector.pairing.pairer import Pairer
    from collector.store.rows import SpanRow

    p = Pairer(object(), Metrics(), exclusive=True)  # type: ignore[arg-type]
    p.span_index.loaded([], [], 1e9)
    p.entry_index.loaded([], [], 1e6)
    assert p.authoritative()
    now_ns = time.time_ns()
    span = SpanRow._make([None] * len(SpanRow._fields))._replace(
        time=now_ns, trace_id="ab" * 16, span_id="cd" * 8, parent_span_id="ef" * 8
    )

    def broken(*_: object) -> None:
        raise RuntimeError("index broke")

    p.span_index.add = broken  # type: ignore[method-assign,assignment]
    with pytest.raises(RuntimeError):
        p.offer([span], [])
    assert not p.authoritative()
    assert p.entry_index.maybe(["ab" * 16]) == [True]
