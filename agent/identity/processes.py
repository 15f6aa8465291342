"""Which processes are traced, and who they are: the /proc side of the agent.

* The traced set: the owners of the ``--port`` listeners in every network namespace, plus
  their children on the same executable (workers handed connections: Node's cluster, PM2),
  and ``--pid``; rescanned once a second (the kernel counts listener changes), a pid whose
  process exited (or was reused) dropped.
* Identity for records: executable and service name per pid, cached (SVC_CHECK_S).
* Port labels for metrics: a bounded set of listening ports, the rest "other".
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from agent.identity import procinfo
from agent.kernel import loader, uprobes
from agent.kernel.sockdiag import ListenerStats
from agent.kernel.tls_probes import TlsProbes

log = logging.getLogger("parallax.agent")
# --port mode: every process's fds are scanned for the listeners when one opens or closes
# (a kernel counter) and at this period as a safety net (an fd passed over a unix socket);
# the traced processes' children, which inherit a listener silently, at the shorter one.
FULL_SCAN_S = 60.0
CHILD_SCAN_S = 5.0
MAX_PORT_LABELS = 64  # label values of per-port metrics; beyond: "other"
# A cached service name is checked against its pid's start time at most this often: with
# every process traced, a pid reused by another process gets its own name within a second
# (a /proc read per new connection would cost more than the rest of a request's handling).
SVC_CHECK_S = 1.0


class Processes:
    """The traced processes (``pids``) and the per-pid and per-port facts about them. The
    main loop calls :meth:`rescan` once a second; the /metrics thread may call
    :meth:`port_label` and :meth:`listen_drops` at any time."""

    def __init__(
        self,
        ports: list[int],
        pids: list[int],
        service_names: dict[int, str] | None = None,
    ) -> None:
        self.ports = list(ports)
        self.explicit_pids = list(pids)
        self.service_names = dict(service_names or {})
        self.pids: set[int] = set(pids)
        self.bpf: Any = None  # set by attach()
        self.accept_probes: uprobes.AcceptProbes | None = None  # socket hooks only
        self.tls_probes: TlsProbes | None = None
        self._pid_start: dict[int, int | None] = {}  # pid → start time (reuse detection)
        # pid → (comm, service, start time, when checked): see SVC_CHECK_S
        self._svc: dict[int, tuple[str, str, int | None, float]] = {}
        self._listen_ports: set[int] = set(ports)
        self._listen_checked = 0.0
        self._listen_changes = -1
        self._last_full_scan = 0.0
        self._last_child_scan = 0.0
        self._listening: dict[int, int] = {}  # inode → port of the --port listeners
        self.port_owner: dict[int, int] = {}  # port → a traced pid holding its listener
        self._port_labels: set[str] = set()
        self._label_lock = threading.Lock()  # port labels: main loop and /metrics thread
        self._listeners = ListenerStats()

    # -- start-up -------------------------------------------------------------------
    def find(self) -> list[int]:
        """Before the programs load: the owners of the --port listeners join the traced
        set. Returns the pids the kernel filter starts with."""
        if self.ports:
            held = procinfo.listeners(set(self.ports))
            self.pids |= set(held)
            self._note_owners(held)
        self._track(self.pids)
        return sorted(self.pids)

    def attach(self, bpf: Any, socket_hooks: bool, tls: str = "auto") -> None:
        """The programs are loaded: seed the kernel's per-port listener counts, attach the
        accept probes (socket hooks), set up the TLS probes (``tls``: auto | off; on each
        server that maps OpenSSL now, on others at their first TLS connection), seed the
        connections older than the agent."""
        self.bpf = bpf
        # the kernel counts listeners per port over every namespace: seeded the same way
        listen = procinfo.listen_counts(procinfo.all_pids())
        loader.seed_listen(bpf, listen)
        # With every process traced, the servers are the owners of listening sockets. With
        # --port or --pid, only the traced ones: none yet when nothing listens on the ports
        # (rescan probes each owner as it appears), not every server on the node.
        servers = set(self.pids)
        if not self.ports and not self.explicit_pids:
            servers = set(procinfo.listeners(set(listen)))
        servers.discard(os.getpid())  # never the agent itself (its /metrics listens)
        if socket_hooks:
            self.accept_probes = uprobes.AcceptProbes(bpf)
            self.accept_probes.add(servers)
        self.tls_probes = TlsProbes(bpf, tls)
        # TLS from a server's first byte: probes now on those that map OpenSSL
        self.tls_probes.preattach(servers)
        self._seed(servers)

    def _track(self, pids: set[int]) -> None:
        for p in pids:
            self._pid_start[p] = procinfo.start_time(p)

    def _seed(self, pids: set[int]) -> None:
        """Connections older than the agent: followed from their next read or write."""
        ports = set(self.ports) or None
        for pid, fd, e in procinfo.established(pids, ports):
            loader.seed_fd(self.bpf, pid, fd, e.lport, e.family, e.laddr, e.raddr, e.rport)

    # -- the rescan -------------------------------------------------------------------
    def rescan(self, counters: dict[str, int]) -> None:
        """Every second: drop traced pids whose process exited (or whose pid now names
        another process: a reused pid is not traced because its previous owner was), then
        add the new owners of the --port listeners. ``counters``: the kernel's, read once
        per tick."""
        if self.accept_probes is not None:
            self.accept_probes.sweep()
        if self.tls_probes is not None:
            self.tls_probes.sweep()
        gone = [p for p, st in self._pid_start.items() if procinfo.start_time(p) != st]
        if gone:
            loader.remove_pids(self.bpf, gone)
            for p in gone:
                self.pids.discard(p)
                del self._pid_start[p]
                self._svc.pop(p, None)
        if not self.ports and self.explicit_pids:
            return
        # The owners of the listeners: a walk of /proc/net/tcp (the kernel walks its whole
        # connection hash for it: milliseconds) and of every process's fds, when a listening
        # socket opened or closed (counted in the kernel) or FULL_SCAN_S passed; in between
        # only the traced processes' children (see FULL_SCAN_S).
        changes = counters["listen_changes"]
        now = time.monotonic()
        if not self.ports:
            # Every process is traced: a new server's libc gets the accept probe, and its
            # OpenSSL the TLS probes. Only on a listener change (a forked worker maps its
            # parent's libc, already probed).
            tls_on = self.tls_probes is not None and self.tls_probes.enabled
            if changes != self._listen_changes and (self.accept_probes is not None or tls_on):
                self._listen_changes = changes
                servers = set(procinfo.listeners(None))  # one read of the tables
                servers.discard(os.getpid())
                if self.accept_probes is not None:
                    self.accept_probes.add(servers)
                if self.tls_probes is not None:
                    self.tls_probes.preattach(servers)
            return
        if changes != self._listen_changes or now - self._last_full_scan >= FULL_SCAN_S:
            self._listen_changes, self._last_full_scan = changes, now
            everyone = procinfo.all_pids()
            self._listening = procinfo.listener_inodes(set(self.ports), everyone)
            held = procinfo.holders(everyone, self._listening)
            self._note_owners(held)
            found = set(held)
        elif now - self._last_child_scan >= CHILD_SCAN_S:
            # A worker forked later inherits its parent's listener without any state
            # change: only the traced processes' children need looking at, not every
            # process's fds (tens of milliseconds on a busy node).
            self._last_child_scan = now
            kids = procinfo.children(self.pids) - self.pids
            found = set(procinfo.holders(kids, self._listening))
        else:
            return
        # Workers handed their connections by a traced process hold no listener: its
        # children on the same executable are traced too (the kernel still follows only
        # connections accepted on the --port listeners, whoever reads them).
        found |= procinfo.worker_children(self.pids | found)
        new = found - self.pids
        if new and self.accept_probes is not None:
            self.accept_probes.add(new)
        if new and self.tls_probes is not None:
            self.tls_probes.preattach(new)
        if new:
            self._track(new)
            loader.set_pids(self.bpf, sorted(new))
            self.pids |= new
            self._seed(new)

    def _note_owners(self, held: dict[int, set[int]]) -> None:
        owners = {port: pid for pid, ports in held.items() for port in ports}
        self.port_owner = {**self.port_owner, **owners}  # swapped whole: read by other threads

    def service_of_port(self, port: int) -> str | None:
        """The service name of the process holding a traced port's listener, where known
        (--port): counts of a port name their service before any record of it has."""
        pid = self.port_owner.get(port)
        return None if pid is None else self.identity(pid, port)[1]

    # -- identity -------------------------------------------------------------------
    def identity(self, pid: int, lport: int) -> tuple[str, str]:
        """(executable name, service name) of the process serving ``lport``; a name given
        for the port on the command line wins."""
        cached = self._svc.get(pid)
        now = time.monotonic()
        if cached is None or now - cached[3] >= SVC_CHECK_S:
            start = procinfo.start_time(pid)
            if cached is None or cached[2] != start:  # new, or the pid names another process
                cached = (procinfo.comm(pid), procinfo.service_name(pid), start, now)
            else:
                cached = (cached[0], cached[1], start, now)
            if len(self._svc) > 10000:
                self._svc.clear()
            self._svc[pid] = cached
        return cached[0], self.service_names.get(lport) or cached[1]

    # -- metric labels ----------------------------------------------------------------
    def port_label(self, port: int) -> str:
        """A bounded label set: listening ports (at most MAX_PORT_LABELS), else "other"."""
        with self._label_lock:
            if port not in self._listen_ports and time.monotonic() - self._listen_checked > 5:
                self._listen_checked = time.monotonic()
                # a copy: the main loop's rescan may grow the set meanwhile (/metrics thread)
                self._listen_ports |= set(procinfo.listen_counts(tuple(self.pids)))
            if port in self._listen_ports:
                label = str(port)
                if label in self._port_labels or len(self._port_labels) < MAX_PORT_LABELS:
                    self._port_labels.add(label)
                    return label
            return "other"

    def by_port_label(self, per_port: dict[int, int]) -> dict[str, int]:
        """Per-port counts under the bounded port labels: ports beyond the label budget are
        summed under "other"."""
        out: dict[str, int] = {}
        for port, n in per_port.items():
            label = self.port_label(port)
            out[label] = out.get(label, 0) + n
        return out

    def listen_drops(self) -> dict[str, int]:
        """Accept-queue drops per port label: the agent's network namespace and those of
        the traced processes (a pod has its own); --port limits the ports."""
        drops: dict[str, int] = {}
        for ls in self._listeners.read(sorted(self.pids)):
            if ls.port and self.ports and ls.port not in self.ports:
                continue
            with self._label_lock:
                self._listen_ports.add(ls.port)
            label = self.port_label(ls.port) if ls.port else "0"
            drops[label] = drops.get(label, 0) + ls.drops
        return drops

    def close(self) -> None:
        self._listeners.close()
        if self.tls_probes is not None:
            self.tls_probes.close()
