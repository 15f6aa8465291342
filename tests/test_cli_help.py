"""The console scripts exist and their --help says what the tool does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def test_agent_help() -> None:
    p = subprocess.run(
        [str(BIN / "parallax-agent"), "--help"], capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 0
    assert "doctor" in p.stdout and "Privacy" in p.stdout and "kernel" in p.stdout


def test_collector_help() -> None:
    p = subprocess.run(
        [str(BIN / "parallax-collector"), "--help"], capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 0
    assert "PARALLAX_STORE" in p.stdout and "chdb://" in p.stdout
