"""Who served a request beyond its pid: the host (in Kubernetes, the node), the process's
container, and its pod — the OpenTelemetry Resource of each record.

:class:`ResourceStage` is an export stage (agent.export.outputs.Processor): it sets each record's
``resource`` field, a dict of resource attributes by their semantic-convention names
(parallax_contracts.span_attributes ``RESOURCE_*``): ``host.name`` always; ``container.id``
where the process's cgroup names a container (agent.identity.containers); in Kubernetes
``k8s.node.name``, ``k8s.pod.uid`` (the cgroup's, or the API's) and, once the pod watch
(agent.identity.k8s) knows the pod, its namespace, name, container name and workload. The JSONL
line carries that dict as it is and the OTLP exporter adds it to the process's Resource, so
the two outputs agree. Records wait for the API only at the agent's start, until the first
pod list is in (at most FIRST_LIST_HOLD_S): the agent attaches in a second or two, the list
can take longer, and a rollout's first requests would otherwise leave without their pods'
names. After that a record is never held: one whose pod is not known yet (started a moment
ago) leaves with what the cgroup gives, and the process's later records get the rest once
the watch has it.

In Kubernetes means: ``KUBERNETES_SERVICE_HOST`` is set (in every pod) — the in-cluster
configuration (service-account token, CA) reaches the API — or the hidden ``--k8s-api URL``
(tests: a plain-HTTP server standing in for the API). The node is ``NODE_NAME`` (the
DaemonSet sets it from the downward API). Elsewhere nothing is asked of any API and
``host.name`` is the machine's name.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from agent.identity import containers, k8s, procinfo
from parallax_contracts import span_attributes as sa

log = logging.getLogger("parallax.agent")
PID_CHECK_S = 1.0  # a cached pid's start time is checked (reuse) at most this often
MAX_PIDS = 10000
# At start, records wait for the first pod list at most this long from the first of them
# (the list starts before the compile, which can take longer), and at most this many
# (beyond, the oldest leave with what is known)
FIRST_LIST_HOLD_S = 5.0
FIRST_LIST_HOLD_MAX = 20000
_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105  (a path)


class ResourceStage:
    """Resource attributes per pid, cached (a pid's start time is checked at most every
    PID_CHECK_S; an answer missing the pod is looked at again when the pod cache
    changed). With a pod watch, records are held from the start until its first list
    (FIRST_LIST_HOLD_S at most)."""

    def __init__(
        self,
        host: str,
        node: str | None = None,
        pods: k8s.PodCache | None = None,
        watch: k8s.PodWatch | None = None,
        container_of: Callable[[int], containers.ContainerRef | None] = containers.container_of,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host, self.node, self.pods, self.watch = host, node, pods, watch
        self._container_of = container_of
        self._clock = clock
        # pid → (start time, container, attributes, complete, pod-cache generation, checked)
        self._by_pid: dict[int, tuple[int | None, Any, dict[str, Any], bool, int, float]] = {}
        # records held for the first pod list (in order); until when (set at the first
        # record; 0: holding is over, or there is no watch)
        self._held: list[dict[str, Any]] = []
        self._hold_until: float | None = None if watch is not None else 0.0

    # -- the stage ----------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        return bool(self._held)

    def process(self, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self._hold_until is None and recs:
            self._hold_until = self._clock() + FIRST_LIST_HOLD_S
        if self._hold_until and self._waiting_for_list(self._hold_until):
            self._held += recs
            if len(self._held) <= FIRST_LIST_HOLD_MAX:
                return []
            recs = self._held[:-FIRST_LIST_HOLD_MAX]
            self._held = self._held[-FIRST_LIST_HOLD_MAX:]
            return self._resolve(recs)
        if self._held:
            recs, self._held = self._held + recs, []
        return self._resolve(recs)

    def _waiting_for_list(self, until: float) -> bool:
        """The first pod list is still under way, and not for too long yet."""
        w = self.watch
        if (
            w is None
            or w.synced.is_set()
            or w.state in ("forbidden", "unavailable")
            or self._clock() >= until
        ):
            self._hold_until = 0.0  # (once over, never again)
            return False
        return True

    def _resolve(self, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        seen: dict[int, dict[str, Any]] = {}  # a batch's pids: one look-up each
        for r in recs:
            pid = r["pid"]
            attrs = seen.get(pid)
            if attrs is None:
                attrs = seen[pid] = self.of(pid)
            r["resource"] = attrs
        return recs

    def flush(self) -> list[dict[str, Any]]:
        recs, self._held = self._held, []
        return self._resolve(recs)

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()

    # -- per pid ------------------------------------------------------------------------
    def of(self, pid: int) -> dict[str, Any]:
        """The resource attributes of ``pid`` (one dict per process state: shared by its
        records, never changed once handed out)."""
        now = self._clock()
        e = self._by_pid.get(pid)
        if e is not None and now - e[5] < PID_CHECK_S:
            return e[2]
        start = procinfo.start_time(pid)
        gen = self.pods.generation if self.pods is not None else 0
        if e is None or e[0] != start:  # new, or the pid names another process now
            ref = self._container_of(pid)
        elif e[3] or e[4] == gen:  # complete, or nothing new to look at
            self._by_pid[pid] = (*e[:5], now)
            return e[2]
        else:
            ref = e[1]
        attrs, complete = self._attributes(ref)
        if len(self._by_pid) >= MAX_PIDS:
            self._by_pid.clear()
        self._by_pid[pid] = (start, ref, attrs, complete, gen, now)
        return attrs

    def _attributes(self, ref: containers.ContainerRef | None) -> tuple[dict[str, Any], bool]:
        out: dict[str, Any] = {sa.RESOURCE_HOST_NAME: self.host}
        if self.node is not None:
            out[sa.RESOURCE_K8S_NODE_NAME] = self.node
        if ref is None:
            return out, True
        out[sa.RESOURCE_CONTAINER_ID] = ref.container_id
        if self.node is None:  # outside Kubernetes: no pod
            return out, True
        if ref.pod_uid is not None:
            out[sa.RESOURCE_K8S_POD_UID] = ref.pod_uid
        pod = self.pods.find(ref.container_id, ref.pod_uid) if self.pods is not None else None
        if pod is None:
            return out, self.pods is None
        out[sa.RESOURCE_K8S_NAMESPACE_NAME] = pod.namespace
        out[sa.RESOURCE_K8S_POD_NAME] = pod.name
        out[sa.RESOURCE_K8S_POD_UID] = pod.uid
        name = pod.container_name(ref.container_id)
        if name is not None:
            out[sa.RESOURCE_K8S_CONTAINER_NAME] = name
        out.update(pod.workload)
        return out, name is not None


def start(api_url: str | None = None, env: dict[str, str] | None = None) -> ResourceStage:
    """The stage for this agent: outside Kubernetes the machine's host name and container
    ids; in Kubernetes (see the module's doc) also the node and, through a pod watch
    started here (its own thread: nothing waits for the API), the pods."""
    env = dict(os.environ) if env is None else env
    in_cluster = bool(env.get("KUBERNETES_SERVICE_HOST"))
    if not in_cluster and not api_url:
        return ResourceStage(socket.gethostname())
    node = env.get("NODE_NAME") or None
    if node is None:
        log.warning(
            "kubernetes: NODE_NAME is not set (the DaemonSet sets it from spec.nodeName):"
            " host.name is this pod's name, and spans carry container ids only"
        )
        return ResourceStage(socket.gethostname(), None)
    if not api_url and not os.path.exists(_TOKEN):
        log.warning(
            "kubernetes: no service-account token mounted: spans carry container ids and"
            " pod uids only"
        )
        return ResourceStage(node, node)
    cache = k8s.PodCache()
    watch = k8s.PodWatch(cache, node, lambda: _configuration(api_url))
    watch.start()
    return ResourceStage(node, node, cache, watch)


def _configuration(api_url: str | None) -> Any:
    """The client's Configuration: the given URL (tests), else in-cluster (token and CA of
    the service account, the token re-read as kubelet rotates it)."""
    from kubernetes import client, config  # noqa: PLC0415  (in the watch thread)

    cfg = client.Configuration()
    if api_url:
        cfg.host = api_url.rstrip("/")
    else:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    return cfg
