"""Kubernetes identity on the agent's spans, end to end: the real agent pointed at a
stand-in API server (tests/agent/k8s_replay.py; ``--k8s-api``, the hidden test option, with
``NODE_NAME`` as the DaemonSet sets it), a traced server placed in a cgroup named as
kubelet's systemd driver and containerd name a pod's container, and the Resource of its
spans over OTLP — the JSONL record carrying the same attributes."""

from __future__ import annotations

import copy
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from parallax_contracts import span_attributes as sa
from parallax_contracts import trace_context
from tests.agent.cgroups import PodCgroup
from tests.agent.helpers import Agent, OtlpReceiver, http_request, wait_log
from tests.agent.k8s_replay import ApiReplay, Json, fixture, pod_list

pytestmark = pytest.mark.ebpf
NODE = "node-e2e-1"


def _pod_list(cg: PodCgroup) -> dict[str, Any]:
    """The fixture list with the Deployment's pod standing for the test's: its uid and
    its "chat" container's id are the cgroup's."""
    lst = pod_list()
    chat = lst["items"][0]
    chat["metadata"]["uid"] = cg.pod_uid
    chat["status"]["containerStatuses"][0]["containerID"] = f"containerd://{cg.container_id}"
    return lst


def _spans(rx: OtlpReceiver, trace_id: str) -> list[tuple[dict[str, Any], Any]]:
    """(resource attributes, span) of each span received in this trace."""
    out = []
    for body in rx.traces():
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
            res = {a.key: a.value.string_value or a.value.int_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                out += [(res, s) for s in ss.spans if s.trace_id.hex() == trace_id]
    return out


@pytest.fixture
def k8s_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[PodCgroup]:
    """NODE_NAME as the DaemonSet sets it (the agent inherits the environment), no
    in-cluster variables, and the pod's cgroup."""
    monkeypatch.setenv("NODE_NAME", NODE)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cg = PodCgroup()
    yield cg
    cg.remove()


def _one_request(port: int) -> str:
    ctx = trace_context.generate()
    head = f"GET /plain?n=10 HTTP/1.1\r\ntraceparent: {ctx.header()}\r\nConnection: close\r\n"
    resp = http_request(port, head.encode() + b"\r\n")
    assert b" 200 " in resp.split(b"\r\n", 1)[0]
    return ctx.trace_id


def _run(
    tmp_path: Path,
    cg: PodCgroup,
    extra: list[str],
    after: str | None = None,
    answered: Callable[[Agent], None] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], Agent]:
    """One request to the server in the pod's cgroup through an agent with ``extra``: (the
    span's resource attributes over OTLP, the JSONL record, the stopped agent). ``after``:
    a line of the agent's log to wait for first; ``answered``: called once the request is
    answered, before its record is waited for."""
    rx = OtlpReceiver()
    srv = cg.server(tmp_path / "t.jsonl")
    try:
        port = srv.port()
        agent = Agent(tmp_path, [port], ["--otlp", rx.url, *extra])
        try:
            if after is not None:
                wait_log(agent, after)
            trace_id = _one_request(port)
            if answered is not None:
                answered(agent)
            [rec] = agent.wait_for(lambda r: r["trace_id"] == trace_id)
        finally:
            assert agent.stop() == 0
        [(res, span)] = _spans(rx, trace_id)
        assert span.kind == span.SPAN_KIND_SERVER
        return res, rec, agent
    finally:
        srv.stop()
        rx.close()


def _same_in_jsonl(res: dict[str, Any], rec: dict[str, Any]) -> None:
    """The JSONL record's ``resource`` is the OTLP Resource less what the record has as
    fields of its own (service, pid, executable) and the SDK's own attributes."""
    own = {
        sa.RESOURCE_SERVICE_NAME: rec["service"],
        sa.RESOURCE_PROCESS_PID: rec["pid"],
        sa.RESOURCE_PROCESS_EXECUTABLE_NAME: rec["comm"],
    }
    # what the OpenTelemetry SDK adds itself: telemetry.sdk.*, service.instance.id
    sdk = {k: v for k, v in res.items() if k not in {a.name for a in sa.RESOURCE}}
    assert all(k.startswith("telemetry.") or k == "service.instance.id" for k in sdk), sdk
    assert res == {**rec["resource"], **own, **sdk}


