"""The node's pods from the Kubernetes API (agent.identity.k8s) and the Resource per process
(agent.identity.resource): the real ``kubernetes`` client against a stand-in API server on loopback
(tests/agent/k8s_replay.py) that answers a pod list, watch streams (ADDED, MODIFIED,
BOOKMARK, DELETED), 410 Gone, 403 Forbidden and a dropped connection. No kernel needed."""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.identity import k8s, procinfo, resource
from agent.identity.containers import ContainerRef
from agent.identity.k8s import Pod, PodCache, PodWatch, pod_from_object
from agent.identity.resource import ResourceStage
from parallax_contracts import span_attributes as sa
from tests.agent.k8s_replay import ApiReplay, Json, Stream, bookmark, event, fixture, pod_list

NODE = "node-a"
CHAT = "2b7e151628aed2a6abf7158809cf4f3c762e7160f38b4da56a784d9045190cfe"
ENVOY = "a0b1c2d3e4f5061728394a5b6c7d8e9fa0b1c2d3e4f5061728394a5b6c7d8e9f"
REDIS = "3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b"
EXPORTER = "4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c"
MIGRATE = "5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d"
APISERVER = "6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e"


def _pod(lst: dict[str, Any], name: str) -> dict[str, Any]:
    return copy.deepcopy(next(p for p in lst["items"] if p["metadata"]["name"] == name))


def _with_rv(obj: dict[str, Any], rv: str) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"]["resourceVersion"] = rv
    return obj


def _until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture
def api() -> Iterator[ApiReplay]:
    a = ApiReplay()
    yield a
    a.close()


def _watch(api: ApiReplay, cache: PodCache | None = None) -> PodWatch:
    def configure() -> Any:
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = api.url
        return cfg

    w = PodWatch(cache or PodCache(), NODE, configure, watch_s=30)
    w.start()
    return w


@contextlib.contextmanager
def _watching(api: ApiReplay) -> Iterator[PodWatch]:
    w = _watch(api)
    try:
        yield w
    finally:
        w.stop()


# -- from the API's objects -------------------------------------------------------------
def test_list_names_every_pod_and_its_workload(api: ApiReplay) -> None:
    api.lists.append(Json(pod_list()))
    with _watching(api) as w:
        assert w.synced.wait(10)
        [lst] = api.of("list")
        # this node's pods only, from the API server's cache (resourceVersion=0)
        assert lst["fieldSelector"] == f"spec.nodeName={NODE}"
        assert lst["resourceVersion"] == "0"
        [watch] = api.wait_requests("watch", 1)
        assert watch["fieldSelector"] == f"spec.nodeName={NODE}"
        assert watch["resourceVersion"] == "48230"  # the list's
        assert watch["allowWatchBookmarks"] == "true"
        c = w.cache
        chat = c.find(CHAT, None)
        assert chat is not None and (chat.namespace, chat.name) == ("shop", "chat-7c9d6b5f4-x2x9q")
        assert dict(chat.workload) == {
            sa.RESOURCE_K8S_REPLICASET_NAME: "chat-7c9d6b5f4",
            sa.RESOURCE_K8S_DEPLOYMENT_NAME: "chat",
        }
        # two containers: each id names its own
        assert chat.container_name(CHAT) == "chat"
        assert chat.container_name(ENVOY) == "envoy"
        assert chat.container_name("f" * 64) is None  # not the pod's only container
        redis = c.find(REDIS, None)
        assert redis is not None
        assert dict(redis.workload) == {sa.RESOURCE_K8S_STATEFULSET_NAME: "redis"}
        exporter = c.find(EXPORTER, None)
        assert exporter is not None
        assert dict(exporter.workload) == {sa.RESOURCE_K8S_DAEMONSET_NAME: "node-exporter"}
        migrate = c.find(MIGRATE, None)
        assert migrate is not None  # a Job of its own: no CronJob is made up for it
        assert dict(migrate.workload) == {sa.RESOURCE_K8S_JOB_NAME: "migrate-db"}
        # the static pod: its owner is the Node (no workload); found by the uid its cgroup
        # path carries (the manifest hash), which is not its API uid
        static = c.find(None, "487a0dc6dccaeefbcfedba7a7ce1ca18")
        assert static is not None and static.name == "kube-apiserver-node-a"
        assert static.workload == ()
        assert c.find(None, "3f0c6a57-1b9e-4d27-9a51-0c5e8e2d7b11") is chat  # by pod uid
        assert c.find("0" * 64, None) is None


