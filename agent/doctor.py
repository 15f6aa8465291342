"""``parallax-agent doctor``: what this host supports, one line each, and what is lost.

Checks are read-only except one: like bpftrace and perf, a root agent mounts tracefs at
/sys/kernel/tracing when it is not mounted (the agent does the same at start).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.kernel import btf, build, headers, holdback, tpbtf, tracefs
from agent.kernel.tracepoints import TRACEPOINTS

# Capability bits (linux/capability.h)
CAPS = {"CAP_SYS_ADMIN": 21, "CAP_SYS_PTRACE": 19, "CAP_PERFMON": 38, "CAP_BPF": 39}
_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_MAP_CREATE = 0
_MAP_ARRAY = 2
_MAP_RINGBUF = 27


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str  # "ok" | "degraded" | "missing" | "info"
    detail: str
    fatal: bool = False  # the agent cannot run while this is missing

    def line(self) -> str:
        return f"[{self.status:>8}] {self.name}: {self.detail}"


def _cap_eff() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_privilege() -> Check:
    eff = _cap_eff()
    have = [n for n, bit in CAPS.items() if eff >> bit & 1]
    who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
    can_bpf = ("CAP_BPF" in have and "CAP_PERFMON" in have) or "CAP_SYS_ADMIN" in have
    if can_bpf:
        return Check("privileges", "ok", f"{who}, effective {', '.join(have)}")
    return Check(
        "privileges",
        "missing",
        f"{who} without CAP_BPF+CAP_PERFMON (or CAP_SYS_ADMIN): run as root or grant them",
        fatal=True,
    )


def _bpf_map_create(map_type: int, key: int, value: int, entries: int) -> int:
    """errno of BPF_MAP_CREATE (0 on success); the map is closed at once."""
    nr = _SYS_BPF.get(platform.machine())
    if nr is None:
        return 38  # ENOSYS: unknown architecture
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    attr = (ctypes.c_uint32 * 32)(map_type, key, value, entries)
    fd = libc.syscall(nr, _BPF_MAP_CREATE, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd < 0:
        return ctypes.get_errno()
    os.close(fd)
    return 0


def check_bpf_syscall() -> Check:
    err = _bpf_map_create(_MAP_ARRAY, 4, 4, 1)
    if err == 0:
        return Check("bpf() syscall", "ok", "map created")
    return Check(
        "bpf() syscall", "missing", f"BPF_MAP_CREATE failed: {os.strerror(err)}", fatal=True
    )


def check_ringbuf() -> Check:
    err = _bpf_map_create(_MAP_RINGBUF, 0, 0, 4096)
    if err == 0:
        return Check("ring buffer", "ok", "BPF_MAP_TYPE_RINGBUF available")
    return Check(
        "ring buffer",
        "missing",
        f"no BPF ring buffer (Linux ≥ 5.8): {os.strerror(err)}",
        fatal=True,
    )


def check_tracefs() -> tuple[Check, Path | None]:
    path, note = tracefs.ensure_mounted()
    if path is None:
        return Check("tracefs", "missing", note, fatal=True), None
    return Check("tracefs", "ok", note), path


def check_tracepoints(tfs: Path | None) -> list[Check]:
    out = []
    for tp in TRACEPOINTS:
        have = tracefs.fields(tfs, tp.category, tp.name) if tfs else None
        since = f" (Linux ≥ {tp.since})" if tp.since else ""
        if have is not None and set(tp.fields) <= have:
            out.append(Check(f"tracepoint {tp.id}", "ok", "present, fields as expected"))
            continue
        problem = (
            "absent" + since
            if have is None
            else ("fields differ, missing " + ", ".join(sorted(set(tp.fields) - have)))
        )
        status = "missing" if tp.required else "degraded"
        out.append(
            Check(f"tracepoint {tp.id}", status, f"{problem} → {tp.degrade}", fatal=tp.required)
        )
    return out


def check_uprobes(tfs: Path | None) -> Check:
    if Path("/sys/bus/event_source/devices/uprobe").exists():
        return Check("uprobes", "ok", "uprobe PMU present (libc accept times, library probes)")
    return Check("uprobes", "degraded", "no uprobe PMU → no accept-queue wait on the socket hooks")


def check_tls() -> Check:
    """Whether the TLS probes (agent.kernel.tls_probes) can go on here."""
    from agent.kernel.uprobes import uretprobe_hazard  # noqa: PLC0415  (keeps doctor's imports light)

    if not Path("/sys/bus/event_source/devices/uprobe").exists():
        why = "no uprobe PMU"
    elif platform.machine() != "x86_64":
        why = f"the uprobe programs read x86-64 registers, this is {platform.machine()}"
    elif uretprobe_hazard():
        why = f"Linux {platform.release()}: uretprobes can get seccomp-confined servers killed"
    else:
        return Check(
            "TLS",
            "ok",
            "OpenSSL SSL_read/SSL_write uprobes on each traced process at its first TLS"
            " connection (its libssl, or its executable's symbols: Node)",
        )
    return Check("TLS", "degraded", f"{why} → TLS requests counted per executable, not recorded")


def check_io_hooks(tfs: Path | None) -> Check:
    """How reads and writes will be seen (loader.load makes the same choice)."""
    sock = tfs is not None and all(
        (f := tracefs.fields(tfs, tp.category, tp.name)) is not None and set(tp.fields) <= f
        for tp in TRACEPOINTS
        if tp.id in ("sock:sock_recv_length", "sock:sock_send_length")
    )
    if platform.machine() == "x86_64" and sock:
        return Check("I/O hooks", "ok", "socket tracepoints: no syscall tracepoint attached")
    why = "not x86-64" if platform.machine() != "x86_64" else "no sock_*_length (Linux < 6.3)"
    return Check(
        "I/O hooks",
        "degraded",
        f"{why} → syscall tracepoints: every syscall on the node takes the slow path",
    )


# What a hook's classic program costs where its BTF twin does not load (the twins:
# agent.kernel.build.BTF_TWINS, and the holdback's departure hook).
_SKIPPED = (
    "skipped while another BPF program runs on its CPU (parallax_agent_bpf_missed_runs_total)"
)
_CLASSIC_COST = {
    "sock:sk_data_ready": "a map lookup for every socket's data arrival",
    "sock:inet_sock_set_state": f"{_SKIPPED}: a connection's start missed, its requests unrecorded",
    "net:net_dev_queue": "five helper reads of the skb per packet while a write is held",
}


def _twins() -> dict[str, str]:
    """BTF typedef → tracepoint, of every hook the agent runs as a BTF tracepoint where it can."""
    out = {typedef: tp for tp, (typedef, _, _) in build.BTF_TWINS.items()}
    out[holdback.XMIT_TYPEDEF] = "net:net_dev_queue"
    return out


def check_tp_btf() -> list[Check]:
    """Whether each hook can run as a BTF tracepoint (agent/kernel/tpbtf.py): a
    one-instruction tp_btf program on each, loaded and closed (needs the agent's
    privileges)."""
    twins = _twins()
    _, ids = btf.lookup([], list(twins))
    out = []
    for typedef, tp in twins.items():
        name = f"{tp.split(':', 1)[1]} as BTF tracepoint"
        btf_id = ids[typedef]
        classic = f"the classic program instead: {_CLASSIC_COST.get(tp, _SKIPPED)}"
        if btf_id is None:
            out.append(Check(name, "info", f"no kernel BTF for it → {classic}"))
            continue
        try:
            tpbtf.probe(btf_id)
        except tpbtf.TpBtfError as e:
            out.append(Check(name, "info", f"not loadable here ({e}) → {classic}"))
            continue
        out.append(Check(name, "ok", "loads: its fields are direct loads"))
    return out


def check_kprobes() -> Check:
    # Informational: the agent never uses kprobes or fentry, so hardened kernels are fine.
    have = Path("/sys/bus/event_source/devices/kprobe").exists()
    return Check("kprobes", "info", ("present" if have else "absent") + " (not used by the agent)")


def check_headers() -> Check:
    src = headers.resolve()
    if src is None:
        return Check(
            "kernel headers",
            "missing",
            f"no {headers.running_kernel_build()} and no fallback: run make setup",
            fatal=True,
        )
    return Check("kernel headers", "ok", src.describe())


def check_bcc() -> Check:
    try:
        import bcc  # noqa: PLC0415  (optional: Debian's python3-bpfcc)
    except ImportError as e:
        return Check(
            "bcc", "missing", f"cannot import bcc ({e}): install python3-bpfcc", fatal=True
        )
    version = getattr(bcc, "__version__", "?")
    return Check("bcc", "ok", f"bcc {version}")


def check_nvml() -> Check:
    try:
        import pynvml  # noqa: PLC0415
    except ImportError:
        return Check("NVML", "degraded", "nvidia-ml-py not installed → no GPU time")
    try:
        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError as e:
        return Check("NVML", "degraded", f"{e} → no GPU time (fine on a node without GPUs)")
    return Check("NVML", "ok", f"{n} GPU(s)")


def run_checks() -> list[Check]:
    tfs_check, tfs = check_tracefs()
    checks = [check_privilege(), check_bpf_syscall(), check_ringbuf(), tfs_check]
    checks += check_tracepoints(tfs)
    checks += [check_io_hooks(tfs), *check_tp_btf(), check_uprobes(tfs), check_tls()]
    checks += [check_kprobes()]
    checks += [check_headers(), check_bcc(), check_nvml()]
    return checks


def can_run(checks: list[Check]) -> bool:
    return not any(c.fatal for c in checks)


def main(as_json: bool = False) -> int:
    checks = run_checks()
    ok = can_run(checks)
    if as_json:
        print(
            json.dumps(
                {
                    "can_run": ok,
                    "kernel": platform.release(),
                    "checks": [asdict(c) for c in checks],
                },
                indent=1,
            )
        )
    else:
        print(f"parallax-agent doctor — Linux {platform.release()} ({platform.machine()})")
        for c in checks:
            print(c.line())
        print(
            "verdict: the agent can run"
            + (
                ""
                if all(c.status in ("ok", "info") for c in checks)
                else ", with the degradations above"
            )
            if ok
            else "verdict: the agent cannot run here (see 'missing' above)"
        )
    return 0 if ok else 1
