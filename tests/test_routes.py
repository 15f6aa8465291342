"""Route templates: the shared vectors and properties."""

from __future__ import annotations

import json
import re

from hypothesis import given
from hypothesis import strategies as st

from parallax_contracts import CONTRACTS_DIR
from parallax_contracts.routes import ID, route_template

VECTORS = json.loads((CONTRACTS_DIR / "route-vectors.json").read_text())["vectors"]

segment = st.one_of(
    st.integers(0, 10**12).map(str),
    st.uuids().map(str),
    st.text(alphabet="0123456789abcdef", min_size=8, max_size=40),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_.", min_size=1, max_size=12),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.~", max_size=12),
)
paths = st.lists(segment, max_size=8).map(lambda segs: "/" + "/".join(segs))


def test_shared_vectors() -> None:
    assert len(VECTORS) >= 20
    for v in VECTORS:
        assert route_template(v["path"], v["http_route"]) == v["route"], v


@given(paths)
def test_idempotent_and_shape_preserving(path: str) -> None:
    r = route_template(path)
    assert route_template(r) == r
    assert r.count("/") == path.count("/")


@given(paths)
def test_no_identifier_survives(path: str) -> None:
    for seg in route_template(path).split("/"):
        assert not re.fullmatch(r"[0-9]+", seg)
        assert not (re.fullmatch(r"[0-9a-fA-F]{8,}", seg) and re.search(r"[0-9]", seg))


@given(paths, st.text(max_size=20))
def test_query_is_dropped(path: str, query: str) -> None:
    assert route_template(f"{path}?{query}") == route_template(path)


@given(paths)
def test_source_route_wins(path: str) -> None:
    assert route_template(path, "/given/{x}") == "/given/{x}"
    assert ID not in route_template("/v1/chat")
