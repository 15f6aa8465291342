"""``parallax-collector sla --once`` against a stopped collector's data directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.collector.helpers import start_collector
from tests.sla import scenario

WRITE = """
import sys, clickhouse_connect
from datetime import UTC, datetime, timedelta
from pathlib import Path
from collector.store import schema
from tests.sla import scenario
d = Path(sys.argv[1])
c = clickhouse_connect.get_client(dsn=f"chdb://{(d / 'chdb').resolve()}")
schema.migrate(c, "parallax")
now = datetime.now(UTC) - timedelta(minutes=float(sys.argv[3]))
routes = sys.argv[2].split(",")
data = {k: v for k, v in scenario.build(now=now, spread_s=200).items() if k in routes}
scenario.write(c, "parallax", data, paired_at=now)
if scenario.SAMPLED_ROUTE in routes:
    scenario.write_sampled(c, "parallax", now)
if scenario.CALM_ROUTE in routes:
    scenario.write_calm_route(c, "parallax", now)
"""


def _store(tmp_path: Path, routes: str, minutes_ago: float = 0) -> Path:
    """A stopped collector's data directory holding the scenario's ``routes``, their pairs
    spread over the 200 s before ``minutes_ago``."""
    d = tmp_path / "data"
    d.mkdir()
    subprocess.run(
        [sys.executable, "-c", WRITE, str(d), routes, str(minutes_ago)], check=True, timeout=120
    )
    return d


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "collector.cli", "sla", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_json_and_exit_1_when_out_of_band(tmp_path: Path) -> None:
    d = _store(tmp_path, "/v1/ok,/v1/net")
    p = _cli("--once", "--json", "--data-dir", str(d))
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    assert [r["route"] for r in doc["routes"]] == ["/v1/net", "/v1/ok"]
    m = doc["routes"][0]["metrics"]["ttfb"]
    assert m["verdict"] == "out_of_band" and 15 < m["ci_low_ms"] < 25 < m["ci_high_ms"] < 35
    assert m["alert_state"] == "inactive" and m["n"] == 1500
    text = _cli("--once", "--data-dir", str(d))
    assert text.returncode == 1 and "users get the first byte at P95" in text.stdout


def test_exit_0_when_inside_and_2_on_errors(tmp_path: Path) -> None:
    d = _store(tmp_path, "/v1/ok")
    assert _cli("--once", "--data-dir", str(d)).returncode == 0
    bad = _cli("--once", "--data-dir", str(tmp_path / "missing"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no such directory" in bad.stderr
    cfg = tmp_path / "sla.yaml"
    cfg.write_text("band_ms: -1\n")
    p = _cli("--once", "--data-dir", str(d), "--config", str(cfg))
    assert p.returncode == 2 and "band_ms: must be ≥ 0" in p.stderr and "Traceback" not in p.stderr
    w = _cli("--once", "--data-dir", str(d), "--window", "5 minutes")
    assert w.returncode == 2 and "--window" in w.stderr


def test_text_states_the_sampling_per_route_and_the_effective_sample_size(
    tmp_path: Path,
) -> None:
    """Two routes of one sampled service: the busy one traced about 40 % of its requests,
    the calm one every request; each sentence says its route's share, then the service's."""
    d = _store(tmp_path, f"/v1/ok,/v1/sampled,{scenario.CALM_ROUTE}")
    p = _cli("--once", "--data-dir", str(d))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    service = (
        "its service traced 2,095 of 4,800 requests (44 %, counted by the agent on ports "
        "8080, 8081); sampling now 10 % (2 hosts)."
    )
    i = lines.index("/v1/sampled (shop): uncertain")
    assert lines[i + 1].startswith(
        "  /v1/sampled (shop): traced about 40 % of this route's requests in the last 5 min "
        "(1,795 pairs stand for 4,4"
    ), lines[i + 1]
    assert lines[i + 1].endswith(service), lines[i + 1]
    assert "n=1795 (n_eff=" in lines[i + 2]
    j = next(k for k, x in enumerate(lines) if x.startswith(f"{scenario.CALM_ROUTE} (shop): "))
    assert lines[j + 1] == (
        f"  {scenario.CALM_ROUTE} (shop): traced every request of this route in the last 5 min "
        f"(300 pairs); {service}"
    )
    assert not any("traced" in x for x in lines[lines.index("/v1/ok (app): ok") :])


def test_a_store_older_than_sampling_is_refused(tmp_path: Path) -> None:
    d = _store(tmp_path, "/v1/ok")
    script = (
        "import sys, clickhouse_connect; c = clickhouse_connect.get_client(dsn='chdb://' + "
        "sys.argv[1]); c.command('ALTER TABLE parallax.pairs DROP COLUMN sample_th')"
    )
    subprocess.run([sys.executable, "-c", script, str(d / "chdb")], check=True, timeout=60)
    p = _cli("--once", "--data-dir", str(d))
    assert p.returncode == 2 and "made by an earlier version" in p.stderr
    assert p.stderr.count("\n") == 1


@pytest.mark.parametrize("flag", ["--help"])
def test_help(flag: str) -> None:
    p = _cli(flag)
    assert p.returncode == 0 and "--data-dir" in p.stdout


def test_a_quiet_window_says_what_it_holds_and_how_to_reach_the_data(tmp_path: Path) -> None:
    """After 40 quiet minutes the window is empty: one line says what it covered and which
    --window reaches the newest pair; that window finds the data."""
    d = _store(tmp_path, "/v1/ok", minutes_ago=40)
    p = _cli("--once", "--data-dir", str(d))
    assert p.returncode == 0, p.stderr
    hint = p.stdout.splitlines()[-1]
    assert hint.startswith("no paired requests in the window (the last 5 min: "), hint
    assert "(1,500 pairs in all): widen the window to reach it, e.g. --window 4" in hint
    reach = hint.rsplit("--window ", 1)[1]
    assert reach in ("42m", "43m", "44m", "45m"), reach  # 40 min + the 200 s spread, rounded up
    j = _cli("--once", "--json", "--data-dir", str(d))
    assert json.loads(j.stdout)["routes"] == [] and j.stderr.count("\n") == 1
    assert j.stderr.startswith("sla: no paired requests in the window (the last 5 min: ")
    assert j.stderr.endswith(hint.split(" UTC); ", 1)[1] + "\n")  # the times move on
    wide = _cli("--once", "--data-dir", str(d), "--window", reach)
    assert wide.returncode == 0 and "/v1/ok (app): ok" in wide.stdout, wide.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    run = subprocess.run(
        [sys.executable, "-c", WRITE, str(empty), "none", "0"], check=True, timeout=120
    )
    assert run.returncode == 0
    p = _cli("--once", "--data-dir", str(empty))
    assert p.stdout.splitlines()[-1].endswith(
        "and none in the store: are the agent and the browser probe sending to this collector?"
    )


def test_a_store_held_by_a_running_collector_is_one_line(tmp_path: Path) -> None:
    """chDB opens a directory in one process: against a running collector's data `sla` and a
    second `serve` each say so in one line naming the path and the holder — no engine
    message, no traceback."""
    d = _store(tmp_path, "/v1/ok")
    c = start_collector(d, "--no-plugins")
    try:
        c.wait_ready(60)
        p = _cli("--once", "--data-dir", str(d))
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert p.stderr == (
            f"sla: {(d / 'chdb').resolve()} is in use by process {c.proc.pid} (the embedded "
            "store opens in one process at a time): read the running collector's GET /v1/sla "
            "(its query port), or stop it and run this again\n"
        )
        other = start_collector(
            tmp_path / "other", "--no-plugins", "--store", f"chdb://{(d / 'chdb').resolve()}"
        )
        assert other.proc.wait(60) == 2
        errors = [ln for ln in other.tail().splitlines() if "ERROR" in ln or "Code:" in ln]
        assert len(errors) == 1 and errors[0].endswith(
            f"{(d / 'chdb').resolve()} is in use by process {c.proc.pid} (the embedded store "
            "opens in one process at a time): stop it, or give this collector another "
            "--data-dir or --store"
        ), other.tail()
        assert "Traceback" not in other.tail()
        same = start_collector(d, "--no-plugins")
        assert same.proc.wait(60) == 2
        assert (
            "is in use by another collector (one process per data dir): stop it, or give "
            "this one another --data-dir" in same.tail()
        )
    finally:
        c.stop()
