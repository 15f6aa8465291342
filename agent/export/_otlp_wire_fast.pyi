# Type stub for the compiled OTLP attribute loop (_otlp_wire_fast.c; built by
# parallax_contracts/compiled.py).
from collections.abc import Callable
from typing import Any

def configure(any_value: Callable[[Any], bytes]) -> None: ...
def attributes(tag: int, attrs: dict[str, Any]) -> bytes: ...
def record_attributes(
    tag: int,
    rec: dict[str, Any],
    values: tuple[tuple[str, str, bool], ...],
    flags: tuple[tuple[str, str], ...],
) -> bytes: ...
