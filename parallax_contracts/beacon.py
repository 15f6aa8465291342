"""The browser beacon contract (v1): the JSON Schema in docs/contracts, loaded once.

The collector validates each beacon against it at the edge; the probe's TypeScript tests
read the same file, so the two sides cannot drift.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator

from parallax_contracts import CONTRACTS_DIR

SCHEMA_FILE = CONTRACTS_DIR / "beacon.v1.schema.json"
VERSION = 1


@cache
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_FILE.read_text())
    return loaded


@cache
def validator() -> Draft202012Validator:
    return Draft202012Validator(schema())


def errors(doc: object) -> list[str]:
    """One line per violation (path: message), empty when ``doc`` is a valid v1 beacon."""
    out = []
    for e in sorted(validator().iter_errors(doc), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        out.append(f"{where}: {e.message}")
    return out
