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
_STRUCT, _UNION, _TYPEDEF, _FUNC = 4, 5, 8, 12
_MAX_KIND = 19  # BTF_KIND_ENUM64
# bytes after the 12-byte common header, per kind: fixed, and per vlen entry
_EXTRA = {1: (4, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 13: (0, 8), 14: (4, 0)}
_EXTRA |= {15: (0, 12), 17: (4, 0), 19: (0, 12)}


class BtfError(Exception):
    pass


_Parsed = tuple[list[tuple[int, int, int, int]], bytes, dict[int, list[tuple[int, int, int]]]]


def _parse(data: bytes) -> _Parsed:
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
        if not 1 <= kind <= _MAX_KIND:
            raise BtfError(f"BTF kind {kind} unknown")  # its size is unknown: stop, not guess
        pos += 12
        tid = len(types)
        types.append((name_off, kind, size_type, kflag))
        fixed, per = _EXTRA.get(kind, (0, 0))
        if kind in (_STRUCT, _UNION):
            members[tid] = [struct.unpack_from("<III", data, pos + 12 * i) for i in range(vlen)]
        pos += fixed + per * vlen
    return types, strings, members


# One load asks twice (the socket hooks' offsets, the holdback's bits): the parse (~0.4 s
# of a ~5 s start) is kept until forget(), not for the agent's life (tens of MB).
_kept: dict[Path, _Parsed] = {}


def _parsed(path: Path) -> _Parsed:
    if path not in _kept:
        _kept[path] = _parse(path.read_bytes())
    return _kept[path]


def forget() -> None:
    """Drop the parse kept since the last call (the loader calls it once it has compiled)."""
    _kept.clear()


def _name(strings: bytes, off: int) -> str:
    return strings[off : strings.index(b"\0", off)].decode()


def func_ids(data: bytes) -> dict[str, int]:
    """The type id of each function (BTF_KIND_FUNC) in a program's BTF, by name: what a
    program's func_info names (agent.kernel.objcache loads programs with it, as bcc does)."""
    types, strings, _ = _parse(data)
    return {
        _name(strings, name_off): tid
        for tid, (name_off, kind, _size, _kflag) in enumerate(types)
        if kind == _FUNC and name_off
    }


def member_offset(struct_name: str, member: str, path: Path = VMLINUX) -> int | None:
    """Byte offset of ``member`` in ``struct struct_name`` (looking into anonymous structs
    and unions), None when the struct, the member or BTF itself is missing, or the member
    is a bitfield."""
    return member_offsets([(struct_name, member)], path)[(struct_name, member)]


def member_offsets(
    wanted: list[tuple[str, str]], path: Path = VMLINUX
) -> dict[tuple[str, str], int | None]:
    """:func:`member_offset` for several (struct, member) pairs, the file parsed once."""
    return lookup(wanted, [], path)[0]


def lookup(
    wanted: list[tuple[str, str]], typedefs: list[str], path: Path = VMLINUX
) -> tuple[dict[tuple[str, str], int | None], dict[str, int | None]]:
    """Member offsets (as :func:`member_offsets`) and the type ids of the ``typedefs`` named
    (e.g. ``btf_trace_sk_data_ready``, what a tp_btf program attaches to), one parse."""
    bits, ids = _lookup_bits(wanted, typedefs, path)
    out: dict[tuple[str, str], int | None] = {}
    for key, found in bits.items():  # a bitfield, or a member off a byte boundary: none
        out[key] = None if found is None or found[1] or found[0] % 8 else found[0] // 8
    return out, ids


def member_bits(
    wanted: list[tuple[str, str]], path: Path = VMLINUX
) -> dict[tuple[str, str], tuple[int, int] | None]:
    """(bit offset, bit width; 0 for a whole member) of each (struct, member), bitfields
    included (``tcp_sock.nonagle`` is one), None where missing."""
    return _lookup_bits(wanted, [], path)[0]


def _lookup_bits(
    wanted: list[tuple[str, str]], typedefs: list[str], path: Path
) -> tuple[dict[tuple[str, str], tuple[int, int] | None], dict[str, int | None]]:
    out: dict[tuple[str, str], tuple[int, int] | None] = dict.fromkeys(wanted)
    ids: dict[str, int | None] = dict.fromkeys(typedefs)
    try:
        types, strings, members = _parsed(path)
        by_name: dict[str, int] = {}
        names = {s for s, _ in wanted}
        for tid, (name_off, kind, _size, _kflag) in enumerate(types):
            if kind == _STRUCT and name_off:
                name = _name(strings, name_off)
                if name in names and name not in by_name:
                    by_name[name] = tid
            elif kind == _TYPEDEF and name_off and typedefs:
                name = _name(strings, name_off)
                if name in ids and ids[name] is None:
                    ids[name] = tid
        for struct_name, member in wanted:
            if struct_name in by_name:
                out[(struct_name, member)] = _find_bits(
                    types, strings, members, by_name[struct_name], member, 0
                )
    except (OSError, BtfError, struct.error, ValueError, IndexError):
        return dict.fromkeys(wanted), dict.fromkeys(typedefs)
    return out, ids


def _find_bits(
    types: list[tuple[int, int, int, int]],
    strings: bytes,
    members: dict[int, list[tuple[int, int, int]]],
    tid: int,
    member: str,
    base_bits: int,
) -> tuple[int, int] | None:
    kflag = types[tid][3]
    for name_off, mtype, off in members.get(tid, []):
        bits = off & 0xFFFFFF if kflag else off
        size = off >> 24 if kflag else 0
        if name_off == 0:
            inner = _find_bits(types, strings, members, mtype, member, base_bits + bits)
            if inner is not None:
                return inner
        elif _name(strings, name_off) == member:
            return (base_bits + bits, size)
    return None
