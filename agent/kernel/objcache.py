"""The agent's compiled BPF program, kept between starts: bcc's clang compile is ~2.5 s of
a ~4 s start, and a restarted agent (a crash loop, a rollout, every test) compiled the
same text with the same flags each time.

bcc 0.26 cannot load an object it compiled before. So after a compile whose programs
loaded, this saves what bcc produced: each function's instructions (its map references
turned into map indices), each map's attributes as the kernel holds them, bcc's
descriptions of each table's key and leaf, and the module's BTF (the task-local storage
map needs it). A later start with the same key creates the maps, loads that BTF and the
programs with ``bpf()`` itself (agent.kernel.sys_bpf), and goes on through bcc's Python
API as after a compile: ``CachedBPF`` is a bcc ``BPF`` whose module is that file.

The key is the program text, the -D flags (the BTF offsets among them), bcc's version and
library, and the running kernel (/proc/version). A root process loads what the file says,
so the cache is read only where its directory and the file belong to this user and no
one else may write them; anything else is compiled as before. The verifier checks every
program either way.

    PARALLAX_AGENT_BPF_CACHE=DIR   the directory (default: the cache dir's ``bpf/``)
    PARALLAX_AGENT_BPF_CACHE=off   compile at every start
"""

from __future__ import annotations

import atexit
import base64
import ctypes
import hashlib
import json
import logging
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bcc import BPF, lib
from bcc import table as bcc_table
from bcc.version import __version__ as BCC_VERSION  # noqa: N812

from agent.kernel import btf, headers, sys_bpf

log = logging.getLogger("parallax.agent")
ENV = "PARALLAX_AGENT_BPF_CACHE"
FORMAT = 1
# CachedBPF stands in for bcc's BPF object: only with the bcc whose attributes it sets
BCC_TESTED = {"0.26.0"}
_LD_IMM64, _PSEUDO_MAP_FD = 0x18, 1
# bcc loads a program under its function's name less these prefixes (15 bytes kept)
_NAME_PREFIXES = (b"tracepoint__", b"raw_tracepoint__")
# map type → bcc's table class, as bcc's own Table() chooses (it asks the module for the type)
_TABLES: dict[int, type] = {
    bcc_table.BPF_MAP_TYPE_HASH: bcc_table.HashTable,
    bcc_table.BPF_MAP_TYPE_ARRAY: bcc_table.Array,
    bcc_table.BPF_MAP_TYPE_PERCPU_HASH: bcc_table.PerCpuHash,
    bcc_table.BPF_MAP_TYPE_PERCPU_ARRAY: bcc_table.PerCpuArray,
    bcc_table.BPF_MAP_TYPE_LRU_HASH: bcc_table.LruHash,
    bcc_table.BPF_MAP_TYPE_LRU_PERCPU_HASH: bcc_table.LruPerCpuHash,
    bcc_table.BPF_MAP_TYPE_RINGBUF: bcc_table.RingBuf,
}
_PER_CPU = {
    bcc_table.BPF_MAP_TYPE_PERCPU_HASH,
    bcc_table.BPF_MAP_TYPE_PERCPU_ARRAY,
    bcc_table.BPF_MAP_TYPE_LRU_PERCPU_HASH,
}


# the module's table list, which bcc's Python does not declare: declared on a handle of
# our own (bcc's function objects stay as bcc set them)
_mod = ctypes.CDLL(lib._name)
_mod.bpf_num_tables.restype = ctypes.c_size_t
_mod.bpf_num_tables.argtypes = [ctypes.c_void_p]
for _fn, _res in (
    ("bpf_table_name", ctypes.c_char_p),
    ("bpf_table_fd_id", ctypes.c_int),
    ("bpf_table_key_desc_id", ctypes.c_char_p),
    ("bpf_table_leaf_desc_id", ctypes.c_char_p),
):
    getattr(_mod, _fn).restype = _res
    getattr(_mod, _fn).argtypes = [ctypes.c_void_p, ctypes.c_size_t]


class Uncachable(Exception):  # noqa: N818  (a reason, said once in the log)
    """What this module cannot save or load (a reason, not a failure of the agent)."""


@dataclass(frozen=True)
class MapSpec:
    name: str
    type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    btf_key_type_id: int
    btf_value_type_id: int
    map_extra: int
    key_desc: str
    leaf_desc: str


def directory() -> Path | None:
    env = os.environ.get(ENV, "")
    if env == "off":
        return None
    return Path(env) if env else headers.cache_dir() / "bpf"


