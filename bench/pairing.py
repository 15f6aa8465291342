"""Collector CPU per pair on the pairer's in-memory path: one-hop traces made by the real
parsers from the collector bench's bodies, typed as the pairer takes them and paired by
``pairing.rules.pairs_for``; best of N rounds by ``time.process_time``.

    python -m bench.pairing [--traces 2000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.collector import _bodies
from collector.ingest import beacons, otlp
from collector.pairing import rules
from collector.pairing.pairer import as_entry, as_span


def per_pair_us(traces: int, rounds: int) -> float:
    now = time.time_ns()
    spans_b, beacons_b = _bodies(traces, 5)
    spans = [r for b in spans_b for r in otlp.parse(b, False, now, 0, now).rows]
    entries = [r for b in beacons_b for r in beacons.parse(beacons.load(b), now, 0, now).rows]
    best = float("inf")
    for _ in range(rounds):
        t = time.process_time()
        s, e = list(map(as_span, spans)), list(map(as_entry, entries))
        by_trace = {x.trace_id: x for x in e}
        pairs, _ = rules.pairs_for([([x], [by_trace[x.trace_id]]) for x in s], now)
        best = min(best, (time.process_time() - t) / len(pairs) * 1e6)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pairing", description=__doc__)
    ap.add_argument("--traces", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    print(
        f"{per_pair_us(a.traces, a.rounds):.2f} µs per pair ({a.traces} one-hop traces, "
        f"best of {a.rounds})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
