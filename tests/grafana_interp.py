"""What Grafana and the ClickHouse plugin make of a panel's SQL before ClickHouse sees it.

Three passes, in the order they run (read from the sources, not guessed):

1. The plugin's frontend, ``applyConditionalAll`` (grafana/clickhouse-datasource
   src/data/CHDatasource.ts): each ``$__conditionalAll(cond, $var)``, last first, becomes
   ``1=1`` when the variable's current value, as a string, is ``$__all`` or empty, else
   ``cond``; the text is swapped with JavaScript's ``String.replace`` (first occurrence, and
   ``$&``/``$'``/``$```/``$$`` in the replacement are special).
2. Grafana's template service (``TemplateSrv.replace``): ``$var``, ``${var}``,
   ``${var:format}``. A multi-value variable with "All" selected expands to every option's
   value, or — with a custom all value — to that value *unformatted*. Formats: the
   plugin's default (an array becomes ``'a','b'``, a string stays raw), ``singlequote``
   (each value quoted, ``'`` escaped as ``\\'``), ``raw``, ``csv``, ``percentencode``. A name
   that is no variable stays as written (``$__interval_s`` etc. reach the backend).
3. The plugin's backend macros (pkg/macros/macros.go on macropro): ``$__timeFilter(c)`` →
   ``c >= toDateTime(from) AND c <= toDateTime(to)`` (whole seconds), ``$__timeFilter_ms``,
   ``$__fromTime``/``$__toTime`` (``toDateTime(s)``), ``_ms`` variants
   (``fromUnixTimestamp64Milli(ms)``), ``$__dateFilter``, ``$__timeInterval(c)`` →
   ``toStartOfInterval(toDateTime(c), INTERVAL n second)`` and ``$__interval_s`` → ``n``
   (the query interval in whole seconds, at least 1). An unknown ``$__`` name stays.

``interpolate`` then refuses what would reach ClickHouse unexpanded (a ``$`` token left
over) and a macro inside a string literal, so a typo fails the test instead of the panel.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

ALL = "$__all"


@dataclass(frozen=True)
class Variable:
    """A dashboard variable's state: its current value and, for "All", its options."""

    name: str
    value: str | list[str]
    options: tuple[str, ...] = ()
    all_value: str | None = None


@dataclass(frozen=True)
class Query:
    """What the backend receives beside the SQL: the time range and the interval."""

    start: datetime
    end: datetime
    interval_s: float


# -- 1. conditionalAll (frontend) ---------------------------------------------------------
def _macro_args(text: str, open_at: int) -> list[str]:
    """The plugin's getMacroArgs: split at top-level commas until the parentheses close."""
    args: list[str] = []
    depth, last = 0, 1
    sub = text[open_at:]
    for m in re.finditer(r"\(|\)|,", sub):
        tok = m.group(0)
        depth += tok == "("
        depth -= tok == ")"
        if tok == "," and depth == 1:
            args.append(sub[last : m.end() - 1])
            last = m.end()
        if depth == 0:
            args.append(sub[last : m.end() - 1])
            return args
    return []


def _js_replacement(repl: str, match: str, before: str, after: str) -> str:
    """JavaScript's String.replace substitution patterns for a string (not regex) pattern."""
    out, i = [], 0
    while i < len(repl):
        if repl[i] == "$" and i + 1 < len(repl):
            nxt = repl[i + 1]
            sub = {"$": "$", "&": match, "`": before, "'": after}.get(nxt)
            if sub is not None:
                out.append(sub)
                i += 2
                continue
        out.append(repl[i])
        i += 1
    return "".join(out)


def conditional_all(sql: str, variables: Mapping[str, Variable]) -> str:
    macro = "$__conditionalAll("
    at = sql.rfind(macro)
    for _ in range(1000):
        if at == -1:
            return sql
        params = _macro_args(sql, at + len(macro) - 1)
        if len(params) != 2:
            return sql
        m = re.search(r"(?<=\$\{)\w+(?=\})|(?<=\$)\w+", params[1].strip())
        phrase = params[0]
        if m:
            v = variables.get(m.group(0))
            value = "" if v is None else v.value
            as_string = ",".join(value) if isinstance(value, list) else value
            if as_string in ("", ALL):
                phrase = "1=1"
        target = f"{macro}{params[0]},{params[1]})"
        i = sql.find(target)
        sql = (
            sql[:i]
            + _js_replacement(phrase, target, sql[:i], sql[i + len(target) :])
            + sql[i + len(target) :]
        )
        at = sql.rfind(macro)
    # a condition whose replacement brings the macro back ($&): the plugin loops for ever
    raise ValueError("$__conditionalAll does not terminate")


# -- 2. Grafana's template service --------------------------------------------------------
_VAR = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^\}]+))?(?::([^\}]+))?\}")


