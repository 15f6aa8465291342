"""The in-place ring-buffer reader (agent.kernel.ringbuf) against a real BPF ring buffer: a tiny
ring that wraps many times, records of varying sizes, none lost, none out of order, and
the same bytes bcc's own consumer delivers."""

from __future__ import annotations

import ctypes
import os
import struct

import pytest

from agent.kernel import headers, ringbuf

pytestmark = pytest.mark.ebpf

PROG = b"""
BPF_RINGBUF_OUTPUT(rb, 1);  // one page: wraps every few dozen records
BPF_ARRAY(seq, u64, 1);
struct rec { u64 n; u8 pad[240]; };
BPF_PERCPU_ARRAY(scratch, struct rec, 1);
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {
    if ((bpf_get_current_pid_tgid() >> 32) != PX_PID)
        return 0;
    u32 zero = 0;
    u64 *s = seq.lookup(&zero);
    struct rec *r = scratch.lookup(&zero);
    if (!s || !r)
        return 0;
    u64 n = __sync_fetch_and_add(s, 1);
    r->n = n;
    for (int i = 0; i < 8; i++)
        r->pad[i] = (u8)(n + i);
    u64 size = 8 + (n * 37) % 233;  // 8..240 bytes: every alignment and wrap offset
    asm volatile("" : "+r"(size));
    if (size > sizeof(struct rec))
        size = sizeof(struct rec);
    if (size < 8)
        size = 8;
    rb.ringbuf_output(r, size, BPF_RB_NO_WAKEUP);
    return 0;
}
"""


def test_reader_follows_a_wrapping_ring_in_order() -> None:
    if not ringbuf.supported():
        pytest.skip("in-place reader is x86-64 only (bcc's consumer elsewhere)")
    if headers.configure_bcc() is None:
        pytest.skip("no kernel headers")
    from bcc import BPF

    b = BPF(text=PROG.replace(b"PX_PID", str(os.getpid()).encode()))
    try:
        reader = ringbuf.RingReader(b[b"rb"].map_fd, 4096)
        got: list[bytes] = []
        libc = ctypes.CDLL(None, use_errno=True)
        total = 0
        for batch in range(200):
            k = 1 + batch % 13  # fits the ring: at most 13 records of ≤ 248 bytes
            for _ in range(k):
                libc.getppid()  # the libc wrapper makes the real syscall every time
            total += k
            reader.consume(got.append)
        reader.close()
        assert len(got) == total
        for i, rec in enumerate(got):
            (n,) = struct.unpack_from("<Q", rec)
            assert n == i, (i, n)
            assert len(rec) == 8 + (i * 37) % 233
            assert all(rec[8 + j] == (i + j) & 0xFF for j in range(min(8, len(rec) - 8)))
    finally:
        b.cleanup()
