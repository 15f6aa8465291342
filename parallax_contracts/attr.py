"""One span attribute of the contract: its name, type, unit and meaning."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

AttrType = Literal["string", "int", "double", "bool", "int[]", "string[]"]


@dataclass(frozen=True, slots=True)
class Attr:
    name: str
    type: AttrType
    unit: str  # "" where the value has no unit
    doc: str
    standard: bool = False  # an OpenTelemetry semantic-convention name


def record_field(a: Attr) -> str:
    """The agent's JSONL field for an attribute: the name without ``parallax.``, dots as
    underscores (``parallax.gpu.prefill_wait_us`` → ``gpu_prefill_wait_us``,
    ``gen_ai.usage.input_tokens`` → ``gen_ai_usage_input_tokens``)."""
    return a.name.removeprefix("parallax.").replace(".", "_")
