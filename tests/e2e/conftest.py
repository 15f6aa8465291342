"""A collector shared by the scenarios (each scenario has its own service name), one agent
shared by a module's scenarios (on ports reserved for their servers), and a fresh stack per
scenario for the app and proxy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.stack import Stack, free_port
from tests.e2e.harness import AGENT_ARGS, TracedPorts

# Server ports a module's scenarios may take from the shared agent (an app each, and nginx
# in front of some): more than they use.
SCENARIO_PORTS = 24


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


@pytest.fixture(scope="module")
def traced(
    collector: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TracedPorts]:
    """The agent the module's scenarios share, started on ports nothing listens on yet."""
    d = tmp_path_factory.mktemp("e2e-agent")
    ports: set[int] = set()
    while len(ports) < SCENARIO_PORTS:  # (free_port may name one twice: none is bound yet)
        ports.add(free_port())
    with Stack(d) as stack:
        stack.agent(sorted(ports), collector[0], *AGENT_ARGS)
        yield TracedPorts(sorted(ports), d / "agent.jsonl")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with Stack(tmp_path) as s:
        yield s
