"""Which processes do a traced server's GPU work: its service's GPU processes.

An inference server often reads requests in one process and runs the model in another of
the same container (vLLM's API server and engine core). A traced server's GPU processes
are the processes in its cgroup (its container; outside Kubernetes, its systemd unit or
session) that use a GPU — they map the CUDA driver library or NVML lists them among the
device's compute processes — the server itself included if it does. ``--gpu-pid
SERVER=GPU`` names them instead where the two do not share a cgroup.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from agent.identity import procinfo
from agent.kernel.uprobes import mapped_path

GROUP_SCAN_S = 10.0  # every process's cgroup is read at most this often
_LIBCUDA = re.compile(r"/libcuda\.so(?:\.[0-9]+)*$")


def cgroup_of(pid: int) -> str | None:
    """The process's cgroup membership (every hierarchy's line of /proc/<pid>/cgroup, so
    cgroup v1, v2 and hybrid compare alike), None when it is gone or unreadable."""
    try:
        return Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None


def maps_cuda(pid: int) -> bool:
    return mapped_path(pid, _LIBCUDA) is not None


class GpuProcesses:
    """The GPU processes of each traced server, refreshed by :meth:`refresh` (the GPU
    thread); read by :meth:`of` (the exporter thread: whole dicts are swapped, not
    mutated)."""

    def __init__(
        self,
        overrides: dict[int, set[int]] | None = None,
        nvml_pids: Callable[[], Iterable[int]] = lambda: (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._overrides = {k: frozenset(v) for k, v in (overrides or {}).items()}
        self._nvml_pids = nvml_pids
        self._clock = clock
        self._by_server: dict[int, frozenset[int]] = {}
        self._members: dict[str, list[int]] = {}  # cgroup → pids
        self._scanned = float("-inf")
        self._cuda_seen: dict[int, int | None] = {}  # pid → start time: maps libcuda
        self._no_cuda: set[int] = set()  # looked at since the last cgroup scan: does not

    def of(self, server_pid: int) -> frozenset[int]:
        return self._by_server.get(server_pid, frozenset())

    def all(self) -> set[int]:
        out: set[int] = set()
        for pids in self._by_server.values():
            out |= pids
        return out

    def refresh(self, servers: Iterable[int]) -> None:
        """Find the GPU processes of these servers (cheap between cgroup scans: only the
        candidates not yet known to use a GPU are looked at again)."""
        servers = set(servers)
        now = self._clock()
        if now - self._scanned >= GROUP_SCAN_S or not self._members:
            self._scanned = now
            members: dict[str, list[int]] = {}
            for pid in procinfo.all_pids():
                cg = cgroup_of(pid)
                if cg is not None:
                    members.setdefault(cg, []).append(pid)
            self._members = members
            self._no_cuda = set()  # (a process may have loaded the driver since)
        nvml = set(self._nvml_pids())
        out: dict[int, frozenset[int]] = {}
        for server in servers:
            if server in self._overrides:
                out[server] = self._overrides[server]
                continue
            cg = cgroup_of(server)
            if cg is None:
                continue
            group = set(self._members.get(cg, ())) | {server}
            out[server] = frozenset(p for p in group if p in nvml or self._uses_cuda(p))
        self._by_server = out
        # forget processes that are gone (a reused pid is looked at afresh)
        for pid, start in list(self._cuda_seen.items()):
            if procinfo.start_time(pid) != start:
                del self._cuda_seen[pid]

    def _uses_cuda(self, pid: int) -> bool:
        if pid in self._cuda_seen:
            return True
        if pid in self._no_cuda:
            return False
        if not maps_cuda(pid):
            self._no_cuda.add(pid)
            return False
        self._cuda_seen[pid] = procinfo.start_time(pid)
        return True
