"""Finding (and, for a root agent, mounting) tracefs, and reading tracepoint formats."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
from pathlib import Path

CANDIDATES = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


def _has_events(p: Path) -> bool:
    try:
        return (p / "events").is_dir()
    except OSError:  # EACCES: tracefs is root-only (mode 700) on most systems
        return False


def find() -> Path | None:
    for p in CANDIDATES:
        if _has_events(p):
            return p
    return None


def ensure_mounted() -> tuple[Path | None, str]:
    """Return (tracefs path, note). Mounts tracefs at /sys/kernel/tracing when it is
    missing and we are root, as bpftrace and perf do; a container needs /sys/kernel/tracing
    from the host or CAP_SYS_ADMIN for this."""
    found = find()
    if found is not None:
        return found, f"mounted at {found}"
    target = CANDIDATES[0]
    if os.geteuid() != 0 and target.is_dir():
        return None, f"{target} not readable by this user: run as root (or give it read access)"
    if os.geteuid() != 0 or not target.is_dir():
        return None, f"not mounted (mount -t tracefs nodev {target})"
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    rc = libc.mount(b"nodev", str(target).encode(), b"tracefs", 0, None)
    if rc != 0:
        err = os.strerror(ctypes.get_errno())
        return None, f"not mounted and mounting failed: {err}"
    return (target, f"mounted by parallax at {target}") if find() else (None, "mount had no effect")


def fields(tracefs: Path, category: str, name: str) -> set[str] | None:
    """Field names of a tracepoint, or None when the kernel does not have it."""
    try:
        text = (tracefs / "events" / category / name / "format").read_text()
    except OSError:
        return None
    out: set[str] = set()
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("field:"):
            continue
        decl = line[len("field:") :].split(";", 1)[0].strip()
        ident = decl.rsplit(None, 1)[-1].lstrip("*").split("[", 1)[0]
        out.add(ident)
    return out


# bcc names the uprobe events it makes through tracefs <p|r>_<path>_0x<offset>_bcc_<pid>; the
# agent's paths are /proc/self/fd/<n> (agent/kernel/uprobes.py).
# bcc's names for the accept probe (agent.kernel.uprobes) and the agent's for the TLS probes
# (agent.kernel.tls_probes); libbcc appends "_bcc_<the attaching process>" to both.
_OUR_UPROBE = re.compile(
    r"^[pr]:uprobes/((?:[pr]__proc_self_fd_\d+_0x[0-9a-f]+|px_tls_[pr]_\d+_[0-9a-f]+)_bcc_(\d+))\s"
)


def remove_stale_uprobes(tracefs: Path | None = None) -> int:
    """Remove the uprobe events an agent made and left behind (killed before it could
    detach them); returns how many.

    Without CAP_SYS_ADMIN the kernel makes no uprobe through perf_event_open (Linux ≥ 6.16
    and stable backports: uprobes may write to text), so bcc writes each one as a tracefs
    event, which outlives a ``kill -9``. An event whose maker is gone holds no probe, but
    the list would grow by two with every killed agent. One in use (another agent in another
    PID namespace) is refused by the kernel (EBUSY) and stays."""
    base = tracefs or find()
    if base is None:
        return 0
    try:
        lines = (base / "uprobe_events").read_text().splitlines()
    except OSError:
        return 0
    removed = 0
    for line in lines:
        m = _OUR_UPROBE.match(line + " ")
        if m is None or Path(f"/proc/{m[2]}").exists():
            continue
        if write_probe_events(f"-:uprobes/{m[1]}", base):
            removed += 1
    return removed


def write_probe_events(line: str, tracefs: Path | None = None) -> bool:
    """One line to uprobe_events; False if the kernel refused it (in use, exists, bad).
    Opened without a seek: Python's append mode seeks to the end, which tracefs refuses."""
    base = tracefs or find()
    if base is None:
        return False
    try:
        fd = os.open(base / "uprobe_events", os.O_WRONLY | os.O_APPEND)
    except OSError:
        return False
    try:
        os.write(fd, f"{line}\n".encode())
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