def key(text: bytes, cflags: list[str]) -> str:
    h = hashlib.sha256()
    for part in (str(FORMAT), BCC_VERSION, _library_identity(), _kernel_identity()):
        h.update(part.encode() + b"\0")
    h.update(b"\0".join(f.encode() for f in cflags) + b"\0\0")
    h.update(text)
    return h.hexdigest()


def _library_identity() -> str:
    """The libbcc this process mapped (its path, size and mtime): bcc's code generator."""
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split(maxsplit=5)[-1]
            if "/libbcc.so" in path:
                st = os.stat(path)
                return f"{path}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        pass
    return "libbcc"


def _kernel_identity() -> str:
    try:
        return Path("/proc/version").read_text().strip()
    except OSError:
        return os.uname().release


def compile_or_load(bpf_class: Any, text: bytes, cflags: list[str]) -> Any:
    """bcc's ``bpf_class(text=..., cflags=...)``, from the cache where it holds this key;
    compiled (and then saved) otherwise. Raises what the compile raises."""
    d = directory()
    if d is None or bpf_class is not BPF or BCC_VERSION not in BCC_TESTED:
        return bpf_class(text=text, cflags=cflags)
    path = d / f"{key(text, cflags)}.json"
    try:
        b = CachedBPF(_read(d, path))
        log.info("BPF program loaded from the cache (%s): not compiled", path.name[:12])
        return b
    except FileNotFoundError:
        pass
    except sys_bpf.BpfError as e:  # (a privilege short, say: the compile's load will say)
        log.info("BPF program cache %s: the kernel refused it (%s): compiling", path.name, e)
    except (Uncachable, OSError, ValueError, KeyError, TypeError) as e:
        log.warning("BPF program cache %s not used (%s): compiling", path, e)
    except Exception as e:  # noqa: BLE001  (bcc's attach raises bare Exception)
        log.warning("BPF program cache %s did not load (%s): compiling", path, e)
    b = bpf_class(text=text, cflags=cflags)
    try:
        _write(d, path, dump(b))
        _prune(d, keep=path)
        log.info("compiled BPF program kept for the next start (%s)", path.name[:12])
    except (Uncachable, OSError) as e:
        log.info("compiled BPF program not kept (%s)", e)
    return b


KEEP = 8  # programs kept per directory, the most recently written: a kernel or bcc upgrade,
# or a changed flag, leaves the old ones behind


def _prune(d: Path, keep: Path) -> None:
    def written(p: Path) -> int:
        try:
            return p.stat().st_mtime_ns
        except OSError:  # (another agent's prune took it)
            return 0

    for p in sorted(d.glob("*.json"), key=written, reverse=True)[KEEP:]:
        if p != keep:
            p.unlink(missing_ok=True)


