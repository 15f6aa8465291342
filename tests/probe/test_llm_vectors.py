"""docs/contracts/llm-stream-vectors.json is what the agent's stream reader makes of its
streams today (the probe's node tests hold the probe to it): regenerate it with
``python -m tests.probe.llm_vectors`` when the agent's rules change."""

from __future__ import annotations

from tests.probe import llm_vectors


def test_the_vectors_are_the_agents_reading() -> None:
    assert llm_vectors.FILE.read_text() == llm_vectors.text(), (
        "docs/contracts/llm-stream-vectors.json is stale: python -m tests.probe.llm_vectors"
    )


def test_the_vectors_cover_every_dialect_ending_and_no_dialect() -> None:
    v = llm_vectors.vectors()["vectors"]
    assert {x["expect"]["dialect"] for x in v} == {
        "openai.chat", "anthropic.messages", "openai.responses", "ollama", None,
    }  # fmt: skip
    assert {x["expect"].get("end") for x in v} >= {"complete", "server_cut", "error"}
    # a first answer token that is not the first output token (reasoning first)
    assert any(x["expect"].get("first_token") != x["expect"].get("first_output") for x in v)
