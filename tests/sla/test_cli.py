"""``parallax-collector sla --once`` against a stopped collector's data directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

WRITE = """
import sys, clickhouse_connect
from datetime import UTC, datetime
from pathlib import Path
from collector.store import schema
from tests.sla import scenario
d = Path(sys.argv[1])
c = clickhouse_connect.get_client(dsn=f"chdb://{(d / 'chdb').resolve()}")
schema.migrate(c, "parallax")
now = datetime.now(UTC)
routes = sys.argv[2].split(",")
data = {k: v for k, v in scenario.build(now=now, spread_s=200).items() if k in routes}
scenario.write(c, "parallax", data, paired_at=now)
if scenario.SAMPLED_ROUTE in routes:
    scenario.write_sampled(c, "parallax", now)
"""


def _store(tmp_path: Path, routes: str) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    subprocess.run([sys.executable, "-c", WRITE, str(d), routes], check=True, timeout=120)
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


def test_text_states_the_sampling_and_the_effective_sample_size(tmp_path: Path) -> None:
    d = _store(tmp_path, "/v1/ok,/v1/sampled")
    p = _cli("--once", "--data-dir", str(d))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    i = lines.index("/v1/sampled (shop): uncertain")
    assert lines[i + 1].startswith(
        "  /v1/sampled (shop): traced 40 % of requests in the last 5 min"
    )
    assert lines[i + 1].endswith("counted by the agent); sampling now 10 % (2 hosts).")
    assert "n=1795 (n_eff=" in lines[i + 2]
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