def test_spans_carry_the_pod_they_were_served_by(tmp_path: Path, k8s_env: PodCgroup) -> None:
    cg = k8s_env
    api = ApiReplay()
    api.lists.append(Json(_pod_list(cg)))
    try:
        res, rec, agent = _run(tmp_path, cg, ["--k8s-api", api.url], "kubernetes: 5 pods")
    finally:
        api.close()
    k8s = {k: v for k, v in res.items() if k.startswith(("k8s.", "container.", "host."))}
    assert k8s == {
        sa.RESOURCE_HOST_NAME: NODE,  # the node, not the agent's (or its pod's) host name
        sa.RESOURCE_K8S_NODE_NAME: NODE,
        sa.RESOURCE_CONTAINER_ID: cg.container_id,
        sa.RESOURCE_K8S_POD_UID: cg.pod_uid,
        sa.RESOURCE_K8S_NAMESPACE_NAME: "shop",
        sa.RESOURCE_K8S_POD_NAME: "chat-7c9d6b5f4-x2x9q",
        sa.RESOURCE_K8S_CONTAINER_NAME: "chat",
        sa.RESOURCE_K8S_REPLICASET_NAME: "chat-7c9d6b5f4",
        sa.RESOURCE_K8S_DEPLOYMENT_NAME: "chat",
    }
    _same_in_jsonl(res, rec)
    # the pods of this node only, listed and then watched
    assert api.of("list")[0]["fieldSelector"] == f"spec.nodeName={NODE}"
    assert api.of("watch")[0]["resourceVersion"] == "48230"
    assert "kubernetes: 5 pods on node node-e2e-1" in agent.err.read_text()


def test_a_request_before_the_first_pod_list_waits_for_it(
    tmp_path: Path, k8s_env: PodCgroup
) -> None:
    """The API answers the first list only once a request has been answered: its record is
    held until the list is in (at most FIRST_LIST_HOLD_S from it), and leaves with its pod's
    names, not the container id alone."""
    cg = k8s_env
    api = ApiReplay()
    gate = threading.Event()
    api.lists.append(Json(_pod_list(cg), gate=gate))

    def answered(agent: Agent) -> None:
        time.sleep(0.5)  # (the record reaches the export stage meanwhile)
        assert "kubernetes: 5 pods" not in agent.err.read_text()
        gate.set()

    try:
        res, rec, _ = _run(tmp_path, cg, ["--k8s-api", api.url], answered=answered)
    finally:
        gate.set()
        api.close()
    assert res[sa.RESOURCE_K8S_POD_NAME] == "chat-7c9d6b5f4-x2x9q", res
    assert res[sa.RESOURCE_K8S_DEPLOYMENT_NAME] == "chat", res
    _same_in_jsonl(res, rec)


def test_without_rbac_spans_keep_the_container_and_pod_uid(
    tmp_path: Path, k8s_env: PodCgroup
) -> None:
    cg = k8s_env
    api = ApiReplay()
    api.lists.append(Json(copy.deepcopy(fixture("forbidden.json")), 403))
    try:
        res, rec, agent = _run(tmp_path, cg, ["--k8s-api", api.url])
        wait_log(agent, "403 Forbidden")
    finally:
        api.close()
    assert {k: v for k, v in res.items() if k.startswith(("k8s.", "container.", "host."))} == {
        sa.RESOURCE_HOST_NAME: NODE,
        sa.RESOURCE_K8S_NODE_NAME: NODE,
        sa.RESOURCE_CONTAINER_ID: cg.container_id,
        sa.RESOURCE_K8S_POD_UID: cg.pod_uid,
    }
    _same_in_jsonl(res, rec)
    assert agent.err.read_text().count("403 Forbidden") == 1  # said once
    assert len(api.requests) == 1


def test_outside_kubernetes_no_pod_and_the_machines_host_name(
    tmp_path: Path, k8s_env: PodCgroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No KUBERNETES_SERVICE_HOST and no --k8s-api: nothing is asked of any API (NODE_NAME
    alone is not Kubernetes), host.name is the machine's; a container id is still one."""
    res, rec, agent = _run(tmp_path, k8s_env, [])
    assert {k: v for k, v in res.items() if k.startswith(("k8s.", "container.", "host."))} == {
        sa.RESOURCE_HOST_NAME: socket.gethostname(),
        sa.RESOURCE_CONTAINER_ID: k8s_env.container_id,
    }
    _same_in_jsonl(res, rec)
    assert "kubernetes" not in agent.err.read_text()
