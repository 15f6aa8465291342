"""Finding (and, for a root agent, mounting) tracefs, and reading tracepoint formats."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
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
