"""What keeping the Resource's Kubernetes identity on every span costs the collector's CPU.

``python -m bench.otlp_identity [--spans N] [--reps R]`` (wrap in ``flock
/tmp/parallax-bench.lock`` on the shared machine). The bench's OTLP bodies (bench.collector:
500 agent-like SERVER spans per request, one Resource) without and with an agent's identity
for a Deployment's pod in the Resource (``IDENTITY``: 8 of
parallax_contracts.span_attributes.RESOURCE_STORED, each then stored in every row's
``attributes``), in one process, each request (block) without and with back to back, R
times. CPU µs per span (the median, and the range) and spans/s for: the compiled decoder,
the Python reference, the compiled Native encoder over the parsed rows (the writer's encoding
of the bigger map, in blocks of 5,000 rows) and the insert into an embedded chDB store (the
process's CPU, chDB's threads included; merges stopped). Then the bytes on disk of
``server_spans`` per span (compressed), each variant alone in the table, merged into one
part. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.collector import _bodies
from collector.ingest import otlp
from collector.store import native, schema
from collector.store.client import Store
from parallax_contracts import span_attributes as sa

# An agent's Resource in Kubernetes (agent/identity/resource.py): a Deployment's pod.
IDENTITY: tuple[tuple[str, str], ...] = (
    (sa.RESOURCE_CONTAINER_ID, "3f2a9c" * 10 + "0b1d"),
    (sa.RESOURCE_K8S_NODE_NAME, "node-1"),
    (sa.RESOURCE_K8S_POD_UID, "0b6d2a8e-63f1-4f7e-9b3a-5d2c1e0f9a87"),
    (sa.RESOURCE_K8S_NAMESPACE_NAME, "shop"),
    (sa.RESOURCE_K8S_POD_NAME, "chat-7c9d6b5f4-x2x9q"),
    (sa.RESOURCE_K8S_CONTAINER_NAME, "chat"),
    (sa.RESOURCE_K8S_REPLICASET_NAME, "chat-7c9d6b5f4"),
    (sa.RESOURCE_K8S_DEPLOYMENT_NAME, "chat"),
)
BLOCK = 5000  # rows per insert block


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.otlp_identity")
    ap.add_argument("--spans", type=int, default=50_000)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)
    fast = otlp._fast
    if fast is None or native.compiled() is None:
        raise SystemExit("build the compiled modules first: python -m parallax_contracts.compiled")
    now = time.time_ns()
    n = args.spans
    bodies = {"without": _bodies(n, 1)[0], "with": _bodies(n, 1, IDENTITY)[0]}

    def compiled(b: bytes) -> Any:
        r = fast.parse(b, now // 1_000_000, 0, now)
        assert r is not None, "the compiled decoder gave up on a bench body"
        return r

    def python(b: bytes) -> Any:
        return otlp.parse_python(b, False, now, 0, now)

    rows = {k: [r for b in v for r in compiled(b)[0]] for k, v in bodies.items()}
    ref = [r for b in bodies["with"] for r in python(b).rows]
    assert rows["with"] == ref and rows["with"][0][36] == dict(IDENTITY)
    names = schema.column_names(schema.SPAN_COLUMNS)
    blocks = {k: [v[i : i + BLOCK] for i in range(0, n, BLOCK)] for k, v in rows.items()}

    def encode(block: list[tuple[Any, ...]]) -> Any:
        out = native.encode(schema.SPANS, names, block, by_rows=True)
        assert out is not None
        return out

    tmp = tempfile.TemporaryDirectory(prefix="identity-bench-")
    st = Store(f"chdb://{(Path(tmp.name) / 'chdb').resolve()}")
    st.migrate(7)
    table = f"{st.database}.{schema.SPANS}"
    st.query(f"SYSTEM STOP MERGES {table}")
    shift = [0]

    def insert(block: list[tuple[Any, ...]]) -> None:
        shift[0] += 1  # rows of their own each time: the table deduplicates a repeated block
        rows_k = [(r[0] + shift[0], *r[1:]) for r in block]
        st.insert(schema.SPANS, list(zip(*rows_k, strict=True)), names)

    insert(blocks["with"][0][:10])  # warm-up
    cases: dict[str, tuple[Callable[[Any], Any], dict[str, list[Any]]]] = {
        "compiled decoder": (compiled, bodies),
        "Python reference": (python, bodies),
        "Native encoder (rows → block)": (encode, blocks),
        "insert into chDB (encode included)": (insert, blocks),
    }
    # Paired: each request (block) parsed (inserted) without and with the identity back to
    # back, the order alternating, so load from elsewhere falls on both alike; the cyclic GC
    # off while timing (one collection after each repetition, not timed).
    out: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.reps):
        for name, (fn, inputs) in cases.items():
            spent = {"without": 0.0, "with": 0.0}
            gc.collect()
            gc.disable()
            try:
                for i in range(len(inputs["with"])):
                    for k in ("without", "with") if i % 2 else ("with", "without"):
                        t = time.process_time()
                        fn(inputs[k][i])
                        spent[k] += time.process_time() - t
            finally:
                gc.enable()
            for k, v in spent.items():
                out.setdefault((name, k), []).append(v / n * 1e6)
    print(f"{n:,} spans in {len(bodies['with'])} requests, {args.reps} reps: CPU µs per span,")
    print("the median (range); cost: the median of the repetitions' differences\n")
    print(f"| stage | without identity | with identity ({len(IDENTITY)} attributes) | cost |")
    print("|---|---|---|---|")
    for name in cases:
        a, b = (statistics.median(out[(name, k)]) for k in ("without", "with"))
        d = statistics.median(
            y - x for x, y in zip(*(out[(name, k)] for k in ("without", "with")), strict=True)
        )

        def cell(k: str, m: float, name: str = name) -> str:
            lo, hi = min(out[(name, k)]), max(out[(name, k)])
            return f"{m:.2f} ({lo:.2f}–{hi:.2f}) = {1e6 / m:,.0f} spans/s"

        cost = f"{d:+.2f} µs/span ({d / a:+.0%})"
        print(f"| {name} | {cell('without', a)} | {cell('with', b)} | {cost} |")
    print("\n| `server_spans` on disk (one merged part) | bytes per span |\n|---|---|")
    for k in ("without", "with"):
        st.query(f"TRUNCATE TABLE {table}")
        for block in blocks[k]:
            insert(block)
        st.query(f"SYSTEM START MERGES {table}")
        st.query(f"OPTIMIZE TABLE {table} FINAL")
        on_disk = st.query(
            "SELECT sum(data_compressed_bytes), sum(rows) FROM system.parts"
            " WHERE active AND database = {db:String} AND table = {t:String}",
            {"db": st.database, "t": schema.SPANS},
        ).result_rows[0]
        print(f"| {k} identity | {on_disk[0] / on_disk[1]:.2f} ({on_disk[1]:,} rows) |")
        st.query(f"SYSTEM STOP MERGES {table}")
    st.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
