"""Field offsets of kernel structs from the running kernel's BTF (/sys/kernel/btf/vmlinux).

The programs never include kernel struct definitions (the fallback headers do not match the
running kernel); where one field is worth reading, its byte offset comes from here and is
compiled in as a constant — what CO-RE relocations do, done once at load time. Only the
BTF type section is walked (format: linux/Documentation/bpf/btf.rst); no bpftool needed.
"""

from __future__ import annotations

import struct
from pathlib import Path

VMLINUX = Path("/sys/kernel/btf/vmlinux")
_MAGIC = 0xEB9F
_STRUCT, _UNION = 4, 5
# bytes after the 12-byte common header, per kind: fixed, and per vlen entry
_EXTRA = {1: (4, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 13: (0, 8), 14: (4, 0)}
_EXTRA |= {15: (0, 12), 17: (4, 0), 19: (0, 12)}


class BtfError(Exception):
    pass


def _parse(
    data: bytes,
) -> tuple[list[tuple[int, int, int, int]], bytes, dict[int, list[tuple[int, int, int]]]]:
    magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
    if magic != _MAGIC:
        raise BtfError("not BTF")
    type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
    types_at = hdr_len + type_off
    strings = data[hdr_len + str_off : hdr_len + str_off + str_len]
    types: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)]  # id 0 is void
    members: dict[int, list[tuple[int, int, int]]] = {}
    pos, end = types_at, types_at + type_len
    while pos < end:
        name_off, info, size_type = struct.unpack_from("<III", data, pos)
        kind, vlen, kflag = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
        pos += 12
        tid = len(types)
        types.append((name_off, kind, size_type, kflag))
        fixed, per = _EXTRA.get(kind, (0, 0))
        if kind in (_STRUCT, _UNION):
            members[tid] = [struct.unpack_from("<III", data, pos + 12 * i) for i in range(vlen)]
        pos += fixed + per * vlen
    return types, strings, members


def _name(strings: bytes, off: int) -> str:
    return strings[off : strings.index(b"\0", off)].decode()


def member_offset(struct_name: str, member: str, path: Path = VMLINUX) -> int | None:
    """Byte offset of ``member`` in ``struct struct_name`` (looking into anonymous structs
    and unions), None when the struct, the member or BTF itself is missing, or the member
    is a bitfield."""
    try:
        types, strings, members = _parse(path.read_bytes())
    except (OSError, BtfError, struct.error):
        return None

    def find(tid: int, base_bits: int) -> int | None:
        kflag = types[tid][3]
        for name_off, mtype, off in members.get(tid, []):
            bits = off & 0xFFFFFF if kflag else off
            size = off >> 24 if kflag else 0
            if name_off == 0:  # anonymous struct/union: its members are ours
                inner = find(mtype, base_bits + bits)
                if inner is not None:
                    return inner
            elif _name(strings, name_off) == member:
                if size or bits % 8:
                    return None
                return (base_bits + bits) // 8
        return None

    for tid, (name_off, kind, _size, _kflag) in enumerate(types):
        if kind == _STRUCT and name_off and _name(strings, name_off) == struct_name:
            return find(tid, 0)
    return None
