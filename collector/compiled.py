"""The collector's optional compiled helpers, each beside its C source and built by
``python -m collector.ingest.build_fast`` (run by setup): imported when built, not turned off
by its environment switch and not older than its source. Without one the collector runs its
Python reference, only slower, and says which it uses in its start-up log.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

REBUILD = "python -m collector.ingest.build_fast"


def load(name: str, source: Path, switch: str) -> tuple[ModuleType | None, str]:
    """(the module ``name``, "") or (None, why not: turned off, not built, stale)."""
    if os.environ.get(switch, "1") == "0":
        return None, f"turned off ({switch}=0)"
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None, f"not built ({REBUILD})"
    so = Path(module.__file__ or source)
    if so.suffix != ".so":  # a source checkout's stray module of that name: not a build
        return None, f"not built ({REBUILD})"
    # A build older than its source (a pull without `make setup`) may not match the Python
    # that calls it.
    if source.exists() and so.stat().st_mtime < source.stat().st_mtime:
        return None, f"{so.name} is older than {source.name}: rebuild it ({REBUILD})"
    return module, ""
