"""A port the collector cannot have is one line and exit 1, before the store opens."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.config import split_hostport
from demo.stack import free_port
from tests.collector.helpers import BIN


def _serve(data_dir: Path, listen: str, admin: str) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN), "serve", "--listen", listen, "--admin-listen", admin]
    return subprocess.run(
        [*argv, "--data-dir", str(data_dir), "--no-plugins"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def client_port() -> Iterator[int]:
    """A port held the way CI lost one: as an outgoing connection's local port (no
    SO_REUSEADDR, not listening), which blocks even a server's SO_REUSEADDR bind."""
    with socket.create_server(("127.0.0.1", 0)) as server, socket.socket() as client:
        client.bind(("127.0.0.1", 0))
        client.connect(server.getsockname())
        yield client.getsockname()[1]


def _one_line(out: str, needle: str) -> None:
    assert needle in out, out
    assert "Traceback" not in out, out
    assert "store:" not in out, out  # refused before the store was opened


def test_a_query_port_held_by_a_connection(tmp_path: Path, client_port: int) -> None:
    r = _serve(tmp_path, f"127.0.0.1:{free_port()}", f"127.0.0.1:{client_port}")
    assert r.returncode == 1
    _one_line(
        r.stderr + r.stdout,
        f"could not listen on 127.0.0.1:{client_port} (--admin-listen): Address already in use",
    )


def test_an_ingest_port_another_server_has(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as other:
        port = other.getsockname()[1]
        r = _serve(tmp_path, f"127.0.0.1:{port}", f"127.0.0.1:{free_port()}")
    assert r.returncode == 1
    _one_line(
        r.stderr + r.stdout,
        f"could not listen on 127.0.0.1:{port} (--listen): Address already in use",
    )


@pytest.mark.parametrize("bad", ["127.0.0.1:99999", "127.0.0.1:http", "4319x"])
def test_an_address_that_is_not_one(tmp_path: Path, bad: str) -> None:
    r = _serve(tmp_path, f"127.0.0.1:{free_port()}", bad)
    assert r.returncode == 1
    _one_line(r.stderr + r.stdout, f"could not listen on {bad} (--admin-listen): {bad!r} is not")


def test_split_hostport() -> None:
    assert split_hostport("4318", "h") == ("h", 4318)
    assert split_hostport(":4318", "h") == ("h", 4318)
    assert split_hostport("[::1]:4318", "h") == ("::1", 4318)
    assert split_hostport("0.0.0.0:0", "h") == ("0.0.0.0", 0)
    with pytest.raises(ValueError, match="not HOST:PORT"):
        split_hostport("127.0.0.1:65536", "h")
