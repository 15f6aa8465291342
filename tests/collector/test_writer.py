"""The writer against real chDB: rows the store rejects for good are quarantined and do not
block what follows; transient failures are classified apart (tests/collector/writer_scenario.py
runs in a child process: one chDB data directory per process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from clickhouse_connect.driver.exceptions import DatabaseError, DataError, OperationalError

from collector.pipeline import is_permanent

ROOT = Path(__file__).resolve().parents[2]


def test_rejected_rows_are_quarantined_and_the_rest_written_once(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "tests.collector.writer_scenario", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    # 40 rows in the bad segment (2 rejected) + 2 × 40 in the segments after it
    assert out["good_expected"] == 118
    assert out["written"] == out["written_distinct"] == 118
    assert out["good_all_written"]
    assert out["bad_written"] == []
    assert out["queue_left"] == 0 and out["last_error"] is None
    assert out["quarantine_files"] == 1
    assert out["quarantined_ids_ok"]
    # one rejected by the driver (UInt16 overflow), one by the store (CHECK constraint)
    assert out["quarantine_errors"] == ["DataError", "DatabaseError"]
    assert out["quarantined_metric"] == 2
    assert out["handed_to_pairer"] == 118 and out["bad_handed_to_pairer"] == []
    # the same segment once more (replay): the halves deduplicate by their tokens
    assert out["after_replay"] == 118
    # segments re-read from the spool are not dropped by the live retry filter
    assert out["reread_written"] == out["reread_expected"] == 90
    # a bisection out of budget quarantines the unresolved ranges whole: nothing lost
    assert out["budget_accounted"] and out["budget_bad_quarantined"], out
    assert not out["budget_doubled"]
    assert 0 < out["budget_written"] < 58 and out["budget_quarantined"] > 6, out
    # refused whole, accepted in halves: all written, nothing quarantined, no error left
    assert out["halves_written"] and out["halves_quarantined"] == 0, out
    assert out["halves_error"] is None
    # one log line for the segment and one for its replay, no driver tracebacks
    assert p.stderr.count("store rejected 2 server_spans row(s)") == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr


def test_permanent_versus_transient() -> None:
    assert is_permanent(DataError("Unable to create native array for column `status`"))
    assert is_permanent(DatabaseError("Code: 469. DB::Exception: Constraint `c` violated"))
    assert is_permanent(DatabaseError("x", code=53))
    assert is_permanent(TypeError("int() argument must be a string"))
    assert not is_permanent(OperationalError("Error HTTPConnectionPool: Connection refused"))
    assert not is_permanent(DatabaseError("Code: 241. DB::Exception: Memory limit exceeded"))
    assert not is_permanent(DatabaseError("Code: 60. DB::Exception: Table does not exist"))
    assert not is_permanent(TimeoutError("timed out"))
    assert not is_permanent(ConnectionRefusedError(111, "Connection refused"))


_HANDOVER_FAILS = """
import json, sys, time
from pathlib import Path
from bench.collector import _bodies
from collector.ingest import beacons
from collector.pipeline import KIND_BEACON, Hooks, Pipeline
from collector.store.client import Store

class Failing(Hooks):
    calls = 0
    def rows_written(self, rows):
        Failing.calls += 1
        raise RuntimeError('pairer broke')

base = Path(sys.argv[1])
st = Store('chdb://' + str(base / 'chdb')); st.migrate(7)
now = time.time_ns()
def parse(kind, body, received):
    return beacons.parse(beacons.load(body), received, 0, time.time_ns())
pipe = Pipeline(st, base / 'spool', parse, Failing(), batch_rows=50, flush_interval_s=60)
pipe.start()
_, bodies = _bodies(150, 5)  # three beacons of 50 entries: three segments
for b in bodies:
    pipe.accept(KIND_BEACON, b, now, parse(KIND_BEACON, b, now))
deadline = time.monotonic() + 60
while pipe.pending_rows and time.monotonic() < deadline:
    time.sleep(0.05)
n = st.query('SELECT count() FROM parallax.browser_entries').result_rows[0][0]
print(json.dumps({'rows': int(n), 'calls': Failing.calls, 'alive': pipe._threads[0].is_alive(),
                  'segments_left': pipe.queue_segments()}))
pipe.stop(5)
"""


def test_a_failing_pairer_hand_over_does_not_stop_the_writer(tmp_path: Path) -> None:
    from tests.collector.helpers import run_store_script

    out = run_store_script(_HANDOVER_FAILS, tmp_path)
    assert out == {"rows": 150, "calls": 3, "alive": True, "segments_left": 0}
