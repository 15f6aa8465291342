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

from agent.kernel import sys_bpf

log = logging.getLogger("parallax.agent")
# tests and benches: every hook stays a classic tracepoint
NO_TP_BTF = "PARALLAX_AGENT_NO_TP_BTF"

_PROG_TYPE_TRACING = 26
_TRACE_RAW_TP = 23


class TpBtfError(Exception):
    pass


def load(insns: int, insn_cnt: int, name: str, btf_id: int) -> int:
    """Load ``insn_cnt`` instructions at address ``insns`` as a tp_btf program attaching to
    the tracepoint whose ``btf_trace_<name>`` typedef is ``btf_id``; its fd."""
    lic = ctypes.create_string_buffer(b"GPL")
    attr = sys_bpf.ProgLoadAttr(
        prog_type=_PROG_TYPE_TRACING,
        insn_cnt=insn_cnt,
        insns=insns,
        license=ctypes.addressof(lic),
        prog_name=name.encode()[:15],
        expected_attach_type=_TRACE_RAW_TP,
        attach_btf_id=btf_id,
    )
    try:
        return sys_bpf.prog_load(attr, name)
    except sys_bpf.BpfError as e:
        raise TpBtfError(e.strerror) from None


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
        self.fn_name = fn_name
        self.tracepoint = tracepoint
        self.link_fd = -1
        fn = fn_name.encode()
        try:
            insns: bytes = b.dump_func(fn)
        except Exception as e:  # (bcc raises bare Exception)
            raise TpBtfError(f"{fn_name}: not compiled") from e
        code = ctypes.create_string_buffer(insns, len(insns))
        self.prog_fd: int = load(ctypes.addressof(code), len(insns) // 8, fn_name, btf_id)

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
