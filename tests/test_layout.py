"""The code's shape stays readable (issue 23's checks): no module of the agent, the collector
or the contracts over 600 lines, no product function over 80 lines (issue 28), no class that
sets more than 30 attributes in ``__init__``, and no import running upward — between the
parts (contracts at the bottom, agent and collector side by side, never importing each other,
demo and bench on top) and through the collector's layers (the SLA checker is a plugin
nothing imports)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "collector", "parallax_contracts")
# What each part may import of the project's packages (the rest of its imports are its own
# or third-party): the layout follows the data's path, probe → wire → store → analysis.
MAY_IMPORT = {
    "parallax_contracts": {"parallax_contracts"},
    "agent": {"agent", "parallax_contracts"},
    "collector": {"collector", "parallax_contracts"},
}
PROJECT = ("agent", "collector", "parallax_contracts", "demo", "bench", "tests")

# Lowest first; a module's layer is that of its longest matching prefix. An import may go
# to the same layer or below.
LAYERS: dict[str, int] = {
    "parallax_contracts": 0,
    "agent": 0,  # (the agent's modules are judged by MAY_IMPORT only)
    "collector": 0,  # the package itself: it imports nothing
    "collector.store": 1,
    "collector.ingest.common": 1,
    "collector.ingest": 2,
    "collector.pipeline": 2,
    "collector.config": 2,
    "collector.ratelimit": 2,
    "collector.metrics": 3,
    "collector.plugins": 3,
    "collector.pairing": 4,
    "collector.api": 5,
    "collector.service": 6,
    "collector.cli": 7,
    "collector.sla": 8,
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


def _layer(module: str) -> int:
    best = max((k for k in LAYERS if module == k or module.startswith(k + ".")), key=len)
    return LAYERS[best]


def _imports(path: Path, roots: tuple[str, ...] = PACKAGES) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.split(".")[0] in roots}


def test_no_module_over_600_lines() -> None:
    long = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long


def test_no_product_function_over_80_lines() -> None:
    """Split by job, not to meet a cap: a function this long does several."""
    files = [p for pkg in (*PACKAGES, "dashboards", "demo") for p in (ROOT / pkg).rglob("*.py")]
    long = {
        f"{p.relative_to(ROOT)}:{f.name}": n
        for p in files
        for f in ast.walk(ast.parse(p.read_text()))
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
        and (n := (f.end_lineno or f.lineno) - f.lineno + 1) > 80
    }
    assert not long, long


def test_no_class_sets_more_than_30_attributes_in_init() -> None:
    big = {}
    for m, p in _modules().items():
        for cls in ast.walk(ast.parse(p.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            for f in cls.body:
                if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                    attrs = {
                        a.attr
                        for a in ast.walk(f)
                        if isinstance(a, ast.Attribute)
                        and isinstance(a.ctx, ast.Store)
                        and isinstance(a.value, ast.Name)
                        and a.value.id == "self"
                    }
                    if len(attrs) > 30:
                        big[f"{m}.{cls.name}"] = len(attrs)
    assert not big, big


def test_the_parts_import_only_what_lies_below_them() -> None:
    wrong = [
        f"{m} -> {target}"
        for m, p in _modules().items()
        for target in _imports(p, PROJECT)
        if target.split(".")[0] not in MAY_IMPORT[m.split(".")[0]]
    ]
    assert not wrong, wrong
    # the check sees the imports it judges
    assert "parallax_contracts.span_attributes" in _imports(_modules()["agent.records"], PROJECT)


def test_no_import_runs_upward() -> None:
    modules = {m: p for m, p in _modules().items() if not m.startswith("agent")}
    upward = [
        f"{m} -> {target}"
        for m, p in modules.items()
        for target in _imports(p)
        if target in modules and _layer(target) > _layer(m)
    ]
    assert not upward, upward
    # The check sees the imports it judges (a pairing module reads the store, the service
    # starts the pairer).
    assert "collector.store.client" in _imports(modules["collector.pairing.lookups"])
    assert "collector.pairing.pairer" in _imports(modules["collector.service"])
