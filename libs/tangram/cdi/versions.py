"""The lowest CDI spec version that allows the fields a spec uses (as the CDI project decides it)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
EARLIEST = "0.3.0"


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.removeprefix("v").split("."))


def _edits(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield spec.get("containerEdits") or {}
    for device in spec.get("devices") or []:
        yield device.get("containerEdits") or {}


def _class_of(kind: str) -> str:
    return kind.partition("/")[2]


def minimum_version(spec: Mapping[str, Any]) -> str:
    """Mirror of the CDI project's per-version feature checks, newest first."""
    edits = list(_edits(spec))
    devices = spec.get("devices") or []
    for e in edits:
        rdt = e.get("intelRdt")
        if e.get("netDevices") or (rdt is not None and ("schemata" in rdt or rdt.get("enableMonitoring"))):
            return "1.1.0"
    if any(e.get("intelRdt") is not None or e.get("additionalGids") for e in edits):
        return "0.7.0"
    if (
        spec.get("annotations")
        or any(d.get("annotations") for d in devices)
        or "." in _class_of(str(spec.get("kind", "")))
    ):
        return "0.6.0"
    if any(str(d.get("name", ""))[:1].isdigit() for d in devices) or any(
        node.get("hostPath") for e in edits for node in e.get("deviceNodes") or []
    ):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts") or []):
        return "0.4.0"
    return EARLIEST
