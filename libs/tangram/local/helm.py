"""Helm, built from its Go module, and the plain manifests rendered from Tangram's chart.

The chart in `deploy/helm/tangram` is the one source of Tangram's Kubernetes objects:
`deploy/kubernetes/*.yaml` and `deploy/openshift/node-scc.yaml` are `helm template` output,
written by `python -m tangram.local.helm manifests` (`make manifests`) and compared with a fresh
render by the tests, so they are never edited by hand.

Helm is built once, like the control plane (`tangram.local.controlplane`), into a cache
directory keyed by its version and link flags: `go install helm.sh/helm/v3/cmd/helm@<version>` with GOBIN
there. `python -m tangram.local.helm build` builds it when missing and prints its path.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tangram.local.gobuild import build_once, cache_root, tool_main

HELM_VERSION = "v3.19.0"
HELM_MODULE = "helm.sh/helm/v3/cmd/helm"
# measured: 2 minutes on a shared, loaded 2-core machine, module download included, with the Go
# build cache the control plane's build leaves (the Kubernetes libraries helm shares with it)
_GO_INSTALL_ENV = {"GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
_COLD_BUILD_HINT = "a few minutes the first time (module download and compile)"
# What helm's own release build sets: its version, and the Kubernetes version `helm lint` and
# `helm template` assume without --kube-version (that of the client-go it is built with, 1.34).
_LDFLAGS = " ".join(
    [
        "-s -w",
        f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
        "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
        "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1",
        "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=34",
        "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1",
        "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=34",
    ]
)

RELEASE = "tangram"
NAMESPACE = "tangram"
# The plain manifests: the chart's defaults, plus the Namespace object (a Helm install creates
# the namespace itself, see deploy/README.md).
MANIFEST_SETTINGS: Mapping[str, str] = {"namespace.create": "true"}
# deploy/deviceclasses/ links to the DeviceClasses' one source (the chart's files link there too).
PLAIN_LEFT_OUT = ("templates/deviceclasses.yaml",)
# deploy/openshift/node-scc.yaml: what the OpenShift switch adds to the plain manifests.
OPENSHIFT_TEMPLATES = ("templates/openshift-scc.yaml",)
# deploy/admission-policy/: the MutatingAdmissionPolicy that replaces the admission webhook where
# the cluster serves one (apply it, then delete the webhook's objects; deploy/README.md).
POLICY_TEMPLATES = ("templates/admission-policy.yaml",)
_SOURCE = re.compile(r"^# Source: [^/]+/(templates/[^\n]+)$", re.MULTILINE)
_HEADER = "# Rendered from deploy/helm/tangram by `make manifests` ({what}); edit the chart, not this file.\n"


class HelmError(RuntimeError):
    """Helm is missing, failed to build, or a helm command failed; the message says which."""


def repository_root() -> Path:
    return Path(__file__).resolve().parents[3]


def chart_dir() -> Path:
    return repository_root() / "deploy" / "helm" / "tangram"


def binary_path() -> Path:
    """`<cache>/<helm version>-<hash of the link flags>/helm`: changed flags build anew."""
    digest = hashlib.sha256(f"{HELM_MODULE}@{HELM_VERSION} {_LDFLAGS}".encode()).hexdigest()[:12]
    return cache_root("helm") / f"{HELM_VERSION}-{digest}" / "helm"


def find_binary() -> Path:
    """$TANGRAM_HELM, else the cached build; never builds."""
    explicit = os.environ.get("TANGRAM_HELM")
    if explicit:
        return Path(explicit)
    path = binary_path()
    if not path.exists():
        raise HelmError(f"helm binary {path} not built yet: run `make helm`")
    return path


def build(*, out: Any = sys.stderr) -> Path:
    """Build helm into its cache directory unless it is there already; returns its path."""
    return build_once(
        binary_path(),
        lambda _: ["install", "-trimpath", f"-ldflags={_LDFLAGS}", f"{HELM_MODULE}@{HELM_VERSION}"],
        what=f"helm {HELM_VERSION}",
        hint=_COLD_BUILD_HINT,
        error=HelmError,
        env=_GO_INSTALL_ENV,
        out=out,
    )


def run(args: Sequence[str], *, binary: Path | None = None) -> str:
    """One helm command; its standard output, or HelmError with both outputs."""
    command = [str(binary or find_binary()), *args]
    # no repositories, plugins or caches of the user's: the chart has no dependencies
    env = {**os.environ, "HELM_CACHE_HOME": str(cache_root("helm") / "home" / "cache")}
    env["HELM_CONFIG_HOME"] = str(cache_root("helm") / "home" / "config")
    env["HELM_DATA_HOME"] = str(cache_root("helm") / "home" / "data")
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise HelmError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result.stdout


def _value_args(values: Sequence[Path], settings: Mapping[str, str]) -> list[str]:
    args: list[str] = []
    for path in values:
        args += ["--values", str(path)]
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    return args


def lint(
    values: Sequence[Path] = (),
    settings: Mapping[str, str] = {},
    *,
    kube_version: str = "1.34.0",
    binary: Path | None = None,
) -> str:
    """`helm lint --strict`; raises HelmError on any error or warning."""
    args = ["lint", "--strict", str(chart_dir()), "--kube-version", kube_version]
    return run([*args, *_value_args(values, settings)], binary=binary)


def version(*, binary: Path | None = None) -> str:
    """What the binary says it is (`helm version --short`, without the build metadata)."""
    return run(["version", "--short"], binary=binary).strip().split("+")[0]


def template(
    values: Sequence[Path] = (),
    settings: Mapping[str, str] = {},
    *,
    namespace: str = NAMESPACE,
    kube_version: str = "1.34.0",
    binary: Path | None = None,
    show_only: Sequence[str] = (),
) -> str:
    """`helm template` of the chart as release `tangram`, by default in namespace `tangram`."""
    args = ["template", RELEASE, str(chart_dir()), "--namespace", namespace, "--kube-version", kube_version]
    for name in show_only:
        args += ["--show-only", name]
    return run([*args, *_value_args(values, settings)], binary=binary)


def split_by_template(rendered: str) -> dict[str, str]:
    """The rendered documents grouped by the template file that made them, in output order."""
    files: dict[str, list[str]] = {}
    for document in rendered.split("\n---\n"):
        match = _SOURCE.search(document)
        if match is None:
            continue
        body = document[match.end() :].strip("\n")
        if body:
            files.setdefault(match.group(1), []).append(body + "\n")
    return {name: "---\n".join(bodies) for name, bodies in files.items()}


def render_manifests(*, binary: Path | None = None) -> dict[Path, str]:
    """What deploy/kubernetes/, deploy/openshift/ and deploy/admission-policy/ hold: relative path -> text."""
    out: dict[Path, str] = {}
    plain = split_by_template(template(settings=MANIFEST_SETTINGS, binary=binary))
    for name, text in plain.items():
        if name in PLAIN_LEFT_OUT:
            continue
        what = "default values, with the Namespace"
        out[Path("deploy/kubernetes") / Path(name).name] = _HEADER.format(what=what) + text
    openshift = split_by_template(
        template(
            settings={**MANIFEST_SETTINGS, "openshift.enabled": "true"},
            show_only=OPENSHIFT_TEMPLATES,
            binary=binary,
        )
    )
    (text,) = openshift.values()
    out[Path("deploy/openshift/node-scc.yaml")] = _HEADER.format(what="openshift.enabled=true") + text
    policy = split_by_template(
        template(
            settings={**MANIFEST_SETTINGS, "admission.mode": "policy"},
            show_only=POLICY_TEMPLATES,
            binary=binary,
        )
    )
    (text,) = policy.values()
    out[Path("deploy/admission-policy/scheduling-gate.yaml")] = (
        _HEADER.format(what="admission.mode=policy") + text
    )
    # `kubectl apply -k deploy/kubernetes` (or deploy/openshift): the same files as kustomizations
    plain_files = sorted(path.name for path in out if path.parent == Path("deploy/kubernetes"))
    out[Path("deploy/kubernetes/kustomization.yaml")] = _kustomization([*plain_files, "../deviceclasses"])
    out[Path("deploy/openshift/kustomization.yaml")] = _kustomization(["../kubernetes", "node-scc.yaml"])
    return out


def _kustomization(resources: Sequence[str]) -> str:
    lines = [
        _HEADER.format(what="listing the files next to it").rstrip("\n"),
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        "resources:",
        *(f"  - {resource}" for resource in resources),
    ]
    return "\n".join(lines) + "\n"


def write_manifests(root: Path | None = None) -> list[Path]:
    """Replace the rendered files under deploy/kubernetes/ and deploy/openshift/ with a fresh render."""
    root = root or repository_root()
    rendered = render_manifests()
    for folder in ("deploy/kubernetes", "deploy/openshift", "deploy/admission-policy"):
        for stale in (root / folder).glob("*.yaml"):
            if Path(folder) / stale.name not in rendered:
                stale.unlink()
    written = []
    for relative, text in sorted(rendered.items()):
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(relative)
    return written


def main(argv: list[str] | None = None) -> int:
    return tool_main(
        argv,
        prog="tangram.local.helm",
        commands={"build": lambda: [build()], "manifests": write_manifests},
        errors=(HelmError,),
    )


if __name__ == "__main__":
    sys.exit(main())
