"""A cgroup named as a node's would be for one container of a pod, for tests that place a
process there (agent.identity.containers reads it back from /proc/<pid>/cgroup)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.agent.helpers import PY, Proc


def cgroup2_root() -> Path | None:
    """Where a cgroup v2 hierarchy is mounted (the unified one of a hybrid host)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return Path(left.split()[4])
    return None


class PodCgroup:
    """``…/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
    cri-containerd-<id>.scope`` (kubelet's systemd driver, containerd), under a directory of
    the test's own (as kind nests a node's pods under the node's container). Skips without
    root and a writable cgroup v2 hierarchy."""

    def __init__(self) -> None:
        root = cgroup2_root()
        if os.geteuid() != 0 or root is None or not os.access(root, os.W_OK):
            pytest.skip("needs root and a writable cgroup v2 hierarchy")
        self.pod_uid = str(uuid.uuid4())
        self.container_id = uuid.uuid4().hex + uuid.uuid4().hex
        self.root = root
        self.leaf = (
            root
            / f"parallax-test-{uuid.uuid4().hex[:8]}.slice"
            / "kubepods.slice/kubepods-burstable.slice"
            / f"kubepods-burstable-pod{self.pod_uid.replace('-', '_')}.slice"
            / f"cri-containerd-{self.container_id}.scope"
        )
        self.leaf.mkdir(parents=True)

    def add(self, pid: int) -> None:
        (self.leaf / "cgroup.procs").write_text(str(pid))

    def server(self, log: Path) -> Proc:
        """py_server, moved into the container's cgroup before it starts."""
        return Proc(
            [
                "sh",
                "-c",
                f"echo $$ > {self.leaf}/cgroup.procs && exec {PY} -m"
                f" tests.agent.servers.py_server --timing-log {log}",
            ]
        )

    def remove(self) -> None:
        """(Its processes have exited: a cgroup with members cannot be removed.)"""
        for d in [self.leaf, *self.leaf.parents]:
            if d == self.root:
                break
            d.rmdir()
