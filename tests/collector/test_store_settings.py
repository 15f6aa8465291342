"""migrate() sets merge_selector_base on the data tables of a real chDB store, once: a second
start changes nothing, and the tables still deduplicate a replayed insert by its token."""

from __future__ import annotations

from pathlib import Path

from tests.collector.helpers import run_store_script

_SCRIPT = """
import json, sys
from collector.store import schema
from collector.store.client import Store
st = Store('chdb://' + sys.argv[1])
st.migrate(7)
q = ("SELECT name, create_table_query FROM system.tables WHERE database = 'parallax' "
     "AND engine LIKE '%MergeTree'")
first = dict(st.query(q).result_rows)
st.migrate(7)
second = dict(st.query(q).result_rows)
c = st.client()
for _ in range(2):  # the same token twice: the second block is dropped
    c.command("INSERT INTO parallax.server_spans (time, trace_id, span_id) "
              "SETTINGS insert_deduplication_token = 't1' "
              "VALUES (now64(9), '4bf92f3577b34da6a3ce929d0e0e4736', '00f067aa0ba902b7')")
n = st.query('SELECT count() FROM parallax.server_spans').result_rows[0][0]
print(json.dumps({'first': first, 'same': first == second, 'rows': int(n)}))
"""


def test_merge_selector_base_set_once(tmp_path: Path) -> None:
    out = run_store_script(_SCRIPT, tmp_path / "chdb")
    data = ("server_spans", "browser_entries", "pairs", "span_traces", "entry_traces")
    for t in data:
        assert "merge_selector_base = 10" in out["first"][t], t
    assert "merge_selector_base" not in out["first"]["schema_migrations"]
    assert out["same"]
    assert out["rows"] == 1
