"""Fixtures for the SLA checker's tests: a real chDB store with generated pairs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import clickhouse_connect
import pytest

from collector.sla.source import SlaSource
from collector.store import schema as store_schema
from tests.sla import gpu_timeline, scenario

DB = "parallax"


@pytest.fixture(scope="session")
def scenario_store(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Any, Path, dict[str, scenario.RouteData]]]:
    """One chDB directory with the scenario's pairs (shared: chDB allows one path per process)."""
    d = tmp_path_factory.mktemp("sla-store")
    client: Any = clickhouse_connect.get_client(dsn=f"chdb://{d / 'chdb'}")
    store_schema.migrate(client, DB)
    data = scenario.build()
    scenario.write(client, DB, data)
    gpu_timeline.write(client, DB, [scenario.gpu_timeline()])
    scenario.write_sampled(client, DB)
    yield client, d, data


@pytest.fixture(scope="session")
def source(scenario_store: tuple[Any, Path, dict[str, scenario.RouteData]]) -> SlaSource:
    client = scenario_store[0]
    s = SlaSource(lambda: client, DB)
    s.ensure_schema()
    return s
