# Type stub for the compiled Native insert encoder (_native_fast.c; built by
# parallax_contracts/compiled.py).
from typing import Any

def encode(data: list[Any], by_rows: bool, plan: tuple[tuple[bytes, int], ...]) -> bytes | None: ...
