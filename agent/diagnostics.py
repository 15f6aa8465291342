"""How the agent names an unexpected error in its log without quoting request data."""

from __future__ import annotations

import os


def where(e: BaseException) -> str:
    """Where an exception was raised, as ``file:line in function`` (its innermost frame):
    enough to find the bug, and no data from the request (``str(e)`` may quote a header
    value or a path)."""
    tb = e.__traceback__
    if tb is None:
        return "unknown place"
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return f"{os.path.basename(code.co_filename)}:{tb.tb_lineno} in {code.co_name}"
