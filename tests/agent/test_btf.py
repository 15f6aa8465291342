"""Struct offsets from the kernel's BTF agree with bpftool's reading of the same file."""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

import pytest

from agent.kernel import btf

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


def _blob(types: bytes, strings: bytes) -> bytes:
    hdr = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return hdr + types + strings


def test_synthetic_struct_and_an_unknown_kind(tmp_path: Path) -> None:
    strings = b"\0int\0s\0a\0b\0"
    # [1] INT 'int' size 4; [2] STRUCT 's' size 8 with members a@0, b@32 bits
    types = struct.pack("<IIII", 1, 1 << 24, 4, 32)
    types += struct.pack("<III", 5, (4 << 24) | 2, 8)
    types += struct.pack("<III", 7, 1, 0) + struct.pack("<III", 9, 1, 32)
    ok = tmp_path / "ok.btf"
    ok.write_bytes(_blob(types, strings))
    assert btf.member_offsets([("s", "a"), ("s", "b"), ("s", "c")], ok) == {
        ("s", "a"): 0,
        ("s", "b"): 4,
        ("s", "c"): None,
    }
    # a kind this parser does not know: its size is unknown, so nothing after it is trusted
    bad = tmp_path / "bad.btf"
    bad.write_bytes(_blob(struct.pack("<III", 1, 31 << 24, 0) + types, strings))
    assert btf.member_offset("s", "b", bad) is None
    bad.write_bytes(b"\x00" * 40)
    assert btf.member_offset("s", "b", bad) is None
