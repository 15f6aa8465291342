"""POST /v1/metrics: the agent's GPU metrics from the real OpenTelemetry SDK exporter into
``gpu_samples`` of a real collector (real chDB, real HTTP), with the same answers, limits and
spool durability as /v1/traces; what is not stored is counted."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.rpc import status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

from demo.stack import free_port
from parallax_contracts import agent_metrics as gm
from tests.collector.gpu_sdk import (
    GPU_A,
    GPU_B,
    HOST,
    PID,
    points_per_export,
    sample_state,
    sdk_exporter,
)
from tests.collector.helpers import Running, run_store_script, start_collector, wait_for

_READ = """
import json, sys, clickhouse_connect
c = clickhouse_connect.get_client(dsn='chdb://' + sys.argv[1])
q = ("SELECT toUnixTimestamp64Nano(time), toUnixTimestamp64Nano(start_time), host, service,"
     " hw_id, hw_name, pid, metric, value, temporality, attributes FROM parallax.gpu_samples"
     " {final} ORDER BY hw_id, metric, pid, time")
out = {k: [list(r) for r in c.query(q.format(final=f)).result_rows]
       for k, f in (('raw', ''), ('final', 'FINAL'))}
print(json.dumps(out))
"""


def read_samples(data_dir: Path) -> dict[str, list[list[Any]]]:
    """gpu_samples of a stopped collector's store (chDB: one process per directory)."""
    return run_store_script(_READ, (data_dir / "chdb").resolve())


def metric_value(text: str, line_start: str) -> float:
    for ln in text.splitlines():
        if ln.startswith(line_start):
            return float(ln.rsplit(" ", 1)[1])
    return 0.0


def written(c: Running) -> float:
    m = httpx.get(f"{c.query}/metrics", timeout=5).text
    return metric_value(m, 'parallax_collector_rows_written_total{source="gpu_samples"}')


def test_sdk_export_stored_row_by_row(tmp_path: Path) -> None:
    """Three exports of the scripted state (two explicit, one at shutdown): every device and
    process point is a row with its GPU, pid, name, value and temporality; the GenAI
    histogram and the unnamed counter are counted as ignored, by reason."""
    data = tmp_path / "data"
    c = start_collector(data)
    states = [sample_state(0), sample_state(1)]
    try:
        c.wait_ready()
        t0 = time.time_ns()
        with sdk_exporter(f"{c.ingest}/v1/metrics") as e:
            e.export(states[0], ttfts=[0.84, 0.12], others=2)
            e.export(states[1], ttfts=[0.5])
        per = points_per_export(states[1])
        wait_for(lambda: written(c) == 3 * per)
        m = httpx.get(f"{c.query}/metrics", timeout=5).text
        ignored = 'parallax_collector_metric_points_ignored_total{reason="%s"}'
        assert metric_value(m, ignored % "gen_ai_histogram") == 3  # one point per export
        assert metric_value(m, ignored % "other_metric") == 3
        assert metric_value(m, 'parallax_collector_rows_received_total{source="gpu_samples"}') == (
            3 * per
        )
    finally:
        assert c.stop() == 0
    rows = read_samples(data)["final"]
    assert len(rows) == 3 * per
    by: dict[tuple[str, str, int], list[list[Any]]] = {}
    for r in rows:
        by.setdefault((r[4], r[7], r[6]), []).append(r)
    # Device series: hw.id, hw.name, host, vendor kept as an attribute; no pid.
    for hw in (GPU_A, GPU_B):
        for name in (m.name for m in gm.DEVICE):
            series = by[(hw, name, 0)]
            assert [r[8] for r in series] == [
                states[0].device[hw][name],
                states[1].device[hw][name],
                states[1].device[hw][name],  # the shutdown export repeats the last reading
            ], (hw, name)
            for r in series:
                assert t0 <= r[0] <= time.time_ns()
                assert r[2:4] == [HOST, "parallax-agent"]
                assert r[5] == "NVIDIA H200" and r[10] == {"hw.vendor": "NVIDIA"}
            kind = next(m.kind for m in gm.DEVICE if m.name == name)
            assert {r[9] for r in series} == ({"cumulative"} if kind == "updowncounter" else {""})
    # Per-process series: the pid and the point's service.name; cumulative with a start.
    for name in (m.name for m in gm.PROCESS):
        series = by[("", name, PID)]
        assert [r[8] for r in series] == [
            states[0].process[name],
            states[1].process[name],
            states[1].process[name],
        ]
        assert {r[3] for r in series} == {"llm"} and {r[9] for r in series} == {"cumulative"}
        assert all(r[1] is not None and r[1] <= r[0] for r in series)


def _json_points(points: list[dict[str, Any]], name: str = "parallax.gpu.sm_clock") -> bytes:
    doc = {
        "resourceMetrics": [
            {
                "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "n"}}]},
                "scopeMetrics": [{"metrics": [{"name": name, "gauge": {"dataPoints": points}}]}],
            }
        ]
    }
    return json.dumps(doc).encode()


def _point(t: int, value: float | str, hw: str | None = GPU_A) -> dict[str, Any]:
    p: dict[str, Any] = {"timeUnixNano": str(t), "asDouble": value}
    if hw is not None:
        p["attributes"] = [{"key": "hw.id", "value": {"stringValue": hw}}]
    return p


def post(base: str, body: bytes, ctype: str, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/metrics", content=body, headers={"content-type": ctype, **headers}, timeout=5
    )


