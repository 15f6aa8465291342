"""The ``bpf()`` system call, for what bcc 0.26 cannot do: load a tp_btf program
(agent.kernel.tpbtf) and load a program whose instructions bcc compiled in an earlier run
(agent.kernel.objcache): create its maps, load its BTF, read a map's attributes back.

Each ``*Attr`` is the member of ``union bpf_attr`` one command reads, up to the last field
used here (the kernel takes a shorter attr and reads the fields beyond as zero).
"""

from __future__ import annotations

import ctypes
import os

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
MAP_CREATE, PROG_LOAD, OBJ_GET_INFO_BY_FD, BTF_LOAD, BTF_GET_FD_BY_ID = 0, 5, 15, 18, 19
_libc = ctypes.CDLL(None, use_errno=True)


class BpfError(OSError):
    """A refused ``bpf()`` command: errno and, for a program, the verifier's last line."""


class ProgLoadAttr(ctypes.Structure):
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


class MapCreateAttr(ctypes.Structure):
    _fields_ = [
        ("map_type", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("inner_map_fd", ctypes.c_uint32),
        ("numa_node", ctypes.c_uint32),
        ("map_name", ctypes.c_char * 16),
        ("map_ifindex", ctypes.c_uint32),
        ("btf_fd", ctypes.c_uint32),
        ("btf_key_type_id", ctypes.c_uint32),
        ("btf_value_type_id", ctypes.c_uint32),
        ("btf_vmlinux_value_type_id", ctypes.c_uint32),
        ("map_extra", ctypes.c_uint64),
    ]


class MapInfo(ctypes.Structure):  # struct bpf_map_info
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("name", ctypes.c_char * 16),
        ("ifindex", ctypes.c_uint32),
        ("btf_vmlinux_value_type_id", ctypes.c_uint32),
        ("netns_dev", ctypes.c_uint64),
        ("netns_ino", ctypes.c_uint64),
        ("btf_id", ctypes.c_uint32),
        ("btf_key_type_id", ctypes.c_uint32),
        ("btf_value_type_id", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
        ("map_extra", ctypes.c_uint64),
    ]


class ProgInfo(ctypes.Structure):  # struct bpf_prog_info, up to recursion_misses (5.12)
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("tag", ctypes.c_uint8 * 8),
        ("jited_prog_len", ctypes.c_uint32),
        ("xlated_prog_len", ctypes.c_uint32),
        ("jited_prog_insns", ctypes.c_uint64),
        ("xlated_prog_insns", ctypes.c_uint64),
        ("load_time", ctypes.c_uint64),
        ("created_by_uid", ctypes.c_uint32),
        ("nr_map_ids", ctypes.c_uint32),
        ("map_ids", ctypes.c_uint64),
        ("name", ctypes.c_char * 16),
        ("ifindex", ctypes.c_uint32),
        ("gpl_compatible", ctypes.c_uint32),
        ("netns_dev", ctypes.c_uint64),
        ("netns_ino", ctypes.c_uint64),
        ("nr_jited_ksyms", ctypes.c_uint32),
        ("nr_jited_func_lens", ctypes.c_uint32),
        ("jited_ksyms", ctypes.c_uint64),
        ("jited_func_lens", ctypes.c_uint64),
        ("btf_id", ctypes.c_uint32),
        ("func_info_rec_size", ctypes.c_uint32),
        ("func_info", ctypes.c_uint64),
        ("nr_func_info", ctypes.c_uint32),
        ("nr_line_info", ctypes.c_uint32),
        ("line_info", ctypes.c_uint64),
        ("jited_line_info", ctypes.c_uint64),
        ("nr_jited_line_info", ctypes.c_uint32),
        ("line_info_rec_size", ctypes.c_uint32),
        ("jited_line_info_rec_size", ctypes.c_uint32),
        ("nr_prog_tags", ctypes.c_uint32),
        ("prog_tags", ctypes.c_uint64),
        ("run_time_ns", ctypes.c_uint64),
        ("run_cnt", ctypes.c_uint64),
        ("recursion_misses", ctypes.c_uint64),
    ]


