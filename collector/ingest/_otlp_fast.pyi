# Type stub for the compiled OTLP span decoder (_otlp_fast.c; built by
# parallax_contracts/compiled.py).
from collections.abc import Callable
from typing import Any

def configure(
    names: tuple[str, ...],
    route: Callable[[str, str | None], str],
    max_duration_ns: int,
    future_slack_ns: int,
) -> None: ...
def parse(
    body: bytes, received_ms: int, oldest_ns: int, now_ns: int
) -> tuple[list[tuple[Any, ...]], list[str], int] | None: ...
