"""Insert tokens name the spool as well as the segment (collector/pipeline.py,
``spool_identity``). Several collectors write one store behind a Service: a segment id is a
clock reading, and two of them opening a segment in the same nanosecond would have the
second's rows dropped by the store as a repeat of the first's — acknowledged rows lost
without a word. Real chDB: two spools inserting the same segment id into one table both
land; one spool replaying its segment (after a restart, the name read back) doubles
nothing; a segment an older collector left keeps the bare token it was inserted with."""

from __future__ import annotations

from pathlib import Path

from collector.pipeline import IDENTITY, spool_identity
from tests.collector.helpers import run_store_script

_SCRIPT = """
import json, sys, time
from pathlib import Path
from bench.collector import _bodies
from collector.ingest import otlp
from collector.pipeline import Pipeline, SPANS
from collector.store.client import Store
base = Path(sys.argv[1])
st = Store('chdb://' + str(base / 'chdb'))
st.migrate(7)
now = time.time_ns()
rows = [otlp.parse(b, False, now, 0, now).rows for b in _bodies(20, 3)[0]][0]
a, b = rows[:10], rows[10:]
def count():
    return st.query('SELECT count() FROM parallax.server_spans').result_rows[0][0]
def pipe(d):
    p = Pipeline(st, base / d, lambda *x: None)
    p.start()
    return p
seg = time.time_ns()
p1, p2 = pipe('spool1'), pipe('spool2')
p1._insert(seg, {SPANS: a})
p2._insert(seg, {SPANS: b})  # another collector, the same nanosecond
out = {'two_spools': count()}
p1._insert(seg, {SPANS: a})  # a replay
out['replayed'] = count()
p1.stop()
p1._lockfile.close()  # (a new process would hold a new lock)
p1 = pipe('spool1')  # restarted: the same name
p1._insert(seg, {SPANS: a})
out['restarted'] = count()
out['names'] = [p1._token(seg, 'server_spans'), p2._token(seg, 'server_spans')]
# a spool an older collector left: its segment was inserted with the bare token
old = base / 'spool3'
old.mkdir()
(old / f'{seg - 5:020d}.seg').write_bytes(b'')
p3 = pipe('spool3')
out['old_segment'] = p3._token(seg - 5, 'server_spans')
out['new_segment'] = p3._token(seg + 5, 'server_spans', 0, 4)
print(json.dumps(out))
"""


def test_tokens_are_the_spools_own(tmp_path: Path) -> None:
    out = run_store_script(_SCRIPT, tmp_path)
    assert out["two_spools"] == 20  # without the spool's name: 10
    assert out["replayed"] == out["restarted"] == 20
    n1, n2 = out["names"]
    assert n1 != n2 and n1.endswith(":server_spans") and n1.count(":") == 2
    seg = int(n1.split(":")[1])
    assert out["old_segment"] == f"{seg - 5}:server_spans"
    assert out["new_segment"].endswith(f":{seg + 5}:server_spans:0-4")
    assert out["new_segment"].count(":") == 3


def test_the_name_is_kept_and_a_damaged_one_replaced(tmp_path: Path) -> None:
    name, upto = spool_identity(tmp_path, 42)
    assert len(name) == 16 and upto == 42
    assert spool_identity(tmp_path, 99) == (name, 42)  # read back, not remade
    (tmp_path / IDENTITY).write_text("garbage")
    other, upto = spool_identity(tmp_path, 7)
    assert other != name and upto == 7
