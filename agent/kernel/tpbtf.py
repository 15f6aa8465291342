"""BTF tracepoint programs (``tp_btf``): compiled by bcc, loaded and attached here.

A ``tp_btf`` program gets the tracepoint's arguments as typed kernel pointers, so it reads a
socket's fields by direct loads the verifier checks against the kernel's BTF, with no helper
call. bcc 0.26 compiles such a function but cannot load it: its loader overrides the
expected attach type of every ``BPF_PROG_TYPE_TRACING`` program (``bcc_prog_load_xattr``).
So the instructions bcc produced (map references already resolved to this process's map
fds) are loaded with the ``bpf()`` system call directly — type TRACING, attach type
``BPF_TRACE_RAW_TP``, ``attach_btf_id`` the tracepoint's ``btf_trace_<name>`` typedef — and
attached with bcc's raw-tracepoint open of the program fd (no name: the kernel takes it
from the BTF id).
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Any

log = logging.getLogger("parallax.agent")
# tests and benches: every hook stays a classic tracepoint
NO_TP_BTF = "PARALLAX_AGENT_NO_TP_BTF"

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_PROG_LOAD = 5
_PROG_TYPE_TRACING = 26
_TRACE_RAW_TP = 23


class TpBtfError(Exception):
    pass


class _ProgLoadAttr(ctypes.Structure):
    # union bpf_attr, the BPF_PROG_LOAD member, up to attach_btf_obj_fd (the kernel
    # accepts a shorter attr; the fields it has beyond are read as zero)
    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),
        ("prog_ifindex", ctypes.c_uint32),
        ("expected_attach_type", ctypes.c_uint32),
        ("prog_btf_fd", ctypes.c_uint32),
        ("func_info_rec_size", ctypes.c_uint32),
        ("func_info", ctypes.c_uint64),
        ("func_info_cnt", ctypes.c_uint32),
        ("line_info_rec_size", ctypes.c_uint32),
        ("line_info", ctypes.c_uint64),
        ("line_info_cnt", ctypes.c_uint32),
        ("attach_btf_id", ctypes.c_uint32),
        ("attach_btf_obj_fd", ctypes.c_uint32),
    ]


def load(insns: int, insn_cnt: int, name: str, btf_id: int) -> int:
    """Load ``insn_cnt`` instructions at address ``insns`` as a tp_btf program attaching to
    the tracepoint whose ``btf_trace_<name>`` typedef is ``btf_id``; its fd. Loaded without
    the verifier's log (a log longer than its buffer fails the load with ENOSPC), and only
    where that fails once more with it, for the error's last line."""
    sysno = _SYS_BPF.get(os.uname().machine)
    if sysno is None:
        raise TpBtfError(f"no bpf() system call number for {os.uname().machine}")
    lic = ctypes.create_string_buffer(b"GPL")
    attr = _ProgLoadAttr(
        prog_type=_PROG_TYPE_TRACING,
        insn_cnt=insn_cnt,
        insns=insns,
        license=ctypes.addressof(lic),
        prog_name=name.encode()[:15],
        expected_attach_type=_TRACE_RAW_TP,
        attach_btf_id=btf_id,
    )
    libc = ctypes.CDLL(None, use_errno=True)
    fd = int(libc.syscall(sysno, _BPF_PROG_LOAD, ctypes.byref(attr), ctypes.sizeof(attr)))
    if fd >= 0:
        return fd
    err = os.strerror(ctypes.get_errno())
    log = ctypes.create_string_buffer(1 << 20)
    attr.log_level, attr.log_size, attr.log_buf = 1, len(log), ctypes.addressof(log)
    fd = int(libc.syscall(sysno, _BPF_PROG_LOAD, ctypes.byref(attr), ctypes.sizeof(attr)))
    if fd >= 0:  # (a load that failed once and not twice: keep it)
        return fd
    last = log.value.decode(errors="replace").strip().splitlines()[-1:]
    raise TpBtfError(f"{name}: {err}" + (f" ({last[0]})" if last else ""))


def probe(btf_id: int) -> None:
    """Whether this kernel, with this process's privileges, loads a tp_btf program on that
    tracepoint (``r0 = 0; exit``, closed at once): raises TpBtfError if not. For doctor."""
    insns = (ctypes.c_uint64 * 2)(0x00000000000000B7, 0x0000000000000095)
    os.close(load(ctypes.addressof(insns), 2, "px_probe", btf_id))


class TpBtfProgram:
    """One bcc-compiled function loaded as a ``tp_btf`` program on ``tracepoint``."""

    def __init__(self, b: Any, fn_name: str, tracepoint: str, btf_id: int) -> None:
        from bcc import lib  # noqa: PLC0415  (imported once bcc is configured, as in loader)

        self._lib = lib
        self.tracepoint = tracepoint
        self.link_fd = -1
        fn = fn_name.encode()
        start = lib.bpf_function_start(b.module, fn)
        size = lib.bpf_function_size(b.module, fn)
        if not start or size <= 0:
            raise TpBtfError(f"{fn_name}: not compiled")
        insns = ctypes.cast(start, ctypes.c_void_p).value or 0
        self.prog_fd: int = load(insns, size // 8, fn_name, btf_id)

    @property
    def attached(self) -> bool:
        return self.link_fd >= 0

    def attach(self) -> None:
        if self.link_fd < 0:
            fd = self._lib.bpf_attach_kfunc(self.prog_fd)  # raw_tracepoint_open(NULL, fd)
            if fd < 0:
                raise TpBtfError(f"{self.tracepoint}: attach failed")
            self.link_fd = fd

    def detach(self) -> None:
        if self.link_fd >= 0:
            os.close(self.link_fd)
            self.link_fd = -1

    def close(self) -> None:
        self.detach()
        if self.prog_fd >= 0:
            os.close(self.prog_fd)
            self.prog_fd = -1


def attach_in_place(b: Any, fn_name: str, tracepoint: str, btf_id: int) -> TpBtfProgram | None:
    """Load and attach ``fn_name`` as a tp_btf program and keep it with bcc's ``b`` (the
    loader detaches, reattaches and closes it there); None, with an info line, where the
    kernel refuses it or NO_TP_BTF is set: the caller keeps its classic program."""
    if os.environ.get(NO_TP_BTF):
        return None
    try:
        prog = TpBtfProgram(b, fn_name, tracepoint, btf_id)
    except TpBtfError as e:
        log.info("%s stays a classic tracepoint: tp_btf did not load (%s)", tracepoint, e)
        return None
    try:
        prog.attach()
    except TpBtfError as e:
        prog.close()
        log.info("%s stays a classic tracepoint: %s", tracepoint, e)
        return None
    b.px_tp_btf = {**getattr(b, "px_tp_btf", {}), tracepoint.encode(): prog}
    return prog