def _safe(st: os.stat_result, what: Path) -> None:
    """Ours alone: owned by this user, written by no one else."""
    if st.st_uid != os.geteuid():
        raise Uncachable(f"{what} belongs to uid {st.st_uid}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Uncachable(f"{what} is writable by others ({stat.filemode(st.st_mode)})")


def _read(d: Path, path: Path) -> dict[str, Any]:
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise Uncachable(f"{d} is not a directory")
    _safe(st, d)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        _safe(os.fstat(f.fileno()), path)
        obj: dict[str, Any] = json.loads(f.read())
    if obj.get("format") != FORMAT:
        raise Uncachable(f"format {obj.get('format')}")
    return obj


def _write(d: Path, path: Path, obj: dict[str, Any]) -> None:
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    _safe(os.lstat(d), d)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")  # (mode 0600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f)
        os.replace(tmp, path)  # whole or not at all: two agents starting at once both write
    except BaseException:
        os.unlink(tmp)
        raise


def dump(b: Any) -> dict[str, Any]:
    """What a compiled bcc module holds, as ``CachedBPF`` reads it back."""
    mod = b.module
    maps: list[dict[str, Any]] = []
    index: dict[int, int] = {}
    btf_ids: set[int] = set()
    for i in range(_mod.bpf_num_tables(mod)):
        name = _mod.bpf_table_name(mod, i)
        fd = _mod.bpf_table_fd_id(mod, i)
        info = sys_bpf.map_info(fd)
        if info.btf_id:
            btf_ids.add(info.btf_id)
        index[fd] = i
        spec = MapSpec(
            name=name.decode(),
            type=info.type,
            key_size=info.key_size,
            value_size=info.value_size,
            max_entries=info.max_entries,
            flags=info.map_flags,
            btf_key_type_id=info.btf_key_type_id if info.btf_id else 0,
            btf_value_type_id=info.btf_value_type_id if info.btf_id else 0,
            map_extra=info.map_extra,
            key_desc=(_mod.bpf_table_key_desc_id(mod, i) or b"").decode(),
            leaf_desc=(_mod.bpf_table_leaf_desc_id(mod, i) or b"").decode(),
        )
        maps.append(spec.__dict__)
    if len(btf_ids) > 1:
        raise Uncachable(f"maps in {len(btf_ids)} BTF objects")
    funcs: dict[str, str] = {}
    for i in range(lib.bpf_num_functions(mod)):
        name = lib.bpf_function_name(mod, i)
        if name.startswith((b"kprobe__", b"kretprobe__", b"kfunc__", b"kretfunc__", b"lsm__")):
            raise Uncachable(f"{name.decode()}: only tracepoint programs are loaded from a cache")
        funcs[name.decode()] = base64.b64encode(_unrelocate(b.dump_func(name), index)).decode()
    return {
        "format": FORMAT,
        "license": lib.bpf_module_license(mod).decode(),
        "kern_version": int(lib.bpf_module_kern_version(mod)),
        "btf": base64.b64encode(sys_bpf.btf_data(btf_ids.pop())).decode() if btf_ids else None,
        "maps": maps,
        "funcs": funcs,
    }


def _map_refs(code: bytearray) -> list[int]:
    """Offsets of the ``imm`` of each map reference (``ld_imm64``, src BPF_PSEUDO_MAP_FD);
    Uncachable at any other pseudo source (map values, BTF ids, calls)."""
    out: list[int] = []
    off = 0
    while off < len(code):
        if code[off] == _LD_IMM64:
            src = code[off + 1] >> 4
            if src == _PSEUDO_MAP_FD:
                out.append(off + 4)
            elif src != 0:
                raise Uncachable(f"ld_imm64 with pseudo source {src}")
            off += 16
        else:
            off += 8
    return out


def _unrelocate(code_bytes: bytes, index: dict[int, int]) -> bytes:
    code = bytearray(code_bytes)
    for at in _map_refs(code):
        fd = int.from_bytes(code[at : at + 4], "little", signed=True)
        if fd not in index:
            raise Uncachable(f"a map reference to fd {fd}, not one of the module's tables")
        code[at : at + 4] = index[fd].to_bytes(4, "little")
    return bytes(code)


def _relocate(code_bytes: bytes, fds: list[int]) -> bytes:
    code = bytearray(code_bytes)
    for at in _map_refs(code):
        code[at : at + 4] = fds[int.from_bytes(code[at : at + 4], "little")].to_bytes(4, "little")
    return bytes(code)


class CachedBPF(BPF):  # type: ignore[misc]
    """bcc's BPF object over a saved compile: maps created, BTF loaded, tracepoint
    programs loaded and attached as bcc's constructor does; the rest through bcc's own
    methods, which reach the module only through what is overridden here."""

    def __init__(self, obj: dict[str, Any]) -> None:
        # bcc's BPF.__init__ (0.26) sets these and then compiles: everything but the compile
        self.kprobe_fds: dict[Any, Any] = {}
        self.uprobe_fds: dict[Any, Any] = {}
        self.tracepoint_fds: dict[Any, Any] = {}
        self.raw_tracepoint_fds: dict[Any, Any] = {}
        self.kfunc_entry_fds: dict[Any, Any] = {}
        self.kfunc_exit_fds: dict[Any, Any] = {}
        self.lsm_fds: dict[Any, Any] = {}
        self.perf_buffers: dict[Any, Any] = {}
        self.open_perf_events: dict[Any, Any] = {}
        self._ringbuf_manager = None
        self.tracefile = None
        self.debug = 0
        self.funcs: dict[bytes, Any] = {}
        self.tables: dict[bytes, Any] = {}
        self.module = None
        self._license = ctypes.create_string_buffer(obj["license"].encode())
        self._kern_version = int(obj["kern_version"])
        self._btf_fd = -1
        self._func_ids: dict[str, int] = {}
        self._maps: list[tuple[MapSpec, int]] = []
        atexit.register(self.cleanup)
        try:
            if obj["btf"]:
                data = base64.b64decode(obj["btf"])
                self._btf_fd = sys_bpf.btf_load(data)
                self._func_ids = btf.func_ids(data)
            for m in obj["maps"]:
                spec = MapSpec(**m)
                self._maps.append((spec, self._create(spec)))
            fds = [fd for _, fd in self._maps]
            self._code = {
                name.encode(): _relocate(base64.b64decode(code), fds)
                for name, code in obj["funcs"].items()
            }
            self._trace_autoload()
        except BaseException:
            self.cleanup()
            raise

    def _create(self, m: MapSpec) -> int:
        btf = self._btf_fd >= 0 and m.btf_value_type_id > 0
        return sys_bpf.map_create(
            sys_bpf.MapCreateAttr(
                map_type=m.type,
                key_size=m.key_size,
                value_size=m.value_size,
                max_entries=m.max_entries,
                map_flags=m.flags,
                map_name=m.name.encode()[:15],
                btf_fd=self._btf_fd if btf else 0,
                btf_key_type_id=m.btf_key_type_id if btf else 0,
                btf_value_type_id=m.btf_value_type_id if btf else 0,
                map_extra=m.map_extra,
            )
        )

    def _trace_autoload(self) -> None:
        for name in self._code:
            if name.startswith(b"tracepoint__"):
                fn = self.load_func(name, BPF.TRACEPOINT)
                tp = name[len(b"tracepoint__") :].replace(b"__", b":")
                self.attach_tracepoint(tp=tp, fn_name=fn.name)
            elif name.startswith(b"raw_tracepoint__"):
                fn = self.load_func(name, BPF.RAW_TRACEPOINT)
                self.attach_raw_tracepoint(tp=name[len(b"raw_tracepoint__") :], fn_name=fn.name)

    def load_func(
        self, func_name: bytes | str, prog_type: int, device: Any = None, attach_type: int = -1
    ) -> Any:
        name = func_name.encode() if isinstance(func_name, str) else func_name
        if name in self.funcs:
            return self.funcs[name]
        code = self.dump_func(name)
        buf = ctypes.create_string_buffer(code, len(code))
        short = name
        for prefix in _NAME_PREFIXES:
            short = short.removeprefix(prefix)
        attr = sys_bpf.ProgLoadAttr(
            prog_type=prog_type,
            insn_cnt=len(code) // 8,
            insns=ctypes.addressof(buf),
            license=ctypes.addressof(self._license),
            kern_version=self._kern_version,
            prog_name=short[:15],
            expected_attach_type=max(attach_type, 0),
        )
        # its function's BTF, as bcc gives it: bpftool and the kernel then name the
        # program in full (the load names it in 15 bytes)
        func = (ctypes.c_uint32 * 2)(0, self._func_ids.get(name.decode(), 0))
        if func[1]:
            attr.prog_btf_fd, attr.func_info_rec_size = self._btf_fd, 8
            attr.func_info, attr.func_info_cnt = ctypes.addressof(func), 1
        try:
            fd = sys_bpf.prog_load(attr, name.decode())
        except sys_bpf.BpfError as e:
            raise Exception(f"Failed to load BPF program {name.decode()}: {e.strerror}") from None
        fn = BPF.Function(self, name, fd)
        self.funcs[name] = fn
        return fn

    def dump_func(self, func_name: bytes | str) -> bytes:
        name = func_name.encode() if isinstance(func_name, str) else func_name
        if name not in self._code:
            raise Exception(f"Unknown program {name.decode()}")
        return self._code[name]

    def get_table(
        self, name: bytes | str, keytype: Any = None, leaftype: Any = None, reducer: Any = None
    ) -> Any:
        want = name.decode() if isinstance(name, bytes) else name
        i = next((i for i, (m, _) in enumerate(self._maps) if m.name == want), -1)
        if i < 0:
            raise KeyError(name)
        m, fd = self._maps[i]
        cls = _TABLES.get(m.type)
        if cls is None:
            raise Exception(f"Unknown table type {m.type}")
        key_t = keytype or BPF._decode_table_type(json.loads(m.key_desc))
        leaf_t = leaftype or BPF._decode_table_type(json.loads(m.leaf_desc))
        extra = {"reducer": reducer} if m.type in _PER_CPU else {}
        ring = m.type == bcc_table.BPF_MAP_TYPE_RINGBUF
        args = (self, i, fd, key_t, leaf_t) + ((name,) if ring else ())
        t = cls(*args, **extra)
        # (bcc's TableBase asks the module for these: there is none)
        t.ttype, t.flags, t.max_entries = m.type, m.flags, m.max_entries
        return t

    def close(self) -> None:
        for name, fn in list(self.funcs.items()):
            os.close(fn.fd)
            del self.funcs[name]
        for _, fd in self._maps:
            os.close(fd)
        self._maps = []
        if self._btf_fd >= 0:
            os.close(self._btf_fd)
            self._btf_fd = -1