def test_bad_points_partial_success_and_bad_bodies(collector: Running) -> None:
    """OTLP JSON with rejected points: 200 with partialSuccess naming the reasons, the good
    points kept; malformed protobuf and JSON: 400 with a google.rpc.Status; a wrong
    Content-Type: 415; over 1 MB, also after gzip inflation: 413; gzip protobuf: 200."""
    now = time.time_ns()
    body = _json_points(
        [
            _point(now - 10**9, 1500.0),
            _point(now - 10**9, 1400.0, hw=GPU_B),
            _point(now - 10**9, 1500.0, hw=None),  # a device series without hw.id
            _point(now - 10**9, "NaN"),
            _point(now - 8 * 86_400 * 10**9, 1500.0),  # older than the 7-day retention
            _point(now + 2 * 86_400 * 10**9, 1500.0),  # a day ahead and more
            {"timeUnixNano": str(now), "attributes": []},  # no value at all
        ]
    )
    r = post(collector.ingest, body, "application/json")
    assert r.status_code == 200, r.text
    ps = r.json()["partialSuccess"]
    assert int(ps["rejectedDataPoints"]) == 5
    assert ps["errorMessage"] == (
        "1 in_future, 1 invalid_value, 1 missing_hw_id, 1 missing_value, 1 older_than_retention"
    )
    m = httpx.get(f"{collector.query}/metrics", timeout=5).text
    assert (
        'parallax_collector_rows_rejected_total{reason="missing_hw_id",source="gpu_samples"} 1.0'
        in m
    )
    wait_for(lambda: written(collector) >= 2)

    r = post(collector.ingest, b"\xff\xff\xff", "application/x-protobuf")
    assert r.status_code == 400 and r.headers["content-type"] == "application/x-protobuf"
    assert "malformed protobuf" in status_pb2.Status.FromString(r.content).message
    r = post(collector.ingest, b"[1, 2]", "application/json")
    assert r.status_code == 400 and r.json()["code"] == 3 and "\n" not in r.json()["message"]
    assert post(collector.ingest, b"x", "text/csv").status_code == 415
    big = b"\0" * (1024 * 1024 + 1)
    assert post(collector.ingest, big, "application/x-protobuf").status_code == 413
    bomb = gzip.compress(b"\0" * (2 * 1024 * 1024))
    r = post(collector.ingest, bomb, "application/x-protobuf", **{"content-encoding": "gzip"})
    assert r.status_code == 413
    r = post(
        collector.ingest,
        gzip.compress(b""),
        "application/x-protobuf",
        **{"content-encoding": "gzip"},
    )
    assert r.status_code == 200
    assert (
        ExportMetricsServiceResponse.FromString(r.content).partial_success.rejected_data_points == 0
    )
    m = httpx.get(f"{collector.query}/metrics", timeout=5).text
    assert 'parallax_collector_requests_refused_total{code="413",endpoint="metrics"} 2.0' in m
    assert 'parallax_collector_requests_refused_total{code="415",endpoint="metrics"} 1.0' in m


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    c = start_collector(tmp_path_factory.mktemp("strict") / "data", "--otlp-token", "s3cret")
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop()


def test_token_required_as_for_traces(strict: Running) -> None:
    body = _json_points([_point(time.time_ns() - 10**9, 1500.0)])
    r = post(strict.ingest, body, "application/json")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert post(strict.ingest, body, "application/json", authorization="Bearer no").status_code == (
        401
    )
    ok = post(strict.ingest, body, "application/json", authorization="Bearer s3cret")
    assert ok.status_code == 200
    with sdk_exporter(f"{strict.ingest}/v1/metrics", {"authorization": "Bearer s3cret"}) as e:
        e.export(sample_state(0))
    wait_for(lambda: written(strict) == 1 + 2 * points_per_export(sample_state(0)))


def test_spooled_through_an_outage_replayed_once(tmp_path: Path) -> None:
    """The store unreachable: metric requests are answered 200 from the spool; after a
    restart on a store that answers, they are written from the spooled bodies, each point
    once (and a client's retry of the same export collapses in the table)."""
    data = tmp_path / "data"
    dead = f"http://127.0.0.1:{free_port()}/parallax"
    now = time.time_ns()
    bodies = [_json_points([_point(now - (i + 1) * 10**9, 1000.0 + i)]) for i in range(20)]
    c = start_collector(data, "--store", dead, "--rate", "0")
    try:
        c.wait_ready(need_store=False)
        for b in bodies + bodies[:5]:  # the last five: a client's retries
            assert post(c.ingest, b, "application/json").status_code == 200
    finally:
        assert c.stop() == 0
    assert sorted((data / "spool").glob("*.seg")), "accepted metrics must be on disk"
    c2 = start_collector(data)
    try:
        c2.wait_ready()
        wait_for(lambda: not sorted((data / "spool").glob("*.seg")), timeout_s=60)
    finally:
        assert c2.stop() == 0
    out = read_samples(data)
    assert len(out["raw"]) <= 25
    assert sorted(r[8] for r in out["final"]) == [1000.0 + i for i in range(20)]


def test_spool_full_answers_503(tmp_path: Path) -> None:
    c = start_collector(
        tmp_path / "data", "--store", f"http://127.0.0.1:{free_port()}/x", "--spool-max-mb", "0"
    )
    try:
        c.wait_ready(need_store=False)
        r = post(c.ingest, _json_points([_point(time.time_ns(), 1.0)]), "application/json")
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert "spool full" in r.json()["message"]
    finally:
        c.stop()
