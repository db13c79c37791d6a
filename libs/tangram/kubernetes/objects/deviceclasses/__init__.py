"""The DeviceClasses Tangram ships. The YAML next to this module is the single source;
`deploy/deviceclasses/` links to these files so `kubectl apply -f` and `-k` use the same bytes.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml


class DeviceClassError(ValueError):
    """A shipped DeviceClass manifest that is not one DeviceClass object."""


def shipped_manifest_paths() -> list[Path]:
    return sorted(Path(str(resources.files(__name__))).glob("*.yaml"))


def load_shipped_device_classes() -> list[dict[str, Any]]:
    """Every shipped DeviceClass as a dict, in file-name order."""
    classes: list[dict[str, Any]] = []
    for path in shipped_manifest_paths():
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document is None:
                continue
            if not isinstance(document, dict) or document.get("kind") != "DeviceClass":
                raise DeviceClassError(f"{path.name}: expected DeviceClass objects only")
            classes.append(document)
    return classes