class _BtfInfo(ctypes.Structure):  # struct bpf_btf_info
    _fields_ = [
        ("btf", ctypes.c_uint64),
        ("btf_size", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("name", ctypes.c_uint64),
        ("name_len", ctypes.c_uint32),
        ("kernel_btf", ctypes.c_uint32),
    ]


class _InfoAttr(ctypes.Structure):
    _fields_ = [
        ("bpf_fd", ctypes.c_uint32),
        ("info_len", ctypes.c_uint32),
        ("info", ctypes.c_uint64),
    ]


class _BtfLoadAttr(ctypes.Structure):
    _fields_ = [
        ("btf", ctypes.c_uint64),
        ("btf_log_buf", ctypes.c_uint64),
        ("btf_size", ctypes.c_uint32),
        ("btf_log_size", ctypes.c_uint32),
        ("btf_log_level", ctypes.c_uint32),
    ]


def call(cmd: int, attr: ctypes.Structure) -> int:
    """``bpf(cmd, &attr, sizeof attr)``: its result, or BpfError with errno."""
    sysno = _SYS_BPF.get(os.uname().machine)
    if sysno is None:
        raise BpfError(0, f"no bpf() system call number for {os.uname().machine}")
    r = int(_libc.syscall(sysno, cmd, ctypes.byref(attr), ctypes.sizeof(attr)))
    if r < 0:
        e = ctypes.get_errno()
        raise BpfError(e, os.strerror(e))
    return r


def prog_load(attr: ProgLoadAttr, name: str) -> int:
    """Load a program: its fd. Loaded without the verifier's log (a log longer than its
    buffer fails the load with ENOSPC), and only where that fails once more with it, for
    the error's last line."""
    try:
        return call(PROG_LOAD, attr)
    except BpfError as e:
        first = e
    log = ctypes.create_string_buffer(1 << 20)
    attr.log_level, attr.log_size, attr.log_buf = 1, len(log), ctypes.addressof(log)
    try:
        return call(PROG_LOAD, attr)  # (a load that failed once and not twice: keep it)
    except BpfError:
        last = log.value.decode(errors="replace").strip().splitlines()[-1:]
        detail = f"{name}: {first.strerror}" + (f" ({last[0]})" if last else "")
        raise BpfError(first.errno, detail) from None
    finally:
        attr.log_level, attr.log_size, attr.log_buf = 0, 0, 0


def map_info(fd: int) -> MapInfo:
    info = MapInfo()
    call(OBJ_GET_INFO_BY_FD, _InfoAttr(fd, ctypes.sizeof(info), ctypes.addressof(info)))
    return info


def prog_info(fd: int) -> ProgInfo:
    """A loaded program's info; the kernel fills what it has (a field it lacks stays 0)."""
    info = ProgInfo()
    call(OBJ_GET_INFO_BY_FD, _InfoAttr(fd, ctypes.sizeof(info), ctypes.addressof(info)))
    return info


def btf_data(btf_id: int) -> bytes:
    """The raw BTF (header, types, strings) of a loaded BTF object, as it was loaded."""
    fd = call(BTF_GET_FD_BY_ID, _InfoAttr(btf_id, 0, 0))  # (btf_id is the first u32)
    try:
        info = _BtfInfo()
        call(OBJ_GET_INFO_BY_FD, _InfoAttr(fd, ctypes.sizeof(info), ctypes.addressof(info)))
        buf = ctypes.create_string_buffer(info.btf_size)
        info = _BtfInfo(btf=ctypes.addressof(buf), btf_size=len(buf))
        call(OBJ_GET_INFO_BY_FD, _InfoAttr(fd, ctypes.sizeof(info), ctypes.addressof(info)))
        return buf.raw[: info.btf_size]
    finally:
        os.close(fd)


def btf_load(data: bytes) -> int:
    buf = ctypes.create_string_buffer(data, len(data))
    return call(BTF_LOAD, _BtfLoadAttr(btf=ctypes.addressof(buf), btf_size=len(data)))


def map_create(attr: MapCreateAttr) -> int:
    return call(MAP_CREATE, attr)
