"""The deployment files are valid and agree with the code they deploy. deploy/k8s/parallax.yaml
is the Helm chart's default render (tests/test_helm.py holds the two equal); the chart
itself, its values and its schema are tested in tests/test_helm.py, the systemd units in
tests/test_systemd.py."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from agent import cli as agent_cli
from collector import cli as collector_cli
from collector.sla import config as sla_config

ROOT = Path(__file__).resolve().parent.parent
K8S = sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))
DOCKERFILES = sorted((ROOT / "deploy" / "docker").glob("*.Dockerfile"))
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas.
K8S_VERSIONS = ["1.30.0", "1.37.0"]
# the last for servers under another uid (tests/agent/test_privilege.py, docs/deploy.md)
AGENT_CAPABILITIES = ["BPF", "PERFMON", "SYS_PTRACE", "SYS_RESOURCE", "DAC_READ_SEARCH"]


def _docs() -> list[dict[str, Any]]:
    out = []
    for f in K8S:
        out += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return out


def _containers(kind: str) -> list[dict[str, Any]]:
    return [
        c for d in _docs() if d["kind"] == kind for c in d["spec"]["template"]["spec"]["containers"]
    ]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_validate_strictly(version: str) -> None:
    docs = _docs()
    assert {d["kind"] for d in docs} >= {"DaemonSet", "Deployment", "Service", "ConfigMap"}
    for d in docs:
        kubernetes_validate.validate(d, version, strict=True)


def assert_least_privilege(agent: dict[str, Any]) -> None:
    """The agent container: not privileged, every capability dropped but the four named in
    docs/agent.md (no SYS_ADMIN), no escalation, tracefs read-only, every host path too."""
    sc = agent["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": AGENT_CAPABILITIES}
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    assert mounts["/sys/kernel/tracing"]["readOnly"] is True
    assert all(mounts[p]["readOnly"] for p in ("/lib/modules", "/usr/src"))


def test_agent_runs_with_least_privilege() -> None:
    (ds,) = [d for d in _docs() if d["kind"] == "DaemonSet"]
    assert ds["spec"]["template"]["spec"]["hostPID"] is True
    (agent,) = _containers("DaemonSet")
    assert_least_privilege(agent)


def test_container_args_parse_with_the_real_clis() -> None:
    (agent,) = _containers("DaemonSet")
    agent_cli._parser().parse_args(agent["args"])
    for c in _containers("Deployment"):
        collector_cli._parser().parse_args(c["args"])


def test_sla_configmap_loads(tmp_path: Path) -> None:
    (cm,) = [
        d for d in _docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "parallax-sla"
    ]
    f = tmp_path / "sla.yaml"
    f.write_text(cm["data"]["sla.yaml"])
    cfg = sla_config.load(f)
    # what the ConfigMap is for: visible TTFT's band includes the display (docs/sla.md)
    assert cfg.thresholds("any", "/any", "visible_ttft").band_ms == 50
    assert cfg.thresholds("any", "/any", "ttfb").band_ms == 15


def test_dockerfiles_copy_what_exists_and_start_a_real_entry_point() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert DOCKERFILES
    for f in DOCKERFILES:
        text = f.read_text()
        for src in re.findall(r"^COPY (.+) \S+$", text, re.M):
            for s in src.split():
                assert (ROOT / s).exists(), f"{f.name}: COPY {s} does not exist"
        (entry,) = re.findall(r'^ENTRYPOINT \["([^"]+)"\]', text, re.M)
        assert entry in scripts, entry


def test_images_take_the_runtime_dependencies_only() -> None:
    """The lock pins the test tools too (helm's half-gigabyte carrier, Playwright): the
    images install the project with the lock as constraints, which leaves them out."""
    for f in DOCKERFILES:
        text = f.read_text()
        assert re.search(r"pip install --no-cache-dir -c requirements\.lock \.", text), f.name
        assert "-r requirements.lock" not in text, f.name
