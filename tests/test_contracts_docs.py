"""The contract documents agree with the code that implements them."""

from __future__ import annotations

import json

import msgspec
import pytest

from parallax_contracts import CONTRACTS_DIR, beacon, beacon_schema, span_attributes


def test_span_attribute_table_is_current() -> None:
    doc = (CONTRACTS_DIR / "span-attributes.md").read_text()
    assert span_attributes.markdown_table() in doc, (
        "docs/contracts/span-attributes.md is stale: regenerate the table with "
        "python -m parallax_contracts.span_attributes"
    )


def test_span_attribute_units_match_names() -> None:
    for a in span_attributes.ALL:
        if a.name.endswith("_us"):
            assert a.unit == "us" and a.type in ("int", "int[]"), a
        if a.name.endswith("_ns"):
            assert a.unit == "ns" and a.type == "int", a
        assert a.standard or a.name.startswith("parallax."), a


def _beacon(**entry: object) -> dict[str, object]:
    e = {
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "span_id": "00f067aa0ba902b7",
        "kind": "fetch",
        "start_ms": 10.5,
    }
    e.update(entry)
    return {
        "v": 1,
        "site": "demo",
        "session": "abcdefgh1234",
        "time_origin": 1.7e12,
        "entries": [e],
    }


def test_beacon_schema_accepts_a_full_entry() -> None:
    doc = _beacon(
        method="POST",
        url="https://x.test/v1/chat",
        status=200,
        request_start_ms=11,
        response_start_ms=50.25,
        first_chunk_ms=51,
        chunk_ms=[51, 70, 90],
        chunks=3,
        rendered_ms=60,
        coarse=False,
        server_timing=[{"name": "app", "dur_ms": 3}],
    )
    assert beacon.errors(doc) == []


def test_beacon_schema_rejects_bad_input_with_a_reason() -> None:
    assert any("trace_id" in e for e in beacon.errors(_beacon(trace_id="XYZ")))
    assert any("start_ms" in e for e in beacon.errors(_beacon(start_ms=-1)))
    assert beacon.errors({**_beacon(), "v": 3})
    assert beacon.errors({**_beacon(), "v": 2}) == []  # v2 adds fields only
    assert beacon.errors({**_beacon(), "cookie": "secret"})  # unknown fields: new version
    assert beacon.errors(_beacon(kind="grpc"))


def test_beacon_v2_reason_says_why_an_llm_stream_has_no_llm() -> None:
    """An LLM candidate stream the probe's token reader did not read (it is a file loaded on
    demand) says why: v2 only, one of its values, and refused in v1 like llm — by the
    whole-body decoder as by the entry-by-entry path."""
    for why in ("llm_unread", "llm_overflow"):
        doc = {**_beacon(reason=why, chunks=3), "v": 2}
        assert beacon.errors(doc) == []
        assert beacon.decode(json.dumps(doc).encode()).entries[0].reason == why
        v1 = _beacon(reason=why)
        assert any("`reason`" in e for e in beacon.errors(v1)), beacon.errors(v1)
        with pytest.raises(msgspec.ValidationError, match="`reason`"):
            beacon.decode(json.dumps(v1).encode())
    assert beacon.errors({**_beacon(reason="tired"), "v": 2})
    props = beacon_schema.schema(2)["$defs"]["Entry"]["properties"]
    assert set(props["reason"]["enum"]) == {"llm_unread", "llm_overflow"}
    assert "reason" not in beacon_schema.schema(1)["$defs"]["EntryV1"]["properties"]


def test_beacon_schema_is_valid_json_schema() -> None:
    from jsonschema import Draft202012Validator

    for file in beacon.SCHEMA_FILES.values():
        Draft202012Validator.check_schema(json.loads(file.read_text()))


def test_beacon_schema_file_is_generated_from_the_structs() -> None:
    """docs/contracts/beacon.v1.schema.json and beacon.v2.schema.json (what the probe's
    tests read) are exactly what the Structs generate; the command that rewrites them says
    so too."""
    for version, file in beacon.SCHEMA_FILES.items():
        assert file.read_text() == beacon_schema.schema_text(version), (
            f"{file} is stale: regenerate it with python -m parallax_contracts.beacon_schema"
        )
    assert beacon_schema.main(["--check"]) == 0
