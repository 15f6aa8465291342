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
def chdb_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The process's one chDB directory (chDB allows one path per process): tests that need
    a store of their own take a database in it."""
    d = tmp_path_factory.mktemp("sla-store")
    client: Any = clickhouse_connect.get_client(dsn=f"chdb://{d / 'chdb'}")
    return client, d


@pytest.fixture(scope="session")
def scenario_store(
    chdb_store: tuple[Any, Path],
) -> Iterator[tuple[Any, Path, dict[str, scenario.RouteData]]]:
    """The scenario's pairs in database ``parallax`` of the shared chDB directory."""
    client, d = chdb_store
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
