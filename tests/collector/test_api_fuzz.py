"""Schemathesis against the query app's own OpenAPI, over real HTTP: no 5xx, no hang."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from tests.collector.helpers import Running

EXAMPLES_PER_OPERATION = 40


def test_query_api_fuzz(collector: Running) -> None:
    schema = schemathesis.openapi.from_url(f"{collector.query}/openapi.json")
    ran, failed = [], {}
    for result in schema.get_all_operations():
        op = result.ok()  # type: ignore[union-attr]  # an Err raises: schema must be valid

        @given(case=op.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any) -> None:
            case.call_and_validate(checks=[not_a_server_error], timeout=15)

        try:
            check()
        except Exception as e:  # noqa: BLE001 — collect per operation, report all at once
            failed[op.label] = str(e).splitlines()[0]
        ran.append(op.label)
    assert not failed, failed
    assert {"GET /v1/requests", "GET /v1/requests/{trace_id}", "GET /readyz"} <= set(ran)
