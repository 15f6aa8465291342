"""Expected failures of `parallax-agent run` say one line and exit non-zero; a signal during
the compile ends the agent quietly."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

AGENT = str(Path(sys.executable).parent / "parallax-agent")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--jsonl", "/nonexistent/dir/x.jsonl"], "cannot write /nonexistent/dir/x.jsonl"),
        (["--metrics-addr", "localhost"], "expected HOST:PORT"),
    ],
)
def test_bad_output_is_one_line(args: list[str], says: str) -> None:
    p = subprocess.run(
        [AGENT, "run", "--port", "1", *args], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 1
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0], p.stderr


@pytest.mark.ebpf
@pytest.mark.parametrize("delay_s", [0.1, 0.3])
def test_sigint_while_starting_exits_quietly(tmp_path: Path, delay_s: float) -> None:
    """0.1 s: during the imports (the CLI's handler keeps it for the agent's first look);
    0.3 s: while the programs are being compiled."""
    p = subprocess.Popen(
        [
            AGENT,
            "run",
            "--port",
            "1",
            "--metrics-addr",
            "127.0.0.1:0",
            "--jsonl",
            str(tmp_path / "r.jsonl"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(delay_s)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
