"""What the columns the store computes on insert cost the span insert. The collector bench's
spans (parsed by the real OTLP parser) go into ``server_spans`` on the embedded store in five
layouts; each but "lean" stores the LLM columns of every LLM span and of no other (counted
after the run):

- "shipped": as migrations make it;
- "guarded": each LLM column computed only for a span with an LLM attribute;
- "lean": the MATERIALIZED columns dropped (the LLM attributes and the write-holdback fields,
  which chDB evaluates from the attributes map for every span, an LLM one or not);
- "side": the LLM columns in a table of their own, which a materialized view fills for LLM
  spans only (read by trace and span id);
- "filled": the LLM columns as plain columns the insert fills, as a parser would (all but
  the two Nullable(Bool) ones, which the compiled encoder does not model).

``--llm-share`` makes that share of the spans LLM spans (every attribute of the contract, as
the agent sends them as text). chDB allows one data directory per process, so each run is a
process of its own, the kinds alternating; each run prints its best round (CPU of the
process, chDB's own threads included, so merges add noise: compare the best).

    python -m bench.span_insert [--spans 20000] [--runs 3] [--rounds 3] [--llm-share 0.0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from bench.collector import _bodies
from collector.ingest import otlp
from collector.store import llm_columns, native, schema
from collector.store.client import Store
from collector.store.column import Column, col
from parallax_contracts import genai
from parallax_contracts.attr import record_field

BLOCK = 5000  # rows per insert, as the collector's writer sends them
KINDS = ("shipped", "guarded", "lean", "side", "filled", "split")
SIDE = "span_llm"

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


def _side_view(db: str) -> str:
    """The view filling the side table from ``server_spans``' inserts, LLM spans only."""
    typed = [c.type.partition(" MATERIALIZED ") for c in llm_columns.SPAN_LLM_COLUMNS]
    select = ", ".join(
        f"{e} AS `{c.name}`"
        for c, (_, _, e) in zip(llm_columns.SPAN_LLM_COLUMNS, typed, strict=True)
    )
    return (
        f"CREATE MATERIALIZED VIEW {db}.{SIDE}_mv TO {db}.{SIDE} AS SELECT time, "  # noqa: S608
        f"trace_id, span_id, {select} FROM {db}.{schema.SPANS} WHERE {LLM_SPAN}"
    )


# What an LLM span's attributes map holds, as the parsers keep them (text; lists as JSON).
_LLM_TEXT = {"string": "openai", "int": "1234", "double": "0.25", "bool": "true"}
_LLM_TEXT |= {"int[]": "[" + ",".join(str(25_000 + 20_000 * i) for i in range(64)) + "]"}
_LLM_TEXT |= {"string[]": '["stop"]'}


def _llm_attributes() -> dict[str, str]:
    by_name = {a.name: a for a in genai.ALL}
    return {n: _LLM_TEXT[by_name[n].type] for n in llm_columns.SPAN_LLM_ATTRS}


# "filled": the LLM columns the compiled insert encoder models (all but the two Nullable(Bool)
# ones, which stay computed), as plain columns the insert fills.
FILLED = tuple(c for c in llm_columns.SPAN_LLM_COLUMNS if not c.type.startswith("Nullable(Bool)"))


def _filled(is_llm: bool) -> tuple[object, ...]:
    """The ``FILLED`` columns' values as a parser would give them: the attributes' typed
    values on an LLM span, absent ('' / NULL / []) on the others."""
    by_name = {record_field(a): a.type for a in genai.ALL}
    absent: dict[str, object] = {"string": "", "int[]": [], "string[]": []}
    types = [by_name[c.name] for c in FILLED]
    if not is_llm:
        return tuple(absent.get(t) for t in types)
    return tuple(_LLM_TEXT[t] if t == "string" else json.loads(_LLM_TEXT[t]) for t in types)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _setup(kind: str, st: Store) -> None:
    """The kind's layout, from the shipped one."""
    db, names = st.database, [c.name for c in llm_columns.SPAN_LLM_COLUMNS]
    stmts = {
        "lean": [", ".join(f"DROP COLUMN {c}" for c in COMPUTED)],
        "guarded": [", ".join(a for c in llm_columns.SPAN_LLM_COLUMNS if (a := _guarded(c)))],
        "filled": [", ".join(f"MODIFY COLUMN `{c.name}` REMOVE MATERIALIZED" for c in FILLED)],
        "side": [", ".join(f"DROP COLUMN {n}" for n in names)],
        "split": [", ".join(f"DROP COLUMN {n}" for n in names)],
    }.get(kind, [])
    for stmt in stmts:
        st.client().command(f"ALTER TABLE {db}.{schema.SPANS} {stmt}")
    plain = tuple(col(c.name, c.type.partition(" MATERIALIZED ")[0]) for c in FILLED)
    if kind == "filled":
        native.TABLES[schema.SPANS] = schema.SPAN_COLUMNS + plain
    if kind in ("side", "split"):
        llm = (
            plain
            if kind == "split"
            else tuple(
                col(c.name, c.type.partition(" MATERIALIZED ")[0])
                for c in llm_columns.SPAN_LLM_COLUMNS
            )
        )
        ids = (col("time", "DateTime64(9, 'UTC')"), col("trace_id", "String"))
        side: tuple[Column, ...] = (*ids, col("span_id", "String"), *llm)
        native.TABLES[SIDE] = side
        st.client().command(
            f"CREATE TABLE {db}.{SIDE} ({', '.join(c.ddl() for c in side)}) "
            "ENGINE = ReplacingMergeTree PARTITION BY toDate(time) ORDER BY (trace_id, span_id)"
        )
    if kind == "side":
        st.client().command(_side_view(db))


