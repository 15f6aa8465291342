"""Route templates: turn a request path into a low-cardinality route, the one implementation.

A source that knows its route (``http.route`` from a framework) wins. Otherwise each path
segment that looks like an identifier becomes ``{id}``: all digits, a UUID, or hex of 8+
characters containing a digit (``deadbeef`` has no digit and stays, like an ordinary word;
``facade12`` is an id).
"""

from __future__ import annotations

import re

ID = "{id}"
_NUMERIC = re.compile(r"[0-9]+")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_HEX_ID = re.compile(r"[0-9a-fA-F]{8,}")
_DIGIT = re.compile(r"[0-9]")


def _segment(seg: str) -> str:
    if _NUMERIC.fullmatch(seg) or _UUID.fullmatch(seg):
        return ID
    if _HEX_ID.fullmatch(seg) and _DIGIT.search(seg):
        return ID
    return seg


def route_template(path: str, http_route: str | None = None) -> str:
    """The route for ``path`` (query string and fragment dropped), or ``http_route`` if given."""
    if http_route:
        return http_route
    path = path.split("?", 1)[0].split("#", 1)[0]
    if not path.startswith("/"):
        path = "/" + path
    return "/".join(_segment(s) for s in path.split("/"))
