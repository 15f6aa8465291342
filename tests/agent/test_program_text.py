"""The BPF program text handed to bcc: bpf/agent.c with its headers by concern inlined (bcc
generates tracepoint types and rewrites map calls in its main file only), and ``#line``
markers that send every line's compiler messages to the file and line it came from."""

from __future__ import annotations

import re
from pathlib import Path

from agent.kernel import loader

_LINE = re.compile(r'^#line (\d+) "([^"]+)"$')


def test_every_line_maps_back_to_its_file_and_line() -> None:
    text = loader.program_text(loader.BPF_SOURCE).decode()
    root = loader.BPF_DIR.parent
    sources: dict[str, list[str]] = {}
    where: tuple[str, int] = ("bpf/agent.c", 1)
    checked: set[str] = set()
    for out in text.split("\n"):
        m = _LINE.match(out)
        if m:
            where = (m.group(2), int(m.group(1)))
            continue
        name, n = where
        lines = sources.setdefault(name, (root / name).read_text().split("\n"))
        assert lines[n - 1] == out, f"{name}:{n}"
        checked.add(name)
        where = (name, n + 1)
    parts = {p.relative_to(root).as_posix() for p in Path(loader.BPF_DIR, "agent").rglob("*.h")}
    assert checked == {"bpf/agent.c"} | parts  # every header is part of the program
    assert '#include "agent/' not in text  # all inlined