def _format(value: str | list[str], fmt: str | None) -> str:
    values = value if isinstance(value, list) else [value]
    if fmt is None:  # the plugin's own format function
        return "'" + "','".join(value) + "'" if isinstance(value, list) else value
    if fmt == "singlequote":
        return ",".join("'" + v.replace("'", "\\'") + "'" for v in values)
    if fmt in ("raw", "csv"):
        return ",".join(values)
    if fmt == "percentencode":
        return quote(",".join(values) if len(values) > 1 else values[0], safe="-_.!~*'()")
    raise ValueError(f"variable format {fmt!r} not emulated")


def template_replace(sql: str, variables: Mapping[str, Variable]) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(6)
        v = variables.get(name)
        if v is None:
            return m.group(0)
        value = v.value
        if value in (ALL, [ALL]):
            if v.all_value is not None and fmt not in ("text", "percentencode"):
                return v.all_value
            value = list(v.options)
        return _format(value, fmt)

    return _VAR.sub(sub, sql)


# -- 3. the backend's macros --------------------------------------------------------------
def _args(sql: str, open_at: int) -> tuple[list[str], int]:
    """Arguments of a call whose '(' is at ``open_at``; the index after its ')'."""
    depth, quote_char, args, cur = 0, "", [], []
    for i in range(open_at, len(sql)):
        c = sql[i]
        if quote_char:
            cur.append(c)
            if c == quote_char and sql[i - 1] != "\\":
                quote_char = ""
            continue
        if c in "'`":
            quote_char = c
        if c == "(":
            depth += 1
            if depth == 1:
                continue
        elif c == ")":
            depth -= 1
            if depth == 0:
                args.append("".join(cur).strip())
                return [a for a in args if a], i + 1
        elif c == "," and depth == 1:
            args.append("".join(cur).strip())
            cur = []
            continue
        cur.append(c)
    raise ValueError(f"unclosed macro call at {open_at}: {sql[open_at : open_at + 40]!r}")


def _in_string(sql: str, at: int) -> bool:
    quote_char = ""
    for i, c in enumerate(sql[:at]):
        if quote_char:
            if c == quote_char and sql[i - 1] != "\\":
                quote_char = ""
        elif c in "'`\"":
            quote_char = c
    return bool(quote_char)


def backend_macros(sql: str, q: Query) -> str:
    frm, to = math.floor(q.start.timestamp()), math.floor(q.end.timestamp())
    frm_ms, to_ms = math.floor(q.start.timestamp() * 1000), math.floor(q.end.timestamp() * 1000)
    n = int(max(q.interval_s, 1))
    n_ms = int(max(q.interval_s * 1000, 1))

    def date(t: datetime) -> str:
        return f"toDate('{t.astimezone(UTC):%Y-%m-%d}')"

    with_args = {
        "timeFilter": lambda c: f"{c} >= toDateTime({frm}) AND {c} <= toDateTime({to})",
        "timeFilter_ms": lambda c: (
            f"{c} >= fromUnixTimestamp64Milli({frm_ms}) "
            f"AND {c} <= fromUnixTimestamp64Milli({to_ms})"
        ),
        "dateFilter": lambda c: f"{c} >= {date(q.start)} AND {c} <= {date(q.end)}",
        "timeInterval": lambda c: f"toStartOfInterval(toDateTime({c}), INTERVAL {n} second)",
        "timeInterval_ms": lambda c: (
            f"toStartOfInterval(toDateTime64({c}, 3), INTERVAL {n_ms} millisecond)"
        ),
    }
    plain = {
        "fromTime": f"toDateTime({frm})",
        "toTime": f"toDateTime({to})",
        "fromTime_ms": f"fromUnixTimestamp64Milli({frm_ms})",
        "toTime_ms": f"fromUnixTimestamp64Milli({to_ms})",
        "interval_s": str(n),
    }
    out, i = [], 0
    for m in re.finditer(r"\$__(\w+)", sql):
        if m.start() < i:
            continue
        name = m.group(1)
        if name not in with_args and name not in plain:
            continue
        if _in_string(sql, m.start()):
            raise ValueError(f"macro $__{name} inside a string literal")
        out.append(sql[i : m.start()])
        if name in with_args:
            args, i = _args(sql, m.end())
            if len(args) != 1:
                raise ValueError(f"$__{name} takes 1 argument, got {args}")
            out.append(with_args[name](args[0]))
        else:
            out.append(plain[name])
            i = m.end()
    out.append(sql[i:])
    return "".join(out)


def interpolate(sql: str, variables: Sequence[Variable], q: Query) -> str:
    by_name = {v.name: v for v in variables}
    out = backend_macros(template_replace(conditional_all(sql, by_name), by_name), q)
    left = re.findall(r"\$\{?\w+", out)
    if left:
        raise ValueError(f"not expanded: {left}")
    return out