def test_cronjob_from_the_job_name_only_when_it_is_a_recent_schedule() -> None:
    obj = fixture("pods.json")["items"][3]
    now = 1_780_000_000.0

    def workload(job: str) -> dict[str, str]:
        o = copy.deepcopy(obj)
        o["metadata"]["ownerReferences"][0]["name"] = job
        pod = pod_from_object(o, now)
        assert pod is not None
        return dict(pod.workload)

    minutes = int(now // 60) - 7  # scheduled seven minutes ago
    assert workload(f"nightly-report-{minutes}") == {
        sa.RESOURCE_K8S_JOB_NAME: f"nightly-report-{minutes}",
        sa.RESOURCE_K8S_CRONJOB_NAME: "nightly-report",
    }
    # a date in the name is no schedule in Unix minutes (20240101 minutes: 2008)
    assert sa.RESOURCE_K8S_CRONJOB_NAME not in workload("backup-20240101")
    assert sa.RESOURCE_K8S_CRONJOB_NAME not in workload(f"job-{minutes + 10 * 24 * 60}")  # future


def test_replicaset_without_a_template_hash_is_no_deployment() -> None:
    obj = _pod(pod_list(), "chat-7c9d6b5f4-x2x9q")
    del obj["metadata"]["labels"]["pod-template-hash"]
    pod = pod_from_object(obj)
    assert pod is not None
    assert dict(pod.workload) == {sa.RESOURCE_K8S_REPLICASET_NAME: "chat-7c9d6b5f4"}


def test_objects_without_identity_are_skipped() -> None:
    assert pod_from_object({"metadata": {"name": "x", "namespace": "y"}}) is None
    assert pod_from_object(["not", "a", "pod"]) is None
    pod = pod_from_object({"metadata": {"name": "x", "namespace": "y", "uid": "u"}})
    assert pod is not None and pod.containers == () and pod.only_container is None


# -- the watch ----------------------------------------------------------------------------
def test_watch_events_change_the_cache_and_resume_from_the_last_version(
    api: ApiReplay,
) -> None:
    lst = pod_list()
    new = _pod(lst, "chat-7c9d6b5f4-x2x9q")
    new["metadata"].update(name="chat-7c9d6b5f4-p8k2d", uid="11111111-2222-4333-8444-555555555555")
    started = "7" * 64
    new["status"]["containerStatuses"] = []  # scheduled, not started: no container ids yet
    running = copy.deepcopy(new)
    running["status"]["containerStatuses"] = [
        {**lst["items"][0]["status"]["containerStatuses"][0], "containerID": f"cri-o://{started}"}
    ]
    redis = _pod(lst, "redis-0")
    api.lists.append(Json(lst))
    api.watches.append(
        Stream(
            [
                event("ADDED", _with_rv(new, "48240")),
                event("MODIFIED", _with_rv(running, "48241")),
                event("DELETED", _with_rv(redis, "48242")),
                bookmark("48300"),
            ],
            gap_s=0.05,
        )
    )
    with _watching(api) as w:
        # the server ended that watch: the next starts from the bookmark's version
        second = api.wait_requests("watch", 2)[1]
        assert second["resourceVersion"] == "48300"
        assert len(api.of("list")) == 1  # no relist
        pod = w.cache.find(started, None)
        assert pod is not None and pod.name == "chat-7c9d6b5f4-p8k2d"
        assert pod.container_name(started) == "chat"
        assert w.cache.find(REDIS, None) is None  # deleted
        assert w.cache.find(None, "6a1f2e3d-4c5b-4a69-8778-96a5b4c3d2e1") is None
        assert w.state == "synced"


def test_410_gone_in_the_stream_relists(api: ApiReplay, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="parallax.agent")
    first = pod_list()
    second = pod_list()
    second["metadata"]["resourceVersion"] = "51900"
    second["items"] = [p for p in second["items"] if p["metadata"]["name"] != "redis-0"]
    api.lists.extend([Json(first), Json(second)])
    api.watches.append(Stream([fixture("watch-expired.json")]))
    with _watching(api) as w:
        api.wait_requests("list", 2)
        watches = api.wait_requests("watch", 2)
        assert [r["resourceVersion"] for r in watches] == ["48230", "51900"]
        _until(lambda: w.cache.find(REDIS, None) is None)  # the relist replaced the cache
        assert w.cache.find(CHAT, None) is not None
        assert w.lists == 2
        assert "410 Gone" in caplog.text


def test_410_status_of_the_watch_request_relists(api: ApiReplay) -> None:
    api.lists.extend([Json(pod_list()), Json(pod_list())])
    gone = {**fixture("watch-expired.json")["object"]}
    api.watches.append(Json(gone, 410))
    with _watching(api) as w:
        api.wait_requests("list", 2)
        api.wait_requests("watch", 2)
        _until(lambda: w.state == "synced")
        assert w.lists == 2


def test_403_degrades_to_container_ids_said_once(
    api: ApiReplay, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="parallax.agent")
    api.lists.append(Json(fixture("forbidden.json"), 403))
    with _watching(api) as w:
        _until(lambda: w.state == "forbidden")
        time.sleep(1.5)  # no tight loop: asked again only after FORBIDDEN_RETRY_S
        assert len(api.requests) == 1 and api.of("watch") == []
        said = [r for r in caplog.records if "403" in r.getMessage()]
        assert len(said) == 1 and said[0].levelno == logging.WARNING
        assert "get, list and watch on pods" in said[0].getMessage()
        # what the records get: the cgroup's container id and pod uid, the node
        ref = ContainerRef(CHAT, "3f0c6a57-1b9e-4d27-9a51-0c5e8e2d7b11")
        stage = ResourceStage(NODE, NODE, w.cache, container_of=lambda pid: ref)
        assert stage.of(4_194_000) == {
            sa.RESOURCE_HOST_NAME: NODE,
            sa.RESOURCE_K8S_NODE_NAME: NODE,
            sa.RESOURCE_CONTAINER_ID: CHAT,
            sa.RESOURCE_K8S_POD_UID: "3f0c6a57-1b9e-4d27-9a51-0c5e8e2d7b11",
        }


def test_a_dropped_watch_reconnects_from_its_version_without_a_relist(
    api: ApiReplay, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="parallax.agent")
    lst = pod_list()
    api.lists.append(Json(lst))
    redis = _pod(lst, "redis-0")
    api.watches.extend(
        [
            Stream([event("DELETED", _with_rv(redis, "48250"))], cut=True),  # connection lost
            Json({"kind": "Status", "code": 500, "reason": "InternalError"}, 500),
            Stream(hold=True),
        ]
    )
    with _watching(api) as w:
        watches = api.wait_requests("watch", 3, timeout=15)
        assert [r["resourceVersion"] for r in watches] == ["48230", "48250", "48250"]
        assert len(api.of("list")) == 1
        assert w.cache.find(CHAT, None) is not None  # the pods known so far are kept
        assert w.cache.find(REDIS, None) is None
        outage = [r for r in caplog.records if "unavailable" in r.getMessage()]
        assert len(outage) == 1  # once per outage, not per attempt


def test_the_cache_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    cache = PodCache(max_pods=2)
    pods = [p for p in (pod_from_object(o) for o in pod_list()["items"]) if p]
    cache.replace(pods)
    assert len(cache) == 2 and cache.dropped == 3
    cache.put(pods[4])  # a new pod beyond the bound: not kept
    assert len(cache) == 2 and cache.find(APISERVER, None) is None
    cache.put(pods[0])  # a known pod's update is
    assert len(cache) == 2
    cache.remove(pods[0].uid)
    cache.put(pods[4])
    assert cache.find(APISERVER, None) is pods[4] and cache.find(CHAT, None) is None
    assert sum("more than 2 pods" in r.getMessage() for r in caplog.records) == 1


def test_stop_ends_a_watch_held_open(api: ApiReplay) -> None:
    api.lists.append(Json(pod_list()))
    w = _watch(api)
    api.wait_requests("watch", 1)
    t = time.monotonic()
    w.stop(timeout=5)
    assert not w._thread.is_alive()
    assert time.monotonic() - t < 3


# -- the Resource per process ---------------------------------------------------------
def _no_threads(monkeypatch: pytest.MonkeyPatch) -> list[PodWatch]:
    """PodWatch.start records the watch instead of starting its thread."""
    started: list[PodWatch] = []

    def start(self: PodWatch) -> None:
        started.append(self)

    monkeypatch.setattr(k8s.PodWatch, "start", start)
    return started


def _pods() -> dict[str, Pod]:
    return {p.name: p for p in (pod_from_object(o) for o in pod_list()["items"]) if p}


def test_records_wait_for_the_first_list_then_never(api: ApiReplay) -> None:
    """At start, records wait for the first pod list (here answered 1 s late) and leave
    with their pods, in their order; once it is in, none waits, even for a pod the cache
    does not know."""
    api.lists.append(Json(pod_list(), delay_s=1.0))
    # pid 4_194_001: a container no pod of the list has
    refs = {4_194_000: ContainerRef(CHAT, None), 4_194_001: ContainerRef("0" * 64, None)}
    with _watching(api) as w:
        stage = ResourceStage(NODE, NODE, w.cache, w, container_of=refs.__getitem__)
        recs = [{"pid": 4_194_000, "n": i} for i in range(3)]
        assert stage.process(recs[:2]) == [] and stage.pending
        assert stage.process(recs[2:]) == [] and not w.synced.is_set()
        _until(lambda: bool(stage.process([])) or not stage.pending)
        assert w.synced.is_set() and not stage.pending
        assert [r["n"] for r in recs] == [0, 1, 2]
        assert all(r["resource"][sa.RESOURCE_K8S_POD_NAME].startswith("chat-") for r in recs)
        unknown = {"pid": 4_194_001}
        assert stage.process([unknown]) == [unknown]  # not held: the list is in
        assert sa.RESOURCE_K8S_POD_NAME not in unknown["resource"]


def test_records_wait_for_the_first_list_at_most_its_bound() -> None:
    """A list that does not come (a watch not started: its first list never in): records
    wait FIRST_LIST_HOLD_S at most (a clock moved past it here), then leave with the
    container id; at the agent's stop, whatever is held."""
    clock = [100.0]
    ref = ContainerRef(CHAT, None)
    w = PodWatch(PodCache(), NODE, lambda: None)
    stage = ResourceStage(
        NODE, NODE, w.cache, w, container_of=lambda pid: ref, clock=lambda: clock[0]
    )
    held = [{"pid": 4_194_000}]
    assert stage.process(held) == [] and stage.flush() == held  # stopping: given up
    assert stage.process([{"pid": 4_194_000}]) == []
    clock[0] += resource.FIRST_LIST_HOLD_S
    [rec] = stage.process([])
    assert rec["resource"][sa.RESOURCE_CONTAINER_ID] == CHAT
    assert sa.RESOURCE_K8S_POD_NAME not in rec["resource"] and not stage.pending
    assert stage.process([{"pid": 4_194_000}]) != []  # (and never again)


def test_resource_attributes_complete_once_the_pod_is_known() -> None:
    """Without a first list to wait for (none here), a record is never held: before the
    watch knows the pod it leaves with the cgroup's part, and the same process's later
    records get the pod once the cache has it."""
    clock = [100.0]
    cache = PodCache()
    ref = ContainerRef(CHAT, "3f0c6a57-1b9e-4d27-9a51-0c5e8e2d7b11")
    stage = ResourceStage(NODE, NODE, cache, container_of=lambda pid: ref, clock=lambda: clock[0])
    pid = 4_194_001  # no such process: its start time is None, the same each time
    before = stage.of(pid)
    assert sa.RESOURCE_K8S_POD_NAME not in before
    assert before[sa.RESOURCE_CONTAINER_ID] == CHAT
    cache.replace(list(_pods().values()))
    assert stage.of(pid) is before  # cached for PID_CHECK_S
    clock[0] += resource.PID_CHECK_S
    after = stage.of(pid)
    assert after == {
        sa.RESOURCE_HOST_NAME: NODE,
        sa.RESOURCE_K8S_NODE_NAME: NODE,
        sa.RESOURCE_CONTAINER_ID: CHAT,
        sa.RESOURCE_K8S_POD_UID: "3f0c6a57-1b9e-4d27-9a51-0c5e8e2d7b11",
        sa.RESOURCE_K8S_NAMESPACE_NAME: "shop",
        sa.RESOURCE_K8S_POD_NAME: "chat-7c9d6b5f4-x2x9q",
        sa.RESOURCE_K8S_CONTAINER_NAME: "chat",
        sa.RESOURCE_K8S_REPLICASET_NAME: "chat-7c9d6b5f4",
        sa.RESOURCE_K8S_DEPLOYMENT_NAME: "chat",
    }
    clock[0] += resource.PID_CHECK_S
    assert stage.of(pid) is after  # complete: not looked up again
    recs = stage.process([{"pid": pid}, {"pid": pid}])
    assert recs[0]["resource"] is after and recs[1]["resource"] is after


def test_static_pod_gets_its_api_uid() -> None:
    cache = PodCache()
    cache.replace(list(_pods().values()))
    ref = ContainerRef(APISERVER, "487a0dc6dccaeefbcfedba7a7ce1ca18")
    attrs = ResourceStage(NODE, NODE, cache, container_of=lambda pid: ref).of(4_194_002)
    assert attrs[sa.RESOURCE_K8S_POD_UID] == "7b2c9e41-0d5f-4a8e-b3c6-2f1e0d9c8b7a"
    assert attrs[sa.RESOURCE_K8S_CONTAINER_NAME] == "kube-apiserver"


def test_a_reused_pid_is_resolved_again(monkeypatch: pytest.MonkeyPatch) -> None:
    starts = {7: 100}
    monkeypatch.setattr(procinfo, "start_time", starts.get)
    refs = {100: ContainerRef("a" * 64, None), 200: None}
    clock = [0.0]
    stage = ResourceStage("box", container_of=lambda pid: refs[starts[pid]], clock=lambda: clock[0])
    assert stage.of(7) == {sa.RESOURCE_HOST_NAME: "box", sa.RESOURCE_CONTAINER_ID: "a" * 64}
    starts[7] = 200  # the pid now names a process outside any container
    clock[0] += resource.PID_CHECK_S
    assert stage.of(7) == {sa.RESOURCE_HOST_NAME: "box"}


def test_outside_kubernetes_no_api_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    started = _no_threads(monkeypatch)
    stage = resource.start(None, env={"NODE_NAME": "ignored-outside-kubernetes"})
    assert stage.watch is None and stage.node is None and started == []
    import socket

    assert stage.host == socket.gethostname()
    ref = ContainerRef("c" * 64, "11111111-2222-3333-4444-555555555555")
    stage = ResourceStage(stage.host, container_of=lambda pid: ref)
    # a container id is a container id anywhere; a pod uid only means something with an API
    assert stage.of(1) == {
        sa.RESOURCE_HOST_NAME: socket.gethostname(),
        sa.RESOURCE_CONTAINER_ID: "c" * 64,
    }


def test_in_a_pod_the_node_is_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    started = _no_threads(monkeypatch)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    # no NODE_NAME: no node to select pods by
    stage = resource.start(None, env=env)
    assert stage.node is None and started == []
    stage = resource.start("http://127.0.0.1:9", env={**env, "NODE_NAME": NODE})
    assert (stage.host, stage.node) == (NODE, NODE)
    assert len(started) == 1 and started[0].node == NODE


def test_resource_attribute_table_is_current() -> None:
    from parallax_contracts import CONTRACTS_DIR

    doc = (CONTRACTS_DIR / "span-attributes.md").read_text()
    assert sa.resource_table() in doc, (
        "docs/contracts/span-attributes.md is stale: regenerate its tables with "
        "python -m parallax_contracts.span_attributes"
    )
    # every name the agent sets is in the contract
    stage_names = {
        sa.RESOURCE_HOST_NAME,
        sa.RESOURCE_CONTAINER_ID,
        *(v for k, v in vars(sa).items() if k.startswith("RESOURCE_K8S_")),
    }
    assert stage_names <= {a.name for a in sa.RESOURCE}


def test_in_cluster_configuration_uses_the_service_account(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """In a pod the client is configured from KUBERNETES_SERVICE_HOST/PORT and the mounted
    token and CA (their paths moved here to files of the test's)."""
    from kubernetes.config import incluster_config

    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.e30.c2ln")
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    cfg = resource._configuration(None)
    assert cfg.host == "https://10.96.0.1:443"
    assert cfg.ssl_ca_cert == str(ca)
    assert cfg.get_api_key_with_prefix("BearerToken").endswith("eyJhbGciOiJSUzI1NiJ9.e30.c2ln")
    # a test's URL instead: plain, no credentials
    cfg = resource._configuration("http://127.0.0.1:8001/")
    assert cfg.host == "http://127.0.0.1:8001" and not cfg.api_key


def test_a_watch_refused_where_the_list_is_allowed_relists_on_the_retry_period(
    api: ApiReplay, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RBAC with list but not watch: the list's pods are used, refreshed every
    FORBIDDEN_RETRY_S (shortened here), and the 403 is said once, not once per retry."""
    caplog.set_level(logging.INFO, logger="parallax.agent")
    monkeypatch.setattr(k8s, "FORBIDDEN_RETRY_S", 1.0)
    later = pod_list()
    later["items"] = later["items"][:1]
    api.lists.extend([Json(pod_list()), Json(later)])
    forbidden = Json(fixture("forbidden.json"), 403)
    api.watches.extend([forbidden] * 5)
    with _watching(api) as w:
        api.wait_requests("watch", 3)
        assert len(api.of("list")) >= 3  # a list before each watch
        assert w.cache.find(CHAT, None) is not None  # the list's pods are used
        assert w.cache.find(REDIS, None) is None  # and refreshed
        assert w.state == "forbidden"
    said = [r for r in caplog.records if "403" in r.getMessage()]
    assert len(said) == 1
    assert not any("readable now" in r.getMessage() for r in caplog.records)


def test_rbac_granted_later_is_found_and_said(
    api: ApiReplay, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="parallax.agent")
    monkeypatch.setattr(k8s, "FORBIDDEN_RETRY_S", 0.3)
    api.lists.extend([Json(fixture("forbidden.json"), 403), Json(pod_list())])
    with _watching(api) as w:
        api.wait_requests("watch", 1)
        _until(lambda: w.state == "synced")
        assert w.cache.find(CHAT, None) is not None
    assert sum("readable now" in r.getMessage() for r in caplog.records) == 1
