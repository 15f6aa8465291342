"""What the columns the store computes on insert cost the span insert: the collector bench's
spans (parsed by the real OTLP parser) inserted into ``server_spans`` on the embedded store as
shipped; with the LLM columns computed only for LLM spans ("guarded": the same values); and
with its MATERIALIZED columns dropped ("lean": the LLM attributes, the write-holdback fields,
which chDB evaluates from the attributes map for every span, an LLM one or not).
chDB allows one data directory per process, so each run is a process of its own, the two
kinds alternating; each run prints its best round (CPU of the process, chDB's own threads
included, so merges add noise: compare the best).

    python -m bench.span_insert [--spans 20000] [--runs 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from bench.collector import _bodies
from collector.ingest import otlp
from collector.store import llm_columns, schema
from collector.store.client import Store
from collector.store.column import Column

BLOCK = 5000  # rows per insert, as the collector's writer sends them
KINDS = ("shipped", "guarded", "lean")

COMPUTED = tuple(c.name for c in (*llm_columns.SPAN_LLM_COLUMNS, *schema.SPAN_HOLD_COLUMNS))

# "guarded": each LLM column's expression evaluated only for a span with an attribute of the
# LLM contract (one scan of the keys per row, shared by the columns' expressions). A span
# without one reads absent in every such column anyway, so the guard changes no value;
# error.type, not the contract's own prefix, stays as it is.
PREFIXES = ("gen_ai.", "parallax.llm.")
assert all(a.startswith(PREFIXES) or a == "error.type" for a in llm_columns.SPAN_LLM_ATTRS)
LLM_SPAN = (
    "arrayExists(k -> startsWith(k, 'gen_ai.') OR startsWith(k, 'parallax.llm.'), "
    "mapKeys(attributes))"
)


def _guarded(column: Column) -> str | None:
    """``MODIFY COLUMN`` text computing ``column`` only for LLM spans, or None to leave it."""
    type_, _, expr = column.type.partition(" MATERIALIZED ")
    if column.name == "error_type":
        return None
    absent = "''" if type_.startswith("LowCardinality") else "NULL"
    if type_.startswith("Array"):
        absent = f"CAST([], '{type_}')"
    return f"MODIFY COLUMN `{column.name}` {type_} MATERIALIZED if({LLM_SPAN}, {expr}, {absent})"


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def one_run(kind: str, spans: int, rounds: int) -> float:
    """Best µs per span over ``rounds`` inserts of ``spans`` spans into a fresh store."""
    now = time.time_ns()
    bodies, _ = _bodies(spans, 7)
    rows = [r for b in bodies for r in otlp.parse(b, False, now, 0, now).rows]
    cols = schema.column_names(schema.SPAN_COLUMNS)
    st = Store("chdb://" + tempfile.mkdtemp(prefix="span-insert-"))
    st.migrate(7)
    if kind == "lean":
        alters = [f"DROP COLUMN {c}" for c in COMPUTED]
    elif kind == "guarded":
        alters = [a for c in llm_columns.SPAN_LLM_COLUMNS if (a := _guarded(c))]
    else:
        alters = []
    if alters:
        st.client().command(f"ALTER TABLE {st.database}.{schema.SPANS} {', '.join(alters)}")
    st.insert(schema.SPANS, list(zip(*rows[:100], strict=True)), cols)  # driver's first-use
    best = float("inf")
    for _ in range(rounds):
        t = _cpu()
        for i in range(0, spans, BLOCK):
            st.insert(schema.SPANS, list(zip(*rows[i : i + BLOCK], strict=True)), cols)
        best = min(best, (_cpu() - t) / spans * 1e6)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.span_insert", description=__doc__)
    ap.add_argument("--spans", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3, help="processes of each kind, alternating")
    ap.add_argument("--rounds", type=int, default=3, help="inserts of all spans per process")
    ap.add_argument("--one", choices=KINDS, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(f"{one_run(a.one, a.spans, a.rounds):.2f}")
        return 0
    print(f"{len(COMPUTED)} computed columns; µs per span, best round of each run:")
    results: dict[str, list[str]] = {k: [] for k in KINDS}
    for _ in range(a.runs):
        for kind, got in results.items():
            argv = [sys.executable, "-m", "bench.span_insert", "--one", kind]
            argv += ["--spans", str(a.spans), "--rounds", str(a.rounds)]
            p = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
            if p.returncode != 0:
                raise SystemExit(f"span_insert: the {kind} run failed: {p.stderr.strip()[-300:]}")
            got.append(p.stdout.strip())
            print(f"  {kind}: {', '.join(got)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
