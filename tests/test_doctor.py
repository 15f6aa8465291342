"""`parallax-agent doctor` runs, and its verdict matches what this machine can do."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.kernel import build

VENV_BIN = Path(sys.executable).parent


def _doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "parallax-agent"), "doctor", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _can_load_bpf_program() -> bool:
    """Independent ground truth: load a one-instruction socket filter through bpf()."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    insns = (ctypes.c_uint64 * 2)(0x00000000000000B7, 0x0000000000000095)  # r0 = 0; exit
    lic = ctypes.create_string_buffer(b"GPL")
    attr = (ctypes.c_uint64 * 16)()
    attr[0] = 1 | (2 << 32)  # prog_type SOCKET_FILTER, insn_cnt 2
    attr[1] = ctypes.addressof(insns)
    attr[2] = ctypes.addressof(lic)
    fd = libc.syscall(321, 5, ctypes.byref(attr), 128)  # BPF_PROG_LOAD
    if fd < 0:
        return False
    os.close(fd)
    return True


def test_doctor_text_output_and_exit_code() -> None:
    p = _doctor()
    assert p.returncode in (0, 1), p.stderr
    assert "Traceback" not in p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("parallax-agent doctor")
    for name in (
        "privileges",
        "bpf() syscall",
        "tracefs",
        "tracepoint sock:sk_data_ready",
        "ring buffer",
        "kernel headers",
        "NVML",
        "uprobes",
    ):
        assert any(name in line for line in lines), name
    assert lines[-1].startswith("verdict:")


def test_doctor_verdict_matches_this_machine() -> None:
    p = _doctor("--json")
    report = json.loads(p.stdout)
    by_name = {c["name"]: c for c in report["checks"]}
    # Ground truth gathered independently of the doctor's own code paths.
    bpf_ok = _can_load_bpf_program()
    assert (by_name["bpf() syscall"]["status"] == "ok") == bpf_ok
    tracefs_ok = (
        Path("/sys/kernel/tracing/events").is_dir()
        or Path("/sys/kernel/debug/tracing/events").is_dir()
    )
    assert (by_name["tracefs"]["status"] == "ok") == tracefs_ok
    if tracefs_ok:
        has_tp = Path("/sys/kernel/tracing/events/sock/sk_data_ready/format").exists()
        assert (by_name["tracepoint sock:sk_data_ready"]["status"] == "ok") == has_tp
    headers = Path(f"/lib/modules/{os.uname().release}/build").exists() or bool(
        list(Path(".cache/kernel-headers").glob("*/.parallax-complete"))
    )
    assert (by_name["kernel headers"]["status"] == "ok") == headers
    try:
        import bcc  # noqa: F401

        bcc_ok = True
    except ImportError:
        bcc_ok = False
    expected = bpf_ok and tracefs_ok and headers and bcc_ok and os.geteuid() == 0
    assert report["can_run"] is expected
    assert (p.returncode == 0) is expected
    # No GPU here: NVML must degrade, not fail the verdict.
    assert by_name["NVML"]["status"] in ("ok", "degraded")
    # every hook with a BTF twin (the build's one table) and the holdback's departure hook:
    # loadable as BTF tracepoints where BPF and the kernel's BTF are
    has_btf = Path("/sys/kernel/btf/vmlinux").exists()
    for tp in [*build.BTF_TWINS, "net:net_dev_queue"]:
        c = by_name[f"{tp.split(':', 1)[1]} as BTF tracepoint"]
        assert (c["status"] == "ok") == (bpf_ok and has_btf and os.geteuid() == 0), c


def test_doctor_as_an_unprivileged_user_explains_instead_of_failing() -> None:
    """Run as nobody: tracefs, the headers and BPF are out of reach; doctor says so, line by
    line, and exits 1 — no traceback."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to drop to another user (setpriv)")
    nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    p = subprocess.run(
        [*nobody, str(VENV_BIN / "parallax-agent"), "doctor"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert p.returncode == 1
    assert p.stdout.splitlines()[-1].startswith("verdict: the agent cannot run here")
    assert any(ln.startswith("[ missing] tracefs") for ln in p.stdout.splitlines()), p.stdout
