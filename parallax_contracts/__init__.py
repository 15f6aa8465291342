"""The contracts every part of Parallax shares, implemented once.

- ``trace_context``: W3C ``traceparent`` parse/format/generate.
- ``routes``: path → low-cardinality route template.
- ``span_attributes``: the OTLP span attributes the agent emits and the collector reads.
- ``beacon``: the browser beacon (v1): the Structs that define it and decode it, and the
  JSON Schema generated from them.

The language-neutral files (test vectors, the generated beacon schema) live in
``docs/contracts/``.
"""

import os
from pathlib import Path

# Editable installs (make setup) read the files in the checkout; an installed wheel or a
# container image points PARALLAX_CONTRACTS_DIR at its copy of docs/contracts.
CONTRACTS_DIR = Path(
    os.environ.get("PARALLAX_CONTRACTS_DIR")
    or Path(__file__).resolve().parent.parent / "docs" / "contracts"
)

__all__ = ["CONTRACTS_DIR"]
