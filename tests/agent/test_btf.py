"""Struct offsets from the kernel's BTF agree with bpftool's reading of the same file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from agent import btf

pytestmark = pytest.mark.skipif(not btf.VMLINUX.exists(), reason="kernel without BTF")


def _bpftool_offset(struct: str, member: str) -> int:
    raw = subprocess.run(
        ["bpftool", "btf", "dump", "file", str(btf.VMLINUX), "format", "raw"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    block = raw.split(f"STRUCT '{struct}' ", 1)[1].split("\n[", 1)[0]
    m = re.search(rf"'{member}' type_id=\d+ bits_offset=(\d+)\n", block)
    assert m, f"bpftool shows no {struct}.{member}"
    return int(m[1]) // 8


@pytest.mark.parametrize(
    ("struct", "member"),
    [("tcp_sock", "srtt_us"), ("sock_common", "skc_family"), ("sock", "sk_rcvbuf")],
)
def test_offsets_match_bpftool(struct: str, member: str) -> None:
    assert btf.member_offset(struct, member) == _bpftool_offset(struct, member)


def test_absent_and_unreadable() -> None:
    assert btf.member_offset("tcp_sock", "no_such_member") is None
    assert btf.member_offset("no_such_struct", "x") is None
    assert btf.member_offset("tcp_sock", "srtt_us", Path("/nonexistent")) is None
    # members of anonymous structs and unions: sock_common's port pair (bpftool lists only
    # the anonymous member; the layout is fixed: daddr, rcv_saddr, hash, dport, num)
    assert btf.member_offset("sock_common", "skc_dport") == 12
    assert btf.member_offset("sock_common", "skc_num") == 14
