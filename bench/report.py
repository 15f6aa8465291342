"""Write one benchmark's section of docs/benchmarks.md, leaving the others untouched.

Each benchmark owns the text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def machine() -> str:
    """One line describing where the figures were measured."""
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} CPUs ({cpu}), {mem_gb:.0f} GiB, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def git_rev() -> str:
    p = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=DOC.parent
    )
    return p.stdout.strip() or "?"


def write_section(name: str, markdown: str) -> None:
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    body = f"{begin}\n{markdown.rstrip()}\n{end}"
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = (
        pattern.sub(lambda _: body, text)
        if pattern.search(text)
        else f"{text.rstrip()}\n\n{body}\n"
    )
    DOC.write_text(text)
