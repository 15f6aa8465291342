"""Every generated dashboard, as the JSON text committed under dashboards/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from dashboards import request, route, sla

DIR = Path(__file__).resolve().parent
GENERATED = {
    "parallax-sla.json": sla.build,
    "parallax-route.json": route.build,
    "parallax-request.json": request.build,
}


def as_dict(name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(GENERATED[name]().build(), cls=JSONEncoder))
    return out


def render_all() -> dict[str, str]:
    return {
        name: json.dumps(as_dict(name), indent=1, ensure_ascii=False) + "\n" for name in GENERATED
    }
