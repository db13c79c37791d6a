"""The Prometheus Operator's CustomResourceDefinitions of the two kinds Tangram's chart renders,
ServiceMonitor and PrometheusRule, so that the tests can install them into the real API server
and have it validate the chart's objects against their schemas.

They come from the operator's own Go module at a pinned release (`go mod download`): the CRD
manifests it ships in example/prometheus-operator-crd/, the files its users apply to install the
CRDs, copied once into a cache directory keyed by that release, next to the control
plane and Helm builds (`tangram.local.gobuild`). `python -m tangram.local.monitoringcrds fetch`
fetches them when missing and prints their paths.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import yaml

from tangram.local.gobuild import cache_root, module_dir, tool_main

# The operator's release whose CRDs the chart's objects must satisfy: a recent one, since a
# cluster's CRDs are as new as the operator its users installed, and pinned so the check is the
# same on every machine.
PROMETHEUS_OPERATOR_VERSION = "v0.86.1"
PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator"
_CRD_DIR = Path("example/prometheus-operator-crd")
# CRD name -> its file in the module
CRDS = {
    "servicemonitors.monitoring.coreos.com": "monitoring.coreos.com_servicemonitors.yaml",
    "prometheusrules.monitoring.coreos.com": "monitoring.coreos.com_prometheusrules.yaml",
}


class MonitoringCrdsError(RuntimeError):
    """The CRDs are not fetched, or fetching them failed; the message says which."""


def cache_dir() -> Path:
    return cache_root("prometheus-operator") / PROMETHEUS_OPERATOR_VERSION


def _paths() -> list[Path]:
    return [cache_dir() / file for file in CRDS.values()]


def find_paths() -> list[Path]:
    """The cached CRD files; never fetches."""
    paths = _paths()
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        raise MonitoringCrdsError(f"{', '.join(missing)} not fetched yet: run `make monitoring-crds`")
    return paths


def load() -> list[dict[str, Any]]:
    """The cached CRDs as objects, ready to apply."""
    return [yaml.safe_load(path.read_text()) for path in find_paths()]


def fetch(*, out: Any = sys.stderr) -> list[Path]:
    """Copy the CRDs out of the operator's module into the cache unless they are there already;
    returns their paths."""
    paths = _paths()
    if all(path.exists() for path in paths):
        return paths
    print(
        f"fetching the CRDs of {PROMETHEUS_OPERATOR_MODULE}@{PROMETHEUS_OPERATOR_VERSION} into {cache_dir()}",
        file=out,
        flush=True,
    )
    source = module_dir(
        PROMETHEUS_OPERATOR_MODULE,
        PROMETHEUS_OPERATOR_VERSION,
        error=MonitoringCrdsError,
        work=cache_root("prometheus-operator"),
    )
    cache_dir().mkdir(parents=True, exist_ok=True)
    for name, file in CRDS.items():
        text = (source / _CRD_DIR / file).read_text()
        _check(yaml.safe_load(text), name, file)
        # written beside, then renamed: a concurrent or interrupted fetch never leaves half a file
        # where a test reads one
        staging = cache_dir() / f".{file}.{os.getpid()}"
        staging.write_text(text)
        staging.replace(cache_dir() / file)
    return paths


def _check(crd: Any, name: str, file: str) -> None:
    # the files' place or content could change in another release: refuse anything but the CRD
    # named, from the release pinned
    version = PROMETHEUS_OPERATOR_VERSION.removeprefix("v")
    if not (
        isinstance(crd, dict)
        and crd.get("kind") == "CustomResourceDefinition"
        and crd.get("metadata", {}).get("name") == name
        and crd["metadata"].get("annotations", {}).get("operator.prometheus.io/version") == version
    ):
        module = f"{PROMETHEUS_OPERATOR_MODULE}@{PROMETHEUS_OPERATOR_VERSION}"
        raise MonitoringCrdsError(f"{file} of {module} is not the CRD {name} of that release")


def main(argv: list[str] | None = None) -> int:
    return tool_main(
        argv,
        prog="tangram.local.monitoringcrds",
        commands={"fetch": fetch},
        errors=(MonitoringCrdsError, OSError),
    )


if __name__ == "__main__":
    sys.exit(main())
