"""A running collector (real subprocess, real chDB in a tmp dir) shared by a test module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.collector.helpers import Running, start_collector


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    base: Path = tmp_path_factory.mktemp("collector")
    c = start_collector(base / "data", "--pairing-lookback", "3600")
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop()
