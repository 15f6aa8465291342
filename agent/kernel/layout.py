"""The ring records' layouts, read from the C headers that define them — the one
declaration (bpf/agent/output.h, state.h, tls.h, proto/http2.h, proto/stream.h): no hand
mirror to keep in step. A small reader of the subset those structs use (``u8``…``u64``,
``s64``, nested ``struct px_*``, fixed arrays whose sizes are numbers, ``#define``d
constants or their products), with the compiler's natural alignment on x86-64 and arm64.
``agent.kernel.events`` builds its ``struct`` formats from it at import; a test holds it to
the compiled program's own view of the same structs (bcc's map leaf types)."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from functools import cache
from pathlib import Path

BPF_DIR = Path(__file__).resolve().parents[2] / "bpf"
HEADERS = (
    "agent/defs.h",
    "agent/state.h",
    "agent/output.h",
    "agent/tls.h",
    "agent/proto/http2.h",
    "agent/proto/stream.h",
)
# (format char, size) of the scalar types the structs use; alignment = size
_SCALARS = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q", "s64": "q"}
_STRUCT = re.compile(r"^struct\s+(px_\w+)\s*\{(.*?)^\};", re.S | re.M)
_DEFINE = re.compile(r"^#define\s+(PX_\w+)\s+(\d+)\b", re.M)
_FIELD = re.compile(r"^\s*(struct\s+px_\w+|\w+)\s+(\w+)((?:\[[^\]]+\])*)\s*;")
# sizes the loader passes with -D (the layout before the first array they size is fixed)
UNSIZED = frozenset({"PX_HEAD_WINDOW", "PX_RESP_WINDOW", "PX_H2_WINDOW", "PX_BODY_WINDOW"})


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    offset: int
    fmt: str  # struct format of one element ("" for a nested struct)
    count: int  # elements (1: a scalar); -1: sized by a -D constant (the record's tail)
    size: int  # bytes in all (0 for a tail)


@dataclass(frozen=True, slots=True)
class Layout:
    name: str
    fields: tuple[Field, ...]
    size: int  # up to the tail (a variable-sized data array), or the whole struct
    align: int

    def field(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)

    def fmt(self, start: str, stop: str | None = None) -> struct.Struct:
        """The little-endian format of the fields from ``start`` up to ``stop`` (or the
        end), with the padding between them."""
        names = [f.name for f in self.fields]
        i = names.index(start)
        j = names.index(stop) if stop is not None else len(names)
        out, pos = "<", self.fields[i].offset
        for f in self.fields[i:j]:
            if f.count < 0:
                break
            if f.offset > pos:
                out += f"{f.offset - pos}x"
            out += f"{f.count}s" if f.fmt == "B" and f.count > 1 else f.fmt * f.count
            pos = f.offset + f.size
        return struct.Struct(out)


@cache
def _sources() -> tuple[dict[str, str], dict[str, int]]:
    text = "\n".join((BPF_DIR / h).read_text() for h in HEADERS)
    text = re.sub(r"//[^\n]*", "", text)
    bodies = {m.group(1): m.group(2) for m in _STRUCT.finditer(text)}
    consts = {m.group(1): int(m.group(2)) for m in _DEFINE.finditer(text)}
    return bodies, consts


def _count(dims: str, consts: dict[str, int]) -> int:
    n = 1
    for dim in re.findall(r"\[([^\]]+)\]", dims):
        for raw in dim.split("*"):
            term = raw.strip()
            if term in UNSIZED:
                return -1
            n *= int(term) if term.isdigit() else consts[term]
    return n


@cache
def layout(name: str) -> Layout:
    bodies, consts = _sources()
    fields: list[Field] = []
    pos, align = 0, 1
    for line in bodies[name].splitlines():
        if line.strip().startswith("#"):
            raise ValueError(f"{name}: a preprocessor line inside the struct: {line.strip()}")
        m = _FIELD.match(line)
        if m is None:
            continue
        ctype, fname, dims = m.groups()
        count = _count(dims, consts)
        if ctype.startswith("struct"):
            sub = layout(ctype.split()[1])
            a, esize, fmt = sub.align, sub.size, ""
        else:
            fmt = _SCALARS[ctype]
            a = esize = struct.calcsize(fmt)
        pos = (pos + a - 1) // a * a
        align = max(align, a)
        if count < 0:  # the record's tail: its size is the loader's
            fields.append(Field(fname, pos, fmt, -1, 0))
            return Layout(name, tuple(fields), pos, align)
        fields.append(Field(fname, pos, fmt, count, esize * count))
        pos += esize * count
    size = (pos + align - 1) // align * align
    return Layout(name, tuple(fields), size, align)


def constant(name: str) -> int:
    return _sources()[1][name]
