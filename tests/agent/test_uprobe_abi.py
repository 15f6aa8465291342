"""bcc's Python binding passes garbage as bpf_attach_uprobe's last argument, the USDT
reference counter's offset (iovisor/bcc#5236); agent/uprobes.fix_bcc_attach_abi passes 0.

The kernel keeps one probe per file and offset: a later attach there with another counter
offset is refused (EINVAL, "ref_ctr_offset mismatch" in the kernel log). With the garbage,
the agent's libc accept probe would lock every other tool out of accept() and accept4() —
and a second agent without CAP_SYS_ADMIN (a rolling update) out of its accept times.
"""

from __future__ import annotations

import ctypes as ct
from pathlib import Path

import pytest

from agent.kernel import headers
from tests.agent.helpers import PY, Agent, Proc

pytestmark = pytest.mark.ebpf

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


def test_the_agents_accept_probe_leaves_the_place_to_other_tools(tmp_path: Path) -> None:
    if not Path(LIBC).exists() or headers.configure_bcc() is None:
        pytest.skip("no glibc at the Debian path, or no kernel headers")
    from bcc import BPF, libbcc

    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp_path / "t")])
    port = srv.port()
    agent = Agent(tmp_path, [port])  # root: bcc makes its probes through perf_event_open
    other = BPF(text=b"int px_test_other(void *ctx) { return 0; }")  # bytes, as bcc wants
    attach = libbcc.lib["bpf_attach_uprobe"]  # the C signature: all seven arguments
    attach.restype = ct.c_int
    attach.argtypes = [ct.c_int, ct.c_int, ct.c_char_p, ct.c_char_p, ct.c_ulonglong, ct.c_int,
                       ct.c_uint32]  # fmt: skip
    fn = other.load_func(b"px_test_other", BPF.KPROBE)
    held: list[tuple[int, bytes]] = []
    try:
        assert "no accept times" not in agent.err.read_text()
        for sym in (b"accept4", b"accept"):
            _, addr = BPF._check_path_symbol(LIBC.encode(), sym, None, -1)
            ev = b"px_test_other_" + sym
            pfd = attach(fn.fd, 1, ev, LIBC.encode(), addr, -1, 0)  # no counter, as a tool asks
            if pfd >= 0:
                held.append((pfd, ev))
            assert pfd >= 0, f"{sym.decode()}: the agent's probe refused another tool's"
    finally:
        for pfd, ev in held:
            libbcc.lib.bpf_close_perf_event_fd(pfd)
            libbcc.lib.bpf_detach_uprobe(ev)
        other.cleanup()
        assert agent.stop() == 0
        srv.stop()
