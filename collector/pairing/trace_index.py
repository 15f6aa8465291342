"""Which trace ids have a row in the store, per side (spans, entries), answered from memory.

The pairer asks the store "does this trace have a span / an entry?" for every row whose other
side is not among the recent rows it holds. Against the trace-id tables that lookup reads
every granule its ids fall in — all of them for a few thousand random ids — so it costs
CPU in proportion to the look-back window's rows, round after round (docs/collector.md).

With the embedded store the collector is the store's only writer (chDB: one process per
data directory; the spool lock says so too), so whatever is in the store was either there
at start — loaded here once, from the trace-id tables — or written by this process since,
and added here after its insert returned. This index then answers *no* for certain (no
lookup needed) and *maybe* otherwise (a 32-bit fingerprint of the id matched: an actual
row, or a false positive at about n / 2³² — the store lookup decides, as before). So it
never answers "no" for a trace the store has, which is all pairing needs.

Storage: sorted ``uint32`` runs (4 bytes per id), one per offered batch, merged like a
binary counter so a lookup searches O(log n) runs; a run is dropped when the newest event
time in it has left the look-back window (the store's lookups filter on event time too).
Rows whose event time is ahead of the collector's clock (a browser's clock set forward: up
to a day is accepted) stay findable in the store until that time plus the window, so they
go to runs of their own — in the common runs one such row would keep a whole run alive.
Bounded by ``max_ids``: beyond it the oldest run is dropped early, and the index says
"maybe" for everything until that run's events have left the window (lookups as before).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Fingerprints = npt.NDArray[np.uint32]
_MASK = 0xFFFFFFFF
# A merged run covers at most this share of the look-back window, so dropping runs by
# event time keeps memory near one window (not two) while runs stay few (≈ 8 + log₂ n).
_MERGE_SPAN_SHARE = 8
# Event times more than this ahead of the collector's clock go to the runs kept apart.
AHEAD_S = 60.0


@dataclass(slots=True)
class _Run:
    fps: Fingerprints  # sorted
    created_s: float  # wall time (Unix s) its first batch was added
    newest_s: float  # the newest event time (Unix s) of any row in it


def fingerprints(trace_ids: Iterable[str], n: int = -1) -> Fingerprints:
    """32 bits of Python's (keyed, per-process) string hash: ids a client crafted to collide
    cost only false positives, i.e. store lookups."""
    return np.fromiter((hash(t) & _MASK for t in trace_ids), dtype=np.uint32, count=n)


class TraceIndex:
    """The trace ids written to the store over the look-back window, for one side."""

    def __init__(self, lookback_s: float, max_ids: int = 50_000_000):
        self.lookback_s = lookback_s
        self.max_ids = max_ids
        self._runs: list[_Run] = []
        self._ahead: list[_Run] = []  # rows with event times ahead of the clock
        self._lock = threading.Lock()
        self.size = 0
        # Event time (Unix s) up to which rows may be in the store but not here: "maybe"
        # for every id while it is inside the window. Before the start-up load (or the
        # word that it was too large) the index does not answer at all.
        self._gap_until = float("-inf")
        self._loaded = False

    # --- filling -----------------------------------------------------------------
    def loaded(
        self, trace_ids: Sequence[str], event_times: Iterable[int], per_second: float
    ) -> None:
        """What the store held at start (as add()); from now on the index answers for it."""
        self.add(trace_ids, event_times, per_second)
        with self._lock:
            self._loaded = True

    def incomplete(self, until_event_s: float) -> None:
        """Rows with event times up to ``until_event_s`` may be in the store but not here
        (the start-up load was too large): "maybe" until they leave the window."""
        with self._lock:
            self._gap_until = max(self._gap_until, until_event_s)
            self._loaded = True

    def add(self, trace_ids: Sequence[str], event_times: Iterable[int], per_second: float) -> None:
        """Trace ids just written to the store, with their rows' event times (integers,
        ``per_second`` to the second: 1e9 for ns)."""
        n = len(trace_ids)
        if not n:
            return
        fps = fingerprints(trace_ids, n)
        ev = np.fromiter(event_times, dtype=np.int64, count=n) / per_second
        now = time.time()
        ahead = ev > now + AHEAD_S
        with self._lock:
            if ahead.any():
                self._push_locked(self._ahead, fps[ahead], float(ev[ahead].max()), now)
                fps, ev = fps[~ahead], ev[~ahead]
            if len(fps):
                self._push_locked(self._runs, fps, float(ev.max()), now)
            self._expire_locked(now)

    def _push_locked(
        self, runs: list[_Run], fps: Fingerprints, newest_s: float, now: float
    ) -> None:
        runs.append(_Run(np.sort(fps), now, newest_s))
        span_cap = self.lookback_s / _MERGE_SPAN_SHARE
        # Binary-counter merging: the last two runs merge while the older is at most twice
        # the newer, unless the merged run would span too much of the window.
        while (
            len(runs) >= 2
            and len(runs[-2].fps) <= 2 * len(runs[-1].fps)
            and now - runs[-2].created_s <= span_cap
        ):
            b, a = runs.pop(), runs.pop()
            merged = np.concatenate((a.fps, b.fps))
            merged.sort(kind="stable")  # two sorted runs: a linear merge
            runs.append(_Run(merged, a.created_s, max(a.newest_s, b.newest_s)))

    def _expire_locked(self, now: float) -> None:
        edge = now - self.lookback_s
        runs = [r for r in self._runs if r.newest_s >= edge]
        ahead = [r for r in self._ahead if r.newest_s >= edge]
        total = sum(len(r.fps) for r in runs) + sum(len(r.fps) for r in ahead)
        while total > self.max_ids and (runs or ahead):
            dropped = (runs or ahead).pop(0)
            total -= len(dropped.fps)
            self._gap_until = max(self._gap_until, dropped.newest_s)
        self._runs, self._ahead, self.size = runs, ahead, total

    # --- asking ------------------------------------------------------------------
    def authoritative(self) -> bool:
        """True when "not here" means "not in the store" (within the look-back window)."""
        with self._lock:
            loaded, gap = self._loaded, self._gap_until
        return loaded and gap < time.time() - self.lookback_s

    def maybe(self, trace_ids: Sequence[str]) -> list[bool]:
        """For each id: False = no row in the store for certain; True = perhaps."""
        if not trace_ids:
            return []
        if not self.authoritative():
            return [True] * len(trace_ids)
        q = fingerprints(trace_ids, len(trace_ids))
        hit = np.zeros(len(q), dtype=bool)
        with self._lock:
            runs = self._runs + self._ahead
        for r in runs:
            i = np.searchsorted(r.fps, q)
            i[i == len(r.fps)] = 0  # past the end: compared with another element, a miss
            hit |= r.fps[i] == q
        return [bool(h) for h in hit]
