"""The beacon contract published as JSON Schema (docs/contracts/beacon.v1/v2.schema.json),
generated from the Structs of :mod:`parallax_contracts.beacon`, their one definition:
``python -m parallax_contracts.beacon_schema`` rewrites the files, ``--check`` compares."""

from __future__ import annotations

import argparse
import json
import sys
from functools import cache
from typing import Any

import msgspec

from parallax_contracts.beacon import (
    NO_NUL_PATTERN,
    SCHEMA_FILES,
    VERSION,
    BeaconV1,
    BeaconV2,
    Entry,
    EntryV1,
)


def json_schema(version: int = VERSION) -> dict[str, Any]:
    """The JSON Schema (2020-12) of a beacon of ``version``, as published in docs/contracts:
    msgspec's, with the root inlined, the anchors written for ECMA-262, descriptions on one
    line and no `default: null` (an absent field is not a null one: null is refused). v1 is
    generated from EntryV1: v2's Entry without ``llm`` and ``reason``."""
    generated = msgspec.json.schema(BeaconV1[EntryV1] if version == 1 else BeaconV2[Entry])
    defs: dict[str, Any] = generated["$defs"]
    root = defs.pop(generated["$ref"].rsplit("/", 1)[1])
    out: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://parallax.dev/schemas/beacon.v{version}.json",
        **root,
        "title": f"Parallax browser beacon, version {version}",
        "$defs": defs,
    }
    published: dict[str, Any] = _published(out)
    return published


def _published(node: Any) -> Any:
    if isinstance(node, list):
        return [_published(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "default" and v is None:
            continue
        if k == "description":  # docstrings wrap
            out[k] = " ".join(v.split())
        elif k == "pattern":
            assert v.startswith("^") and v.endswith(r"\Z") and v.count("\\Z") == 1, v
            out[k] = v[:-2] + "$"
        else:
            out[k] = _published(v)
    if out.get("type") == "string" and "pattern" not in out:
        out["pattern"] = (
            NO_NUL_PATTERN  # the beacon module's string rule; patterned fields exclude NUL
        )
    return out


def schema_text(version: int = VERSION) -> str:
    return json.dumps(json_schema(version), indent=2, ensure_ascii=False) + "\n"


@cache
def schema(version: int = VERSION) -> dict[str, Any]:
    """The published schema file of ``version``, as the probe's tests read it (v2)."""
    loaded: dict[str, Any] = json.loads(SCHEMA_FILES[version].read_text())
    return loaded


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m parallax_contracts.beacon_schema",
        description="Write beacon.v1.schema.json and beacon.v2.schema.json from the Structs "
        "(the beacon's one definition).",
    )
    p.add_argument("--check", action="store_true", help="exit 1 if a file is out of date")
    args = p.parse_args(argv)
    stale = 0
    for version, file in SCHEMA_FILES.items():
        text = schema_text(version)
        current = file.read_text() if file.exists() else ""
        if current == text:
            continue
        if args.check:
            print(f"{file} is out of date: run python -m parallax_contracts.beacon_schema")
            stale = 1
        else:
            file.write_text(text)
            print(f"wrote {file}")
    return stale


if __name__ == "__main__":
    sys.exit(main())
