"""Docs check: every command shown in the README and docs/ exists and parses, every
relative link resolves, so the documentation cannot silently rot."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from agent import cli as agent_cli
from collector import cli as collector_cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted(ROOT.glob("*/README.md")),
]
MAKE_TARGETS = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def _commands() -> list[tuple[str, str]]:
    """Shell lines from fenced code blocks (sh/bash/console or bare), prompts stripped."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for lang, block in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
            if lang not in ("", "sh", "bash", "console", "shell"):
                continue
            joined = block.replace("\\\n", " ")
            for raw in joined.splitlines():
                line = raw.split(" #", 1)[0].strip().removeprefix("$ ").strip()
                if re.search(r"\[--|<\w+>", line):
                    continue  # a usage synopsis, not a command
                if re.match(r"(make|\.venv/bin/|parallax-|python -m|node )", line):
                    out.append((f"{doc.relative_to(ROOT)}: {line}", line))
    return out


COMMANDS = _commands()


def test_docs_show_commands() -> None:
    assert any("make demo" in c for _, c in COMMANDS)
    assert any("make test" in c for _, c in COMMANDS)


@pytest.mark.parametrize(("where", "line"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_command_exists_and_parses(where: str, line: str) -> None:
    argv = shlex.split(line)
    prog = argv[0].removeprefix(".venv/bin/")
    if prog == "make":
        for target in argv[1:]:
            if "=" not in target:
                assert target in MAKE_TARGETS, f"{where}: no make target {target}"
    elif prog == "parallax-agent":
        agent_cli._parser().parse_args(argv[1:])
    elif prog == "parallax-collector":
        collector_cli._parser().parse_args(argv[1:])
    elif prog in ("python", "python3") and argv[1] == "-m":
        assert importlib.util.find_spec(argv[2]) is not None, f"{where}: no module {argv[2]}"
    elif prog == "node":
        assert (ROOT / argv[1]).exists(), f"{where}: no {argv[1]}"


def test_relative_links_resolve() -> None:
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)} → {target}"
