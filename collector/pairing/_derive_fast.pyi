# Type stub for the compiled one-hop pair derivation (_derive_fast.c; built by
# parallax_contracts/compiled.py).
from collections.abc import Callable
from typing import Any

from collector.store.rows import EntryRow, PairRow, SpanRow

def configure(
    pair_type: type[PairRow],
    entry_fields: tuple[str, ...],
    span_fields: tuple[str, ...],
    constants: dict[str, Any],
    llm_names: tuple[str, ...],
    pair_columns: Callable[..., tuple[Any, ...]],
    attr_names: tuple[str, str, str, str],
) -> None: ...
def derive_one(entry: EntryRow, span: SpanRow, sample_th: int, version: int) -> PairRow | None: ...
