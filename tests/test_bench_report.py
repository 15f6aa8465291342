"""The benchmark helpers that need no machine: section writing, the accuracy bench's matching
of agent records to the app's own clock, and the demo plot's one-line failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import accuracy, demo_plot, report
from tests.e2e.harness import Outcome

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def test_write_section_replaces_only_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "benchmarks.md"
    monkeypatch.setattr(report, "DOC", doc)
    report.write_section("a", "first A")
    report.write_section("b", "only B")
    report.write_section("a", "second A")
    text = doc.read_text()
    assert "second A" in text and "first A" not in text and "only B" in text
    assert text.index("<!-- bench:a -->") < text.index("<!-- bench:b -->")


def _outcome(timing: dict[str, object], agent: dict[str, object]) -> Outcome:
    return Outcome(report={"routes": []}, pairs=[], timing=[timing], agent_records=[agent], chats=1)


def test_agent_errors_match_by_trace_id_against_the_head_write() -> None:
    # Python app: head written at t_headers (1.0 ms after start), tokens at 40, 50, 60 ms.
    timing = {
        "path": "/v1/chat",
        "traceparent": f"00-{TRACE}-00f067aa0ba902b7-01",
        "t_start_ns": 1_000_000_000,
        "t_headers_ns": 1_001_000_000,
        "t_writes_ns": [1_040_000_000, 1_050_000_000, 1_060_000_000],
    }
    agent = {
        "trace_id": TRACE,
        "path": "/v1/chat",
        "ttfb_us": 1_250,
        "ttft_us": 40_300,
        # one more write than the app logs (the chunked terminator): ignored
        "chunk_offsets_us": [40_300, 50_310, 60_290, 60_400],
    }
    e = accuracy.agent_errors(_outcome(timing, agent))
    assert e["ttfb"] == [pytest.approx(250)]
    assert e["ttft"] == [pytest.approx(300)]
    assert e["gap"] == [pytest.approx(10), pytest.approx(-20)]


def test_agent_errors_node_head_goes_with_the_first_token() -> None:
    timing = {
        "path": "/v1/chat",
        "traceparent": f"00-{TRACE}-00f067aa0ba902b7-01",
        "t_start_ns": 0,
        "t_writes_ns": [40_000_000],
    }
    agent = {"trace_id": TRACE, "path": "/v1/chat", "ttfb_us": 40_500, "ttft_us": 40_500,
             "chunk_offsets_us": [40_500]}  # fmt: skip
    other = {**agent, "trace_id": "0" * 31 + "1"}  # no timing record: not matched
    out = _outcome(timing, agent)
    out.agent_records.append(other)
    e = accuracy.agent_errors(out)
    assert e["ttfb"] == [pytest.approx(500)] and e["gap"] == []


def test_quantile_is_inclusive() -> None:
    xs = [float(x) for x in range(1, 21)]
    assert accuracy.q(xs, 0.5) == pytest.approx(10.5)
    assert accuracy.q(xs, 0.95) == pytest.approx(19.05)
    assert accuracy.q([3.0], 0.95) == 3.0


def test_demo_plot_without_a_store_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo_plot.main(["--data-dir", str(tmp_path), "--out", str(tmp_path / "p.png")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "make demo" in err[0], err
    assert not (tmp_path / "p.png").exists()


def test_demo_plot_on_a_store_in_use_names_the_holder_in_one_line(tmp_path: Path) -> None:
    """`python -m bench.demo_plot` while the demo's collector holds its store: one line
    naming the store and the holder, what to do, no engine message."""
    import subprocess
    import sys

    from tests.collector.helpers import start_collector

    data = tmp_path / "demo"
    c = start_collector(data, "--no-plugins")
    try:
        c.wait_ready(60)
        p = subprocess.run(
            [sys.executable, "-m", "bench.demo_plot", "--data-dir", str(data), "--out",
             str(tmp_path / "p.png")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        c.stop()
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr == (
        f"bench.demo_plot: {(data / 'chdb').resolve()} is in use by process {c.proc.pid} (the "
        "embedded store opens in one process at a time): stop the demo (Ctrl-C) or run it "
        "with DEMO_EXIT=1, then plot\n"
    )


def test_store_bench_requests_are_stored_whole() -> None:
    """bench.store's generated requests go through the collector's parsers with nothing
    rejected or cut: the bytes it measures are those of real rows, span and entry alike."""
    import time

    from bench import store
    from collector.ingest import beacons, otlp
    from collector.store import schema

    spans, bodies = store.bodies(60, 200, 1)
    now = time.time_ns()
    sp = [otlp.parse(b, False, now, 0, now) for b in spans]
    en = [beacons.parse(beacons.read(b), now, 0, now) for b in bodies]
    assert sum(p.rejected_total for p in sp + en) == 0
    srows = [r for p in sp for r in p.rows]
    erows = [r for p in en for r in p.rows]
    assert len(srows) == len(erows) == 60
    s_names = schema.column_names(schema.SPAN_COLUMNS)
    e_names = schema.column_names(schema.ENTRY_COLUMNS)
    offs = {len(r[s_names.index("chunk_offsets_us")]) for r in srows}
    chunks = {len(r[e_names.index("chunk_ms")]) for r in erows}
    assert offs == chunks == {200}
    # each entry is the parent of its span: every one pairs
    parents = {(r[s_names.index("trace_id")], r[s_names.index("parent_span_id")]) for r in srows}
    assert parents == {(r[e_names.index("trace_id")], r[e_names.index("span_id")]) for r in erows}
