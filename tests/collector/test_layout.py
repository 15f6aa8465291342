"""The collector's shape stays readable: no module over 600 lines, no class that sets more
than 30 attributes in ``__init__``, and no import running upward through the layers below
(a lower layer never imports a higher one; the SLA checker is a plugin nothing imports)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("collector", "parallax_contracts")

# Lowest first; a module's layer is that of its longest matching prefix. An import may go
# to the same layer or below.
LAYERS: dict[str, int] = {
    "parallax_contracts": 0,
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


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.split(".")[0] in PACKAGES}


def test_no_module_over_600_lines() -> None:
    long = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > 600}
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


def test_no_import_runs_upward() -> None:
    modules = _modules()
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
