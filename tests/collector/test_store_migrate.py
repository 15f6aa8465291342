"""Migration 3 (the GPU span columns and gpu_samples) on a store the previous version made:
its rows keep reading (GPU columns NULL, not 0), new rows carry the GPU values, the new table
has the TTL and settings of the others, and a second start changes nothing."""

from __future__ import annotations

from pathlib import Path

from collector.store import schema
from parallax_contracts import span_attributes as sa
from tests.collector.helpers import run_store_script

_SCRIPT = """
import json, sys, time
from collector.store import schema
from collector.store.client import Store
st = Store('chdb://' + sys.argv[1])
c = st.client()
db = 'parallax'
# The store as the previous version left it: migrations 1 and 2 and their rows.
for version, name, stmts in schema.migrations(db, 7)[:2]:
    for s in stmts:
        c.command(s)
    c.command(f"INSERT INTO {db}.schema_migrations (version, name) VALUES ({version}, '{name}')")
now = time.time_ns()
old_names = [c_.name for c_ in schema._SPAN_COLUMNS_V1]
old = {n: None for n in old_names}
old.update(time=now - 10**9, end_time=now, received=now // 10**6, trace_id='a' * 32,
           span_id='b' * 16, parent_span_id='', span_name='GET /old', source='ebpf',
           service='app', host='h', pid=1, method='GET', route='/old', path='/old', status=200,
           server_address='', server_port=80, client_address='', client_port=1,
           duration_us=1000, chunk_offsets_us=[], ws_seq=0, partial=False,
           client_aborted=False, traceparent_missed=False, attributes={}, ttfb_us=500)
c.insert(f'{db}.server_spans', [[old[n] for n in old_names]], column_names=old_names)
out = {'applied': st.migrate(7), 'again': st.migrate(7)}
gpu = [c_.name for c_ in schema.SPAN_GPU_COLUMNS]
row = c.query(f"SELECT {', '.join(gpu)}, ttfb_us FROM {db}.server_spans").result_rows
out['old_row'] = [list(r) for r in row]
# A new span row with GPU values, through the collector's insert path (Native encoder).
new = dict(old, trace_id='c' * 32, span_id='d' * 16, route='/new')
new.update(gpu_prefill_launches=40, gpu_decode_launches=None, gpu_prefill_wait_us=100000,
           gpu_decode_wait_us=0, gpu_prefill_sm_util_pct=97.5, gpu_decode_sm_util_pct=None,
           gpu_sample_coverage=0.5, gpu_inflight_mean=14.0, gpu_uuid='GPU-x,GPU-y')
names = schema.column_names(schema.SPAN_COLUMNS)
st.insert_rows(schema.SPANS, [tuple(new[n] for n in names)], names, token='t1')
row = c.query(f"SELECT {', '.join(gpu)} FROM {db}.server_spans WHERE route = '/new'").result_rows
out['new_row'] = [list(r) for r in row]
sample = (now, None, 'h', 'agent', 'GPU-x', 'NVIDIA H200', 0, 'parallax.gpu.sm_clock', 1980.0,
          '', {'hw.vendor': 'NVIDIA'})
sn = schema.column_names(schema.GPU_SAMPLE_COLUMNS)
st.insert_rows(schema.GPU_SAMPLES, [sample], sn, token='s1')
st.insert_rows(schema.GPU_SAMPLES, [sample], sn, token='s1')  # a replayed segment: dropped
out['samples'] = c.query(f'SELECT count() FROM {db}.gpu_samples').result_rows[0][0]
out['ddl'] = c.query("SELECT create_table_query FROM system.tables "
                     "WHERE database = 'parallax' AND name = 'gpu_samples'").result_rows[0][0]
print(json.dumps(out))
"""

# server_spans as migration 1 shipped it: a shipped version is never edited.
V1_SPAN_COLUMNS = [
    "time",
    "end_time",
    "received",
    "trace_id",
    "span_id",
    "parent_span_id",
    "span_name",
    "source",
    "service",
    "host",
    "pid",
    "method",
    "route",
    "path",
    "status",
    "server_address",
    "server_port",
    "client_address",
    "client_port",
    "arrival",
    "ttfb_us",
    "recv_queue_us",
    "accept_queue_us",
    "ttft_us",
    "duration_us",
    "chunk_offsets_us",
    "chunks",
    "chunk_gap_max_us",
    "bytes_in",
    "bytes_out",
    "srtt_us",
    "retransmits",
    "ws_seq",
    "partial",
    "client_aborted",
    "traceparent_missed",
    "attributes",
]


def test_previous_store_migrates(tmp_path: Path) -> None:
    out = run_store_script(_SCRIPT, tmp_path / "chdb")
    assert out["applied"] == [3] and out["again"] == []
    assert out["old_row"] == [[None] * 8 + ["", 500]]  # absent, not zero
    assert out["new_row"] == [[40, None, 100000, 0, 97.5, None, 0.5, 14.0, "GPU-x,GPU-y"]]
    assert out["samples"] == 1
    ddl = out["ddl"]
    assert "ReplacingMergeTree" in ddl and "ORDER BY (hw_id, metric, host, pid, time)" in ddl
    assert "toIntervalDay(7)" in ddl and "merge_selector_base = 10" in ddl
    assert "ttl_only_drop_parts = 1" in ddl


def test_shipped_versions_frozen_and_every_gpu_attribute_has_a_column() -> None:
    assert [c.name for c in schema._SPAN_COLUMNS_V1] == V1_SPAN_COLUMNS
    v1 = schema.migrations("parallax", 7)[0][2]
    assert not any("gpu_" in s for s in v1)
    assert [c.name for c in schema.SPAN_GPU_COLUMNS] == [sa.record_field(a) for a in sa.GPU]
    v3 = schema.migrations("parallax", 7)[2][2]
    for c in schema.SPAN_GPU_COLUMNS:
        assert f"ADD COLUMN IF NOT EXISTS {c.ddl()}" in "\n".join(v3)


def test_docs_show_the_gpu_samples_ddl() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "store.md").read_text()
    ddl = next(s for s in schema.migrations("parallax", 7)[2][2] if "gpu_samples" in s)
    assert f"```sql\n{ddl}\n```" in doc
