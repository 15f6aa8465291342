"""docs/deploy.md cannot silently rot: its sections keep the SRE's order, its helm commands
run against the chart (install as a client-side dry run), every chart value it names
exists, every metric it names is one the agent or the collector exports, and it names every
shipped Prometheus rule."""

from __future__ import annotations

import re
import shlex
from functools import cache
from typing import Any

import pytest
import yaml

from agent.metrics import Metrics as AgentMetrics
from collector.metrics import Metrics as CollectorMetrics
from collector.sla.metrics import SlaMetrics
from tests import k8s_tools

ROOT = k8s_tools.ROOT
DOC = ROOT / "docs" / "deploy.md"
TEXT = DOC.read_text()


def _blocks(lang: str) -> list[str]:
    return [b.replace("\\\n", " ") for b in re.findall(rf"```{lang}\n(.*?)```", TEXT, re.S)]


def _helm_lines() -> list[str]:
    out = []
    for block in _blocks("sh"):
        for line in block.splitlines():
            cmd = line.split("|", 1)[0].strip()
            if cmd.startswith("helm ") and "<" not in cmd:
                out.append(cmd)
    return out


HELM_LINES = _helm_lines()


def test_sections_in_the_order_an_sre_needs_them() -> None:
    heads = re.findall(r"^## (.+)$", TEXT, re.M)
    assert heads == [
        "1. A cluster install (Helm)",
        "2. A VM install (systemd)",
        "3. An upgrade",
        "4. What to watch (/metrics)",
    ]


def test_linked_from_the_readmes() -> None:
    assert "(docs/deploy.md)" in (ROOT / "README.md").read_text()
    assert "(../docs/deploy.md)" in (ROOT / "deploy" / "README.md").read_text()


@pytest.mark.parametrize("line", HELM_LINES)
def test_helm_commands_run(line: str) -> None:
    """`helm upgrade --install …` as `helm install --dry-run=client …` (no cluster here):
    the chart path, the flags and the values files as written."""
    args = shlex.split(line)[1:]
    if args[0] == "upgrade":
        args = ["install", "--dry-run=client", *[a for a in args[1:] if a != "--install"]]
    p = k8s_tools.helm(*args, check=False)
    assert p.returncode == 0, p.stderr


def test_the_doc_shows_helm_commands() -> None:
    assert len(HELM_LINES) >= 2, HELM_LINES


@cache
def _values() -> dict[str, Any]:
    out: dict[str, Any] = yaml.safe_load((k8s_tools.CHART / "values.yaml").read_text())
    return out


def _named_values() -> list[str]:
    roots = "|".join(_values())
    found = set(re.findall(rf"`((?:{roots})\.[\w.*]+)`", TEXT))
    return sorted(n for n in found if not n.endswith(".env"))  # agent.env: a file


@pytest.mark.parametrize("name", _named_values())
def test_named_values_exist(name: str) -> None:
    node: Any = _values()
    for part in name.removesuffix(".*").split("."):
        assert isinstance(node, dict) and part in node, f"docs/deploy.md names {name}"
        node = node[part]


def _exported() -> set[str]:
    """Metric family names of the agent's, the collector's and the SLA checker's registries
    (public collect(); counters without their _total)."""
    c = CollectorMetrics()
    SlaMetrics(c.registry)
    regs = [AgentMetrics().registry, c.registry]
    return {fam.name for reg in regs for fam in reg.collect()}


def test_named_metrics_are_exported() -> None:
    # (a recording rule's name, level:metric:operation, is not a served series)
    names = set(re.findall(r"(?<![:\w])parallax_(?:agent|collector|sla)_[a-z0-9_]+(?!:)", TEXT))
    assert len(names) >= 20
    exported = _exported()
    for n in sorted(names):
        family = re.sub(r"_(total|bucket|count|sum)$", "", n)
        assert n in exported or family in exported, f"docs/deploy.md names {n}: not exported"


def test_the_rules_section_names_every_shipped_rule() -> None:
    """The alerts table and the recording rules named are those of deploy/prometheus (the
    rules themselves: tests/test_prometheus.py)."""
    rules_file = ROOT / "deploy" / "prometheus" / "parallax-rules.yaml"
    rules = [r for g in yaml.safe_load(rules_file.read_text())["groups"] for r in g["rules"]]
    named = set(re.findall(r"^\| `(Parallax\w+)` \|", TEXT, re.M))
    assert named == {r["alert"] for r in rules if "alert" in r}
    for r in rules:
        if "record" in r:
            assert f"`{r['record']}`" in TEXT, r["record"]
