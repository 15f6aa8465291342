"""The plugin hook: a failing ``check`` stops serve with one line, before anything opens."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from collector.config import Settings
from collector.plugins import Plugin, load
from collector.service import run


def test_plugin_check_failure_stops_serve(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def check(settings: Settings) -> None:
        raise ValueError("sla.routes[0].band_ms: must be positive")

    settings = Settings(listen="127.0.0.1:0", admin_listen="127.0.0.1:0", data_dir=tmp_path)
    with caplog.at_level(logging.ERROR, logger="parallax.collector"):
        assert run(settings, [Plugin(name="sla", check=check)]) == 2
    assert "sla: sla.routes[0].band_ms: must be positive" in caplog.text
    assert not any((tmp_path / "chdb").iterdir())  # the embedded store was never opened


def test_absent_plugin_module_is_skipped() -> None:
    assert load(("collector.no_such_plugin",)) == []
