"""Test pages for the probe's browser tests: the probe from /parallax.min.js (or
``probe_src``), one init call, then the page's own script."""

from __future__ import annotations

import json
from typing import Any


def probe_page(
    endpoint: str,
    script: str,
    head: str = "",
    before_probe: str = "",
    after_probe: str = "",
    probe_src: str = "/parallax.min.js",
    **options: Any,
) -> bytes:
    """An HTML page: ``before_probe`` (HTML, e.g. OpenTelemetry), the probe and its init with
    ``options``, ``after_probe`` (HTML), then ``script``; ``<div id=out>`` is there to render
    into."""
    opts = json.dumps({"endpoint": endpoint, "site": "probe-test", **options})
    return f"""<!doctype html>
<html><head><meta charset="utf-8">{head}<title>probe test</title><link rel="icon" href="data:,">
{before_probe}
<script src="{probe_src}"></script>
<script>Parallax.init({opts});</script>
{after_probe}
</head><body><div id="out"></div>
<script>{script}</script>
</body></html>""".encode()
