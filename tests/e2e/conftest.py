"""A collector shared by the scenarios (each scenario has its own service name), and a
fresh stack per scenario for the app, proxy and agent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.stack import Stack


@pytest.fixture(scope="session")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    d = tmp_path_factory.mktemp("e2e-collector")
    # Evaluate often so a scenario need not wait for the production 15 s interval.
    config = d / "sla.yaml"
    # visible TTFT includes the display: the double rAF that dates a paint adds up to two
    # 60 Hz frames (33 ms), so its band is ±15 ms plus two frames (docs/sla.md).
    config.write_text("interval: 2s\nmetrics:\n  visible_ttft: {band_ms: 50}\n")
    with Stack(d) as stack:
        yield stack.collector(d, env={"PARALLAX_SLA_CONFIG": str(config)})


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with Stack(tmp_path) as s:
        yield s