def one_run(kind: str, spans: int, rounds: int, llm_share: float) -> float:
    """Best µs per span over ``rounds`` inserts of ``spans`` spans into a fresh store."""
    now = time.time_ns()
    bodies, _ = _bodies(spans, 7)
    rows = [r for b in bodies for r in otlp.parse(b, False, now, 0, now).rows]
    cols = schema.column_names(schema.SPAN_COLUMNS)
    at, llm, every = cols.index("attributes"), _llm_attributes(), 0
    if llm_share > 0:
        every = round(1 / llm_share)  # every n-th span an LLM one, spread through the blocks
    rows = [
        (*r[:at], r[at] | llm, *r[at + 1 :]) if every and i % every == 0 else r
        for i, r in enumerate(rows)
    ]
    st = Store("chdb://" + tempfile.mkdtemp(prefix="span-insert-"))
    st.migrate(7)
    _setup(kind, st)
    values = {True: _filled(True), False: _filled(False)}
    if kind == "filled":
        rows = [(*r, *values["gen_ai.operation.name" in r[at]]) for r in rows]
        cols = [*cols, *(c.name for c in FILLED)]
    side_cols = [c.name for c in native.TABLES.get(SIDE, ())]
    ids = [cols.index(n) for n in ("time", "trace_id", "span_id")]
    for table, names in ((schema.SPANS, cols), (SIDE, side_cols)):
        if kind in ("filled", "split") and native.plan(table, names) is None:
            raise SystemExit(f"span_insert: the compiled encoder does not model {table}")
    st.insert(schema.SPANS, list(zip(*rows[:100], strict=True)), cols)  # driver's first-use
    best = float("inf")
    for _ in range(rounds):
        t = _cpu()
        for i in range(0, spans, BLOCK):
            block = rows[i : i + BLOCK]
            st.insert(schema.SPANS, list(zip(*block, strict=True)), cols)
            if kind == "split":  # the ingest's own second insert: the block's LLM spans
                side = [
                    (*(r[j] for j in ids), *values[True])
                    for r in block
                    if "gen_ai.operation.name" in r[at]
                ]
                if side:
                    st.insert(SIDE, list(zip(*side, strict=True)), side_cols)
        best = min(best, (_cpu() - t) / spans * 1e6)
    if kind != "lean":  # each kind stored an LLM span's columns, and no other span's
        want = sum(1 for r in rows if "gen_ai.operation.name" in r[at])
        table = SIDE if kind in ("side", "split") else schema.SPANS
        sql = f"SELECT uniqExact(trace_id, span_id) FROM {st.database}.{table} "  # noqa: S608
        if (got := st.client().query(sql + "WHERE llm_dialect != ''").result_rows[0][0]) != want:
            raise SystemExit(f"span_insert: {got} spans with LLM columns, not {want}")
    return best


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.span_insert", description=__doc__)
    ap.add_argument("--spans", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3, help="processes of each kind, alternating")
    ap.add_argument("--rounds", type=int, default=3, help="inserts of all spans per process")
    ap.add_argument("--llm-share", type=float, default=0.0, help="share of LLM spans, 0–1")
    ap.add_argument("--one", choices=KINDS, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not 0 <= a.llm_share <= 1:
        ap.error("--llm-share: a share from 0 to 1")
    if a.one:
        print(f"{one_run(a.one, a.spans, a.rounds, a.llm_share):.2f}")
        return 0
    print(
        f"{len(COMPUTED)} computed columns, LLM spans {a.llm_share:.0%}; "
        "µs per span, best round of each run:"
    )
    results: dict[str, list[str]] = {k: [] for k in KINDS}
    for _ in range(a.runs):
        for kind, got in results.items():
            argv = [sys.executable, "-m", "bench.span_insert", "--one", kind]
            argv += ["--spans", str(a.spans), "--rounds", str(a.rounds)]
            argv += ["--llm-share", str(a.llm_share)]
            p = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
            if p.returncode != 0:
                raise SystemExit(f"span_insert: the {kind} run failed: {p.stderr.strip()[-300:]}")
            got.append(p.stdout.strip())
            print(f"  {kind}: {', '.join(got)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
