"""The real Prometheus tools for the tests: `promtool` and Alertmanager, from Debian's
`prometheus` and `prometheus-alertmanager` packages, which `make setup` (scripts/setup.sh)
installs. Looked for where those packages put them, not on PATH, so a stray build cannot
stand in for the version the docs name (Prometheus 2.42, Alertmanager 0.25 on Debian 12).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from demo.stack import free_port

BIN = Path("/usr/bin")
PACKAGES = {"promtool": "prometheus", "prometheus-alertmanager": "prometheus-alertmanager"}


class ToolMissingError(RuntimeError):
    """A binary `make setup` installs is not there; the message names its package."""


def tool(name: str) -> Path:
    path = BIN / name
    if not path.is_file():
        raise ToolMissingError(
            f"{path} is missing: Debian's {PACKAGES[name]} package provides it "
            "(`make setup` installs it)"
        )
    return path


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(tool("promtool")), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@dataclass
class Alertmanager:
    """A real Alertmanager on a loopback port: its own storage directory, no cluster
    (`--cluster.listen-address=` empty), its config written from ``config``."""

    workdir: Path
    config: dict[str, Any]
    url: str = ""
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)

    def start(self, timeout_s: float = 20.0) -> Alertmanager:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "alertmanager.yml"
        cfg.write_text(json.dumps(self.config))  # YAML is a superset of JSON
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = self.workdir / "alertmanager.log"
        with self.log.open("ab") as f:
            self.proc = subprocess.Popen(
                [
                    str(tool("prometheus-alertmanager")),
                    f"--config.file={cfg}",
                    f"--storage.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--cluster.listen-address=",
                    "--log.level=warn",
                ],
                stdout=f,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"alertmanager exited {self.proc.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"alertmanager not ready in {timeout_s}s: {self.tail()}")

    def alerts(self) -> list[dict[str, Any]]:
        """What Alertmanager shows: its active alerts (v2 API; resolved ones are not)."""
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=5) as r:
            out: list[dict[str, Any]] = json.loads(r.read())
            return out

    def tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def populate(registry: CollectorRegistry) -> CollectorRegistry:
    """One sample in every series of ``registry`` (labelled ones included, whose families
    show no sample until a label set is used), so a lint sees every name and label."""
    from agent.metrics import KernelCounter, RequestCounts

    for c in list(registry._collector_to_names):  # no public API lists the collectors
        if isinstance(c, KernelCounter):
            (c.labels(*["1"] * len(c.series.labels)) if c.series.labels else c).set(3)
        elif isinstance(c, RequestCounts):
            c.per_label = {"8000": (10, 5, [1] * 32, 1000)}
        elif isinstance(c, Counter | Gauge | Histogram):
            names = c._labelnames
            child = c.labels(*["1"] * len(names)) if names else c
            if isinstance(child, Counter):
                child.inc()
            elif isinstance(child, Gauge):
                child.set(1)
            else:
                child.observe(0.1)
    return registry


def exposition(registry: CollectorRegistry) -> str:
    """The text a /metrics serves (the agent's and the collector's both use this format)."""
    return generate_latest(registry).decode()


def exposed() -> dict[str, set[str]]:
    """Sample name → label names, from the real registries of the agent, the collector and
    the SLA checker (what their /metrics serve)."""
    from agent.metrics import Metrics as AgentMetrics
    from collector.metrics import Metrics as CollectorMetrics
    from collector.sla.metrics import SlaMetrics

    regs: list[CollectorRegistry] = [AgentMetrics().registry]
    c = CollectorMetrics()
    SlaMetrics(c.registry)
    regs.append(c.registry)
    out: dict[str, set[str]] = {}
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count")}
    for reg in regs:
        for collector, names in reg._collector_to_names.items():
            labels = set(getattr(collector, "_labelnames", ()))
            for n in names:
                out[n] = labels | ({"le"} if n.endswith("_bucket") else set())
        # custom collectors (the agent's per-port request counts) name theirs when collected
        for fam in reg.collect():
            labels = set(getattr(fam, "_labelnames", ()))
            for n in (fam.name, *(fam.name + x for x in suffixes.get(fam.type, ()))):
                out.setdefault(n, labels | ({"le"} if n.endswith("_bucket") else set()))
    return out
