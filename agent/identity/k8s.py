"""The pods of this node, from the Kubernetes API: who a container is.

A :class:`PodWatch` thread lists the node's pods (field selector ``spec.nodeName=<node>``)
and then watches them, with the official ``kubernetes`` client (imported in that thread,
only in Kubernetes: start-up and ``--help`` stay fast). It keeps a :class:`PodCache` of small
:class:`Pod` records — names, workload, container ids — bounded at ``max_pods``, never the
API objects.

* The watch resumes from the last ``resourceVersion`` it saw (events and bookmarks); the
  server ends each watch after ``watch_s`` and it is opened again from there. ``410 Gone``
  (an ERROR event or the status of the request: the version is too old) relists.
* A connection error, a 5xx, or a stream cut short: the watch is opened again from the
  last version after a backoff (1 s doubling to 30 s, ±20 %); the pods known so far stay
  (said once per outage, and once when it is back).
* ``403 Forbidden`` (the RBAC is missing): said once; records keep what the cgroup gives
  (container id, pod uid); listed again quietly every FORBIDDEN_RETRY_S (where the list is
  allowed and the watch is not, the pods are refreshed that often). ``410`` relists at
  most once a second.

Workload, from the pod's controller owner reference (no RBAC beyond pods is needed):
ReplicaSet → ``k8s.replicaset.name`` and, when its name ends with ``-<pod-template-hash>``
(the pod's label, which the Deployment controller sets), ``k8s.deployment.name``;
StatefulSet, DaemonSet, Job → their name; a Job named ``<cronjob>-<minutes>`` (the CronJob
controller's naming: its scheduled time in Unix minutes) that time being within the last
CRONJOB_WINDOW_S → ``k8s.cronjob.name`` (reading the Job's own owner would need get on
jobs, which the chart does not grant).
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from parallax_contracts import span_attributes as sa

log = logging.getLogger("parallax.agent")

MAX_PODS = 2048  # kubelet's default is 110 pods per node; large nodes run a few hundred
WATCH_S = 300  # the server ends a watch after this (then it is reopened from its version)
CONNECT_S = 10.0
LIST_S = 60.0
MAX_BACKOFF_S = 30.0
FORBIDDEN_RETRY_S = 300.0  # RBAC granted after the agent started is found within this
MIN_WATCH_GAP_S = 1.0  # a watch the server ends at once is not reopened in a tight loop
CRONJOB_WINDOW_S = 400 * 86400
_CRON_SUFFIX = re.compile(r"(.+)-([0-9]{8,10})")
_RUNTIME_ID = re.compile(r"[a-z-]+://([0-9a-f]{64})")  # containerd://, cri-o://, docker://
_MIRROR = "kubernetes.io/config.mirror"  # a static pod's mirror: its uid on the node


@dataclass(frozen=True, slots=True)
class Pod:
    uid: str
    namespace: str
    name: str
    workload: tuple[tuple[str, str], ...]  # (resource attribute, value): replicaset, …
    containers: tuple[tuple[str, str], ...]  # (container id, container name)
    only_container: str | None  # the name when the spec has one container and nothing else
    node_uid: str | None  # a static pod: the uid its cgroup path carries (the manifest hash)

    def container_name(self, container_id: str | None) -> str | None:
        for cid, name in self.containers:
            if cid == container_id:
                return name
        return self.only_container


def _workload(meta: dict[str, Any], now_s: float) -> tuple[tuple[str, str], ...]:
    owners = meta.get("ownerReferences") or []
    owner = next((o for o in owners if o.get("controller")), owners[0] if owners else None)
    if not isinstance(owner, dict):
        return ()
    kind, name = owner.get("kind"), owner.get("name")
    if not isinstance(name, str) or not name:
        return ()
    if kind == "ReplicaSet":
        out = [(sa.RESOURCE_K8S_REPLICASET_NAME, name)]
        h = (meta.get("labels") or {}).get("pod-template-hash")
        if isinstance(h, str) and h and name.endswith("-" + h) and len(name) > len(h) + 1:
            out.append((sa.RESOURCE_K8S_DEPLOYMENT_NAME, name[: -len(h) - 1]))
        return tuple(out)
    if kind == "Job":
        out = [(sa.RESOURCE_K8S_JOB_NAME, name)]
        m = _CRON_SUFFIX.fullmatch(name)
        if m and 0 <= now_s - int(m[2]) * 60 <= CRONJOB_WINDOW_S:
            out.append((sa.RESOURCE_K8S_CRONJOB_NAME, m[1]))
        return tuple(out)
    attr = {
        "StatefulSet": sa.RESOURCE_K8S_STATEFULSET_NAME,
        "DaemonSet": sa.RESOURCE_K8S_DAEMONSET_NAME,
    }.get(str(kind))
    return ((attr, name),) if attr else ()


def pod_from_object(obj: Any, now_s: float | None = None) -> Pod | None:
    """A Pod from a pod object of the API (JSON), None when it lacks a uid or a name."""
    if not isinstance(obj, dict):
        return None
    meta = obj.get("metadata") or {}
    uid, name, ns = meta.get("uid"), meta.get("name"), meta.get("namespace")
    if not (isinstance(uid, str) and isinstance(name, str) and isinstance(ns, str)):
        return None
    status = obj.get("status") or {}
    containers: list[tuple[str, str]] = []
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for st in status.get(key) or ():
            m = _RUNTIME_ID.fullmatch(str(st.get("containerID") or ""))
            if m and isinstance(st.get("name"), str):
                containers.append((m[1], st["name"]))
    spec = obj.get("spec") or {}
    regular = spec.get("containers") or []
    only = None
    if len(regular) == 1 and not spec.get("initContainers") and not spec.get("ephemeralContainers"):
        only = regular[0].get("name") if isinstance(regular[0].get("name"), str) else None
    mirror = (meta.get("annotations") or {}).get(_MIRROR)
    return Pod(
        uid=uid,
        namespace=ns,
        name=name,
        workload=_workload(meta, time.time() if now_s is None else now_s),
        containers=tuple(containers),
        only_container=only,
        node_uid=mirror if isinstance(mirror, str) and mirror else None,
    )


class PodCache:
    """The node's pods by uid and by container id. Written by the watch thread, read by
    the exporter thread; ``generation`` changes with every write (readers holding an
    incomplete answer look again only then)."""

    def __init__(self, max_pods: int = MAX_PODS) -> None:
        self.max_pods = max_pods
        self.generation = 0
        self.dropped = 0  # pods not kept: beyond max_pods
        self._lock = threading.Lock()
        self._pods: dict[str, Pod] = {}
        self._by_container: dict[str, Pod] = {}
        self._by_node_uid: dict[str, Pod] = {}
        self._full_said = False

    def __len__(self) -> int:
        return len(self._pods)

    def _index(self, pod: Pod) -> None:
        for cid, _ in pod.containers:
            self._by_container[cid] = pod
        if pod.node_uid:
            self._by_node_uid[pod.node_uid] = pod

    def _unindex(self, pod: Pod) -> None:
        for cid, _ in pod.containers:
            if self._by_container.get(cid) is pod:
                del self._by_container[cid]
        if pod.node_uid and self._by_node_uid.get(pod.node_uid) is pod:
            del self._by_node_uid[pod.node_uid]

    def _put(self, pod: Pod) -> None:
        old = self._pods.get(pod.uid)
        if old is None and len(self._pods) >= self.max_pods:
            self.dropped += 1
            if not self._full_said:
                self._full_said = True
                log.warning(
                    "kubernetes: more than %d pods on this node: the rest unnamed", self.max_pods
                )
            return
        if old is not None:
            self._unindex(old)
        self._pods[pod.uid] = pod
        self._index(pod)

    def put(self, pod: Pod) -> None:
        with self._lock:
            self._put(pod)
            self.generation += 1

    def remove(self, uid: str) -> None:
        with self._lock:
            old = self._pods.pop(uid, None)
            if old is not None:
                self._unindex(old)
            self.generation += 1

    def replace(self, pods: list[Pod]) -> None:
        """A (re)list: exactly these pods."""
        with self._lock:
            self._pods, self._by_container, self._by_node_uid = {}, {}, {}
            for p in pods:
                self._put(p)
            self.generation += 1

    def find(self, container_id: str | None, pod_uid: str | None) -> Pod | None:
        with self._lock:
            pod = self._by_container.get(container_id) if container_id else None
            if pod is None and pod_uid:
                pod = self._pods.get(pod_uid) or self._by_node_uid.get(pod_uid)
            return pod


class PodWatch:
    """The list-and-watch thread. ``configure`` builds the client's Configuration (in the
    thread: it imports the client); ``state`` is one of starting, synced (listed, watch
    open), forbidden, unavailable."""

    def __init__(
        self,
        cache: PodCache,
        node: str,
        configure: Callable[[], Any],
        watch_s: int = WATCH_S,
    ) -> None:
        self.cache, self.node, self._configure, self.watch_s = cache, node, configure, watch_s
        self.state = "starting"
        self.lists = 0  # list calls that succeeded (the first, then each relist)
        self.rv: str | None = None  # the version to watch from; None: list first
        self.synced = threading.Event()  # the first list is in the cache
        self._stop = threading.Event()
        self._resp: Any = None
        self._forbidden_said = False
        self._outage_since: float | None = None
        self._listed_at = float("-inf")
        self._thread = threading.Thread(target=self._run, name="k8s-pods", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            # unblocks the watch's read (urllib3 ≥ 2.3); already closed: nothing to unblock
            with contextlib.suppress(Exception):
                resp.shutdown()
        self._thread.join(timeout)

    # -- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            from kubernetes import client  # noqa: PLC0415  (only in Kubernetes; ~0.4 s)
            from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

            api = client.CoreV1Api(client.ApiClient(self._configure()))
        except Exception as e:  # noqa: BLE001  (no client, no config: container ids only)
            self.state = "unavailable"
            log.warning("kubernetes: no API client (%s): spans carry container ids only", e)
            return
        failures = 0
        while not self._stop.is_set():
            wait = 0.0
            try:
                if self.rv is None:
                    self.rv = self._list(api)
                started = time.monotonic()
                events = self._watch(api, self.rv)
                failures = 0
                self._back()
                if not events and time.monotonic() - started < MIN_WATCH_GAP_S:
                    wait = MIN_WATCH_GAP_S
            except ApiException as e:
                if e.status == 410:  # (an ERROR event of the stream, or the request's status)
                    log.info("kubernetes: pod watch expired (410 Gone): listing again")
                    self.rv = None
                    # at most one list a second, should the API keep answering 410
                    wait = max(0.0, MIN_WATCH_GAP_S - (time.monotonic() - self._listed_at))
                elif e.status == 403:
                    self._forbidden()
                    # list again then (a watch refused where a list is allowed: the pods
                    # refreshed that often)
                    self.rv = None
                    wait = FORBIDDEN_RETRY_S
                else:
                    failures += 1
                    wait = self._unavailable(f"HTTP {e.status}", failures)
            except Exception as e:  # noqa: BLE001  (connection, protocol, bad JSON: retried)
                if self._stop.is_set():  # stop() cut the watch
                    return
                failures += 1
                wait = self._unavailable(type(e).__name__, failures)
            if wait:
                self._stop.wait(wait)

    def _selector(self) -> str:
        return f"spec.nodeName={self.node}"

    def _list(self, api: Any) -> str:
        # resourceVersion=0: served from the API server's watch cache, not etcd (every
        # node's agent lists at once when the DaemonSet rolls out)
        resp = api.list_pod_for_all_namespaces(
            field_selector=self._selector(),
            resource_version="0",
            _preload_content=False,
            _request_timeout=(CONNECT_S, LIST_S),
        )
        try:
            body = json.loads(resp.data)
        finally:
            resp.release_conn()
        now = time.time()
        pods = [p for p in (pod_from_object(o, now) for o in body.get("items") or ()) if p]
        self.cache.replace(pods)
        self.lists += 1
        self._listed_at = time.monotonic()
        if not self.synced.is_set():
            log.info("kubernetes: %d pods on node %s", len(pods), self.node)
        self.synced.set()
        return str((body.get("metadata") or {}).get("resourceVersion") or "0")

    def _watch(self, api: Any, rv: str) -> int:
        """One watch from ``rv`` until the server ends it (or it fails: the events taken
        so far count, ``self.rv`` follows them); how many events came."""
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415
        from kubernetes.watch.watch import iter_resp_lines  # noqa: PLC0415

        resp = api.list_pod_for_all_namespaces(
            field_selector=self._selector(),
            resource_version=rv,
            watch=True,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_s,
            _preload_content=False,
            _request_timeout=(CONNECT_S, self.watch_s + 30),
        )
        self._resp = resp
        self.state = "synced"  # listed, and the watch is open
        if self._forbidden_said:  # listed and watched: the RBAC is there now
            self._forbidden_said = False
            log.info("kubernetes: the pods of node %s are readable now", self.node)
        n = 0
        try:
            if self._stop.is_set():  # stop() came before _resp was set: it could not cut it
                return n
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if not line:
                    continue
                ev = json.loads(line)
                kind, obj = ev.get("type"), ev.get("object") or {}
                if kind == "ERROR":  # a Status: 410 when the version is too old
                    raise ApiException(status=obj.get("code"), reason=obj.get("reason"))
                n += 1
                self.rv = str((obj.get("metadata") or {}).get("resourceVersion") or self.rv)
                if kind in ("ADDED", "MODIFIED"):
                    pod = pod_from_object(obj)
                    if pod is not None:
                        self.cache.put(pod)
                elif kind == "DELETED":
                    uid = (obj.get("metadata") or {}).get("uid")
                    if isinstance(uid, str):
                        self.cache.remove(uid)
                if self._stop.is_set():
                    break
        finally:
            self._resp = None
            resp.release_conn()
        return n

    # -- what is said -------------------------------------------------------------------
    def _forbidden(self) -> None:
        self.state = "forbidden"
        if not self._forbidden_said:
            self._forbidden_said = True
            log.warning(
                "kubernetes: the API refused to list or watch the pods of node %s (403 Forbidden:"
                " the agent's service account needs get, list and watch on pods): spans"
                " carry container ids and pod uids only",
                self.node,
            )

    def _unavailable(self, why: str, failures: int) -> float:
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            log.warning(
                "kubernetes: pod watch unavailable (%s): retrying; the %d pods known so far"
                " are kept",
                why,
                len(self.cache),
            )
        self.state = "unavailable"
        return min(MAX_BACKOFF_S, 2.0 ** (failures - 1)) * random.uniform(0.8, 1.2)  # noqa: S311

    def _back(self) -> None:
        if self._outage_since is not None:
            log.info(
                "kubernetes: pod watch back after %.0f s",
                time.monotonic() - self._outage_since,
            )
            self._outage_since = None
        self.state = "synced"
