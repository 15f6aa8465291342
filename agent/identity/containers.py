"""pid → container: the container id, and in Kubernetes the pod uid, that a process's cgroup
path names (``/proc/<pid>/cgroup``).

Each line of the file is ``hierarchy-id:controllers:path`` (cgroup v1: one line per
hierarchy; v2: the single ``0::`` line; hybrid: both). The runtimes name the container's
cgroup after its id (64 hex digits) and kubelet names the pod's after its uid:

* systemd cgroup driver: ``kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice/``
  then ``cri-containerd-<id>.scope`` (containerd), ``crio-<id>.scope`` (CRI-O; its
  ``crio-conmon-<id>.scope`` holds the monitor, not the container) or ``docker-<id>.scope``
  (dockershim); the uid's dashes become underscores; Guaranteed pods have no ``<qos>``
  level; a static pod's uid is its manifest hash (32 hex digits);
* cgroupfs driver: ``/kubepods/<qos>/pod<uid>/<id>`` (CRI-O: ``…/crio-<id>``);
* containerd with cgroupfs under a systemd-style cgroups path: one directory
  ``kubepods-<qos>-pod<uid>.slice:cri-containerd:<id>``;
* Docker and Podman outside Kubernetes: ``/docker/<id>``, ``/system.slice/docker-<id>.scope``,
  ``libpod-<id>.scope``;
* nesting (Kubernetes in Docker, Docker in Docker, a process in a sub-cgroup of its
  container): the innermost container is the process's, the pod the nearest above it;
* a reader in a cgroup namespace of its own (the agent's pod, where the runtime gives it
  one) sees paths relative to its own cgroup, climbing with ``..``
  (``0::/../../kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope``) — a sibling
  container of the agent's own pod shows no pod level at all (its id still maps to the pod
  through the API).

tests/agent/test_containers.py holds each form as the files show it, with its source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# A path segment naming a container: the runtime's prefix (or none: cgroupfs) and the id.
_CONTAINER = re.compile(r"(?:(?:cri-containerd|crio|docker|libpod)-)?([0-9a-f]{64})(?:\.scope)?")
# containerd's cgroupfs directory for a systemd-style cgroups path: "<slice>:<prefix>:<id>".
_COLON = re.compile(r"(.*\.slice):(?:cri-containerd|crio|docker):([0-9a-f]{64})")
# A pod's level: "pod<uid>" (cgroupfs) or "…-pod<uid>.slice" (systemd, "_" for "-"); a
# static pod's uid is 32 hex digits without dashes.
_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD = re.compile(rf"(?:.*-)?pod({_UUID}|[0-9a-f]{{32}})(?:\.slice)?")


@dataclass(frozen=True, slots=True)
class ContainerRef:
    container_id: str  # 64 lowercase hex digits
    pod_uid: str | None  # the pod's uid with dashes, when the path has a pod level


def _pod_uid(segment: str) -> str | None:
    m = _POD.fullmatch(segment)
    return m[1].replace("_", "-") if m else None


def parse_path(path: str) -> ContainerRef | None:
    """The innermost container a cgroup path names, and the pod above it."""
    segs = [s for s in path.split("/") if s and s != ".."]
    for i in range(len(segs) - 1, -1, -1):
        m = _COLON.fullmatch(segs[i])
        if m:
            return ContainerRef(m[2], _pod_uid(m[1]))
        m = _CONTAINER.fullmatch(segs[i])
        if m:
            # the pod is the nearest level above the container (nesting: kind, dind)
            for above in reversed(segs[:i]):
                uid = _pod_uid(above)
                if uid is not None:
                    return ContainerRef(m[1], uid)
            return ContainerRef(m[1], None)
    return None


def parse(text: str) -> ContainerRef | None:
    """The container of a ``/proc/<pid>/cgroup`` text: the first hierarchy whose path names
    one, preferring a path that also names the pod (hybrid hosts may place a process in
    different cgroups per hierarchy)."""
    found: ContainerRef | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)  # (the path itself may hold colons: see _COLON)
        if len(parts) != 3:
            continue
        ref = parse_path(parts[2])
        if ref is not None:
            if ref.pod_uid is not None:
                return ref
            found = found or ref
    return found


def container_of(pid: int) -> ContainerRef | None:
    """The process's container, None outside one (or when the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    return parse(text)
