"""Who served a span, end to end: real OpenTelemetry SDK spans whose Resource carries the
agent's Kubernetes identity (container.id, k8s.*), exported by the SDK's OTLP/HTTP exporter
(protobuf: the compiled decoder) and as OTLP JSON (the Python path) into a real collector,
read back from chDB with SQL ``attributes['k8s.pod.name']``. Only the documented identity is
stored (not the SDK's or the process's other Resource attributes), the Resource's value wins
over a span attribute of the same name, and a span from a Resource without it has none."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from parallax_contracts import compiled
from parallax_contracts import span_attributes as sa
from tests.collector.helpers import run_store_script, start_collector, wait_for
from tests.collector.test_metrics_ingest import metric_value

CID = "3f2a" * 16
IDENTITY = {
    sa.RESOURCE_CONTAINER_ID: CID,
    sa.RESOURCE_K8S_NODE_NAME: "node-a",
    sa.RESOURCE_K8S_NAMESPACE_NAME: "shop",
    sa.RESOURCE_K8S_POD_NAME: "chat-7c9d6b5f4-x2x9q",
    sa.RESOURCE_K8S_POD_UID: "0b6d2a8e-63f1-4f7e-9b3a-5d2c1e0f9a87",
    sa.RESOURCE_K8S_CONTAINER_NAME: "chat",
    sa.RESOURCE_K8S_REPLICASET_NAME: "chat-7c9d6b5f4",
    sa.RESOURCE_K8S_DEPLOYMENT_NAME: "chat",
}
_READ = """
import json, sys, clickhouse_connect
c = clickhouse_connect.get_client(dsn='chdb://' + sys.argv[1])
q = ("SELECT trace_id, service, host, attributes['k8s.pod.name'],"
     " attributes['k8s.namespace.name'], attributes['k8s.deployment.name'], attributes"
     " FROM parallax.server_spans ORDER BY trace_id")
pods = ("SELECT attributes['k8s.namespace.name'] AS ns, attributes['k8s.pod.name'] AS pod,"
        " count() FROM parallax.server_spans WHERE mapContains(attributes, 'k8s.pod.name')"
        " GROUP BY ns, pod ORDER BY ns, pod")
docs = [[list(r) for r in c.query(d).result_rows] for d in json.loads(sys.argv[2])]
print(json.dumps({"rows": [list(r) for r in c.query(q).result_rows],
                  "pods": [list(r) for r in c.query(pods).result_rows], "docs": docs}))
"""
STORE_MD = Path(__file__).resolve().parents[2] / "docs" / "store.md"


def doc_queries() -> list[str]:
    """The SQL of docs/store.md's "Kubernetes identity" section, statement by statement."""
    text = STORE_MD.read_text().split("## Kubernetes identity", 1)[1].split("\n## ", 1)[0]
    block = text.split("```sql\n", 1)[1].split("```", 1)[0]
    return [q.strip() for q in block.split(";") if q.strip()]


def test_sdk_resource_identity_stored_and_queried(tmp_path: Path) -> None:
    data = tmp_path / "data"
    c = start_collector(data)
    ids: dict[str, str] = {}
    try:
        c.wait_ready()
        resource = Resource.create(
            {
                "service.name": "chat",
                "host.name": "node-a",
                "process.pid": 4242,
                "process.executable.name": "python3",  # not identity: not stored
                **IDENTITY,
            }
        )
        plain = Resource.create({"service.name": "plain", "host.name": "laptop"})
        for key, res in (("k8s", resource), ("plain", plain)):
            tp = TracerProvider(resource=res)
            tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(f"{c.ingest}/v1/traces")))
            with tp.get_tracer("t").start_as_current_span(
                "POST /v1/chat",
                kind=SpanKind.SERVER,
                attributes={
                    "url.path": "/v1/chat",
                    "http.request.method": "POST",
                    "k8s.pod.name": "from-the-app",  # the Resource's wins
                    "user_agent.original": "curl/8",
                },
            ) as sp:
                ids[key] = format(sp.get_span_context().trace_id, "032x")
            tp.shutdown()
        # OTLP JSON (the Python decoder): the same identity, the same row.
        ids["json"] = os.urandom(16).hex()
        now = time.time_ns()
        doc = {
            "resourceSpans": [
                {
                    "resource": {
                        "attributes": [
                            {"key": k, "value": {"stringValue": v}}
                            for k, v in {"service.name": "chat", **IDENTITY}.items()
                        ]
                    },
                    "scopeSpans": [
                        {
                            "spans": [
                                {
                                    "traceId": ids["json"],
                                    "spanId": os.urandom(8).hex(),
                                    "name": "GET /health",
                                    "kind": 2,
                                    "startTimeUnixNano": str(now - 10**6),
                                    "endTimeUnixNano": str(now),
                                }
                            ]
                        }
                    ],
                }
            ]
        }
        r = httpx.post(
            f"{c.ingest}/v1/traces",
            content=json.dumps(doc),
            headers={"content-type": "application/json"},
            timeout=5,
        )
        assert r.status_code == 200, r.text

        def written() -> bool:
            m = httpx.get(f"{c.query}/metrics", timeout=5).text
            return metric_value(m, 'parallax_collector_rows_written_total{source="spans"}') >= 3

        wait_for(written)
    finally:
        assert c.stop() == 0
    out: dict[str, Any] = run_store_script(
        _READ, (data / "chdb").resolve(), json.dumps(doc_queries())
    )
    rows = {r[0]: r for r in out["rows"]}
    assert set(rows) == set(ids.values())
    k8s, plain_row, js = rows[ids["k8s"]], rows[ids["plain"]], rows[ids["json"]]
    assert k8s[1:6] == ["chat", "node-a", "chat-7c9d6b5f4-x2x9q", "shop", "chat"]
    assert k8s[6] == {**IDENTITY, "user_agent.original": "curl/8"}
    assert js[3:6] == ["chat-7c9d6b5f4-x2x9q", "shop", "chat"] and js[6] == IDENTITY
    # No identity in the Resource: the span's own attribute of that name stays.
    assert plain_row[1:4] == ["plain", "laptop", "from-the-app"]
    assert plain_row[6] == {"k8s.pod.name": "from-the-app", "user_agent.original": "curl/8"}
    assert out["pods"] == [["", "from-the-app", 1], ["shop", "chat-7c9d6b5f4-x2x9q", 2]]
    # docs/store.md's queries: the route's pods (SDK spans: no TTFB), one trace's hops
    assert out["docs"] == [[["shop", "chat-7c9d6b5f4-x2x9q", 1, None]], []]
    # The SDK's protobuf went through the compiled decoder where it is built (both answer
    # the same rows: tests/collector/test_otlp_fast.py).
    if compiled.target(compiled.OTLP_SOURCE).exists():
        assert "OTLP protobuf decoder: compiled" in c.tail()
