"""Migrations on a store an earlier version made. 3 (the GPU span columns and gpu_samples):
its rows keep reading (GPU columns NULL, not 0), new rows carry the GPU values, the new table
has the TTL and settings of the others, and a second start changes nothing. 4 (the sampling
thresholds of spans and pairs, request_counts): old spans and pairs read threshold 0 (every
request kept: adjusted count 1), new rows carry theirs, and the SLA checker reads both. 5 (the
write-to-wire holdback of spans and pairs): old rows read it absent."""

from __future__ import annotations

from pathlib import Path

from collector.store import schema
from parallax_contracts import span_attributes as sa
from tests.collector.helpers import run_store_script

# A store as an earlier version left it: the first ``{k}`` migrations applied and recorded.
_EARLIER = """
import json, sys, time
from collector.store import schema
from collector.store.client import Store
st = Store('chdb://' + sys.argv[1])
c = st.client()
db = 'parallax'
for version, name, stmts in schema.migrations(db, 7)[:{k}]:
    for s in stmts:
        c.command(s)
    c.command(f"INSERT INTO {{db}}.schema_migrations (version, name) "
              f"VALUES ({{version}}, '{{name}}')")
"""

_SCRIPT = (
    _EARLIER.format(k=2)
    + """
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
new = dict(old, trace_id='c' * 32, span_id='d' * 16, route='/new', sample_th=0)
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
)

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
    assert out["applied"] == [3, 4, 5, 6, 7] and out["again"] == []
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


def test_docs_show_the_request_counts_ddl() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "store.md").read_text()
    ddl = next(s for s in schema.migrations("parallax", 7)[3][2] if "request_counts" in s)
    assert f"```sql\n{ddl}\n```" in doc


_SCRIPT_V4 = (
    _EARLIER.format(k=3)
    + """
from datetime import UTC, datetime, timedelta
from collector.sla.config import SlaConfig
from collector.sla.evaluate import evaluate
from collector.sla.source import SlaSource
now = datetime.now(UTC).replace(second=30, microsecond=0) - timedelta(minutes=3)
v3 = [col.name for col in schema.SPAN_COLUMNS if col.name != 'sample_th']
span = {n: None for n in v3}
span.update(time=time.time_ns() - 10**9, end_time=time.time_ns(), received=time.time_ns() // 10**6,
            trace_id='a' * 32, span_id='b' * 16, parent_span_id='', span_name='GET /old',
            source='ebpf', service='app', host='h', pid=1, method='GET', route='/old',
            path='/old', status=200, server_address='', server_port=80, client_address='',
            client_port=1, duration_us=1000, chunk_offsets_us=[], ws_seq=0, partial=False,
            client_aborted=False, traceparent_missed=False, attributes={}, gpu_uuid='')
c.insert(f'{db}.server_spans', [[span[n] for n in v3]], column_names=v3)
llm = schema.column_names(schema.PAIR_LLM_COLUMNS + schema.PAIR_RETRANSMIT_COLUMNS)  # 6's, 7's
pn = [col.name for col in schema.PAIR_COLUMNS
      if col.name != 'sample_th' and not col.name.startswith('wire_hold') and col.name not in llm]
def pair(i, t, th=None):
    p = {n: None for n in schema.column_names(schema.PAIR_COLUMNS)}
    p.update(wire_hold_reason='', llm_dialect='', llm_model='', llm_end='', user_llm_end='')
    p.update(time=t, version=1, paired_at=t, site='s', session='x', service='app',
             route='/r', method='GET', status=200, kind='fetch', trace_id=f'{i:032x}',
             span_id=f'{i:016x}', seq=0, coarse=False, chunks_coarse=False, user_itl_ms=[],
             server_itl_ms=[], server_timed=True, hops=1, hop_span_ids=['x'],
             hop_services=['app'], hop_added_ms=[1.0], edge_itl_ms=[], linked_span_ids=[],
             reconnects=0, user_ttfb_ms=50.0 + i % 50, server_ttfb_ms=40.0 + i % 50)
    if th is not None:
        p['sample_th'] = th
    return p
old = [pair(i, now - timedelta(seconds=i % 60)) for i in range(200)]
c.insert(f'{db}.pairs', [[p[n] for n in pn] for p in old], column_names=pn)
# The SLA checker's minute table as the previous version made it (no weight columns), with
# a summary row it wrote.
from collector.sla import schema as sla_schema
old_ddl = sla_schema.statements(db)[1].replace(sla_schema._WEIGHT_DDL, '')
assert 'weights' not in old_ddl
c.command(old_ddl)
c.insert(f'{db}.sla_minutes', [[now, 'app', '/old', 'ttfb:user', 3, [400, 410], [1, 2], 1]],
         column_names=['minute', 'service', 'route', 'series', 'n', 'cells', 'counts', 'version'])
out = {'applied': st.migrate(7), 'again': st.migrate(7)}
src = SlaSource(lambda: c, db)
src.ensure_schema()
out['old_summary'] = [list(map(str, r)) for r in c.query(
    f"SELECT w, w2, weights, weights2 FROM {db}.sla_minutes WHERE route = '/old'").result_rows]
c.command(f"TRUNCATE TABLE {db}.sla_minutes")
before = evaluate(src, SlaConfig(), now + timedelta(seconds=20)).to_json()
out['old_span_th'] = c.query(f'SELECT sample_th FROM {db}.server_spans').result_rows[0][0]
out['old_pair_th'] = c.query(f'SELECT max(sample_th) FROM {db}.pairs').result_rows[0][0]
# New pairs at p = 1/4 (threshold 3/4 of 2^56), in a later minute of the same window.
allnames = schema.column_names(schema.PAIR_COLUMNS)
later = now + timedelta(minutes=1)
new = [pair(1000 + i, later + timedelta(seconds=i % 20), 3 << 54) for i in range(50)]
c.insert(f'{db}.pairs', [[p[n] for n in allnames] for p in new], column_names=allnames)
after = evaluate(src, SlaConfig(), later + timedelta(seconds=30)).to_json()
m0 = before['routes'][0]['metrics']['ttfb']
m1 = after['routes'][0]['metrics']['ttfb']
out['before'] = [m0['n'], m0['n_eff']]
out['after'] = [m1['n'], m1['n_eff']]
out['weights'] = c.query(f"SELECT sum(w), sum(n) FROM {db}.sla_minutes FINAL "
                         "WHERE series = 'ttfb:user' AND n > 0").result_rows[0]
out['ddl'] = c.query("SELECT create_table_query FROM system.tables "
                     "WHERE database = 'parallax' AND name = 'request_counts'").result_rows[0][0]
print(json.dumps(out, default=str))
"""
)


def test_store_of_the_previous_version_migrates_to_sampling(tmp_path: Path) -> None:
    """A store made by migrations 1–3, with a summary the SLA checker wrote: after migration
    4 old spans and pairs read threshold 0 (weight 1), the SLA tables gain their weight
    columns (the old summary reads weight 1 per pair), and a window mixing old pairs with
    new ones sampled at 1/4 weighs the new ones 4 each (effective sample size below n)."""
    out = run_store_script(_SCRIPT_V4, tmp_path / "chdb")
    assert out["applied"] == [4, 5, 6, 7] and out["again"] == []
    assert out["old_span_th"] == 0 and out["old_pair_th"] == 0
    assert out["old_summary"] == [["3.0", "3.0", "[1.0, 2.0]", "[1.0, 2.0]"]]
    assert out["before"] == [200, 200]
    n, n_eff = out["after"]
    assert n == 250 and 0 < n_eff < 250
    w, n_rows = out["weights"]
    assert n_rows == 250 and abs(float(w) - (200 + 50 * 4)) < 1e-6
    ddl = out["ddl"]
    assert "ReplacingMergeTree" in ddl and "ORDER BY (service, port, host, metric, time)" in ddl
    assert "toIntervalDay(7)" in ddl and "merge_selector_base = 10" in ddl


_SCRIPT_V5 = (
    _EARLIER.format(k=4)
    + """
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from collector.ingest import otlp
now = time.time_ns()
names = schema.column_names(schema.SPAN_COLUMNS)  # migration 5 adds none a parser fills
span = {n: None for n in names}
span.update(time=now - 10**9, end_time=now, received=now // 10**6, trace_id='a' * 32,
            span_id='b' * 16, parent_span_id='', span_name='GET /old', source='ebpf',
            service='app', host='h', pid=1, method='GET', route='/old', path='/old',
            status=200, server_address='', server_port=80, client_address='', client_port=1,
            duration_us=1000, chunk_offsets_us=[], ws_seq=0, partial=False,
            client_aborted=False, traceparent_missed=False, attributes={}, gpu_uuid='',
            sample_th=0)
c.insert(f'{db}.server_spans', [[span[n] for n in names]], column_names=names)
llm = schema.column_names(schema.PAIR_LLM_COLUMNS + schema.PAIR_RETRANSMIT_COLUMNS)  # 6's, 7's
pn = [col.name for col in schema.PAIR_COLUMNS
      if not col.name.startswith('wire_hold') and col.name not in llm]
pair = {n: None for n in pn}
pair.update(time=now // 1000, version=1, paired_at=now // 10**6, site='s', session='x',
            service='app', route='/old', method='GET', status=200, kind='fetch',
            trace_id='a' * 32, span_id='c' * 16, seq=0, coarse=False, chunks_coarse=False,
            user_itl_ms=[], server_itl_ms=[], server_timed=True, hops=1, hop_span_ids=['b'],
            hop_services=['app'], hop_added_ms=[1.0], edge_itl_ms=[], linked_span_ids=[],
            reconnects=0, sample_th=0)
c.insert(f'{db}.pairs', [[pair[n] for n in pn]], column_names=pn)
out = {'applied': st.migrate(7), 'again': st.migrate(7)}
q = f"SELECT wire_hold_writes, wire_hold_max_us, wire_hold_reason FROM {db}.server_spans "
out['old_span'] = [list(r) for r in c.query(q + "WHERE route = '/old'").result_rows]
out['old_pair'] = [list(r) for r in c.query(
    f"SELECT wire_hold_ms, wire_hold_reason FROM {db}.pairs").result_rows]
# Spans as the agent sends them (OTLP), through the collector's parser and insert path: one
# with its writes held by Nagle, one measured with none held, one not measured.
req = ExportTraceServiceRequest()
rs = req.resource_spans.add()
kv = rs.resource.attributes.add()
kv.key, kv.value.string_value = 'service.name', 'app'
for i, attrs in enumerate([
    {'parallax.wire_hold.writes': 12, 'parallax.wire_hold.max_us': 42071,
     'parallax.wire_hold.reason': 'nagle'},
    {'parallax.wire_hold.writes': 0, 'parallax.wire_hold.max_us': 0},
    {},
]):
    sp = rs.scope_spans.add().spans.add()
    sp.trace_id, sp.span_id = bytes([i + 1]) * 16, bytes([i + 1]) * 8
    sp.kind, sp.name = 2, 'GET /new'
    sp.start_time_unix_nano, sp.end_time_unix_nano = now - 10**8, now
    for k, v in {'url.path': f'/new{i}', 'parallax.source': 'ebpf', **attrs}.items():
        a = sp.attributes.add()
        a.key = k
        if isinstance(v, str):
            a.value.string_value = v
        else:
            a.value.int_value = v
rows = otlp.parse(req.SerializeToString(), False, now, 0, now).rows
st.insert_rows(schema.SPANS, rows, names, token='t5')
out['new'] = [list(r) for r in c.query(
    q.replace('SELECT ', 'SELECT path, ') + "WHERE path LIKE '/new%' ORDER BY path").result_rows]
print(json.dumps(out))
"""
)


def test_store_of_the_previous_version_migrates_to_holdback(tmp_path: Path) -> None:
    """Migration 5: old spans and pairs read the holdback as absent (NULL, ''), not 0; a span
    the agent sends reads its parallax.wire_hold.* attributes back as columns, computed by the
    store (the parsers keep them in ``attributes``): measured-and-none-held reads 0."""
    out = run_store_script(_SCRIPT_V5, tmp_path / "chdb")
    assert out["applied"] == [5, 6, 7] and out["again"] == []
    assert out["old_span"] == [[None, None, ""]]
    assert out["old_pair"] == [[None, ""]]
    assert out["new"] == [
        ["/new0", 12, 42071, "nagle"],
        ["/new1", 0, 0, ""],
        ["/new2", None, None, ""],
    ]
    v5 = "\n".join(schema.migrations("parallax", 7)[4][2])
    for col in (*schema.SPAN_HOLD_COLUMNS, *schema.PAIR_HOLD_COLUMNS):
        assert f"ADD COLUMN IF NOT EXISTS {col.ddl()}" in v5
    assert [c.name for c in schema.SPAN_HOLD_COLUMNS] == [
        sa.record_field(a) for a in (sa.WIRE_HOLD_WRITES, sa.WIRE_HOLD_MAX_US, sa.WIRE_HOLD_REASON)
    ]
