"""Collector CPU per pair on the pairer's in-memory path: one-hop traces made by the real
parsers from the collector bench's bodies, typed as the pairer takes them and paired by
``pairing.rules.pairs_for``; best of N rounds by ``time.process_time``, the compiled one-hop
derivation (collector/pairing/_derive_fast.c) and the Python one alternated in one run.
The cyclic GC is off while a round runs, as in the collector (collector/service.py runs
one full collection every few seconds instead).

    python -m bench.pairing [--traces 2000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

from bench.collector import _bodies
from collector.ingest import beacons, otlp
from collector.pairing import rules
from collector.pairing.pairer import as_entry, as_span


def per_pair_us(traces: int, rounds: int) -> dict[str, float]:
    """Best µs per pair of each derivation: {"compiled": …, "python": …} (only "python"
    where the compiled one is not built)."""
    now = time.time_ns()
    spans_b, beacons_b = _bodies(traces, 5)
    spans = [r for b in spans_b for r in otlp.parse(b, False, now, 0, now).rows]
    entries = [r for b in beacons_b for r in beacons.parse(beacons.load(b), now, 0, now).rows]
    compiled = rules._compiled
    ways = {"compiled": compiled, "python": None} if compiled is not None else {"python": None}
    best = dict.fromkeys(ways, float("inf"))
    try:
        for _ in range(rounds):
            for name, way in ways.items():
                rules._compiled = way
                gc.collect()
                gc.disable()
                t = time.process_time()
                s, e = list(map(as_span, spans)), list(map(as_entry, entries))
                by_trace = {x.trace_id: x for x in e}
                pairs, _ = rules.pairs_for([([x], [by_trace[x.trace_id]]) for x in s], now)
                took = time.process_time() - t
                gc.enable()
                best[name] = min(best[name], took / len(pairs) * 1e6)
    finally:
        rules._compiled = compiled
        gc.enable()
    return best


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pairing", description=__doc__)
    ap.add_argument("--traces", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    print(rules.DERIVATION)
    best = per_pair_us(a.traces, a.rounds)
    for name, us in best.items():
        print(f"{name}: {us:.2f} µs per pair ({a.traces} one-hop traces, best of {a.rounds})")
    if len(best) == 2:
        print(f"python / compiled: ×{best['python'] / best['compiled']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
