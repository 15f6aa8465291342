"""Store.insert frees its batch when it returns: nothing of it is left for the cyclic GC.

clickhouse-connect's insert context keeps a bound method of itself (a reference cycle), so
without Store.insert emptying the list it hands over, every list value of an inserted batch
lives until the cyclic GC runs (docs/collector.md, Performance). Real chDB, in a subprocess
(one chDB data directory per process).
"""

from __future__ import annotations

from pathlib import Path

from tests.collector.helpers import run_store_script

_SCRIPT = """
import gc, json, sys, time
from collector.store import schema
from collector.store.client import Store
st = Store('chdb://' + sys.argv[1])
st.migrate(7)
names = ['time', 'trace_id', 'span_id', 'chunk_offsets_us']
def batch(tag):
    now = time.time_ns()
    return [(now + i, f'{i:032x}', f'{tag:08x}{i:08x}', [tag, 7, 7, i]) for i in range(1, 201)]
def left_over(tag):
    # Lists of the batch that only the cyclic GC can free.
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    n = sum(1 for o in gc.garbage if type(o) is list and o[:3] == [tag, 7, 7])
    gc.set_debug(0)
    gc.garbage.clear()
    return n
gc.disable()
st.insert(schema.SPANS, list(zip(*batch(1))), names)  # first insert: the driver's imports
gc.collect()
cols = list(zip(*batch(2)))
st.insert(schema.SPANS, cols, names, token='t2')
intact = len(cols) == 4 and len(cols[3]) == 200
del cols  # as the writer and the pairer do: the batch is the driver's alone now
ours = left_over(2)
st.client().insert(f'{st.database}.{schema.SPANS}', list(zip(*batch(3))), column_names=names,
                   column_oriented=True)
driver = left_over(3)
n = st.query('SELECT count() FROM parallax.server_spans').result_rows[0][0]
print(json.dumps({'ours': ours, 'intact': intact, 'driver': driver, 'rows': int(n)}))
"""


def test_insert_leaves_no_batch_to_the_cyclic_gc(tmp_path: Path) -> None:
    out = run_store_script(_SCRIPT, tmp_path / "chdb")
    assert out["rows"] == 600  # every batch was written
    assert out["intact"]  # the caller's columns are left as they were
    assert out["ours"] == 0, out
    # The control: the driver's own insert still leaves its batch to the GC. If this fails,
    # the driver no longer keeps its insert context in a cycle (the emptying is then moot).
    assert out["driver"] == 200, out
