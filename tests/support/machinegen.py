"""Machine descriptions of any size, generated: for the bound on machine files and for big nodes.

`machine(n, wiring)` is a machine document (the mapping a machine YAML file holds) with `n` GPUs:
"switch" puts every GPU on one NVSwitch fabric, "bridges" joins them in bridged pairs (an odd last
GPU stays alone), "pcie" has no NVLink at all, and "half" puts the first half on NVSwitches and
bridges the rest in pairs. GPUs sit eight to a PCIe root, two roots per NUMA
node, so the PCIe levels between pairs vary as on a real board.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml

Wiring = Literal["switch", "bridges", "pcie", "half"]

PRODUCTS = {"switch": "H100-SXM5-80GB", "bridges": "H100-NVL", "pcie": "L40S"}


def machine(
    gpus: int, wiring: Wiring = "switch", *, name: str = "", switches: int = 4, mig: bool = False
) -> dict[str, Any]:
    switched = range(gpus) if wiring == "switch" else range(gpus // 2) if wiring == "half" else range(0)
    bridged = range(0) if wiring in ("switch", "pcie") else range(len(switched), gpus)
    specs: list[dict[str, Any]] = []
    for i in range(gpus):
        product = PRODUCTS["switch" if i in switched else "bridges" if i in bridged else "pcie"]
        gpu: dict[str, Any] = {
            "product": product,
            # domain, bus and device: unique for up to 65536 * 256 GPUs
            "pci_bus_id": f"{i // 256:08x}:{i % 256:02x}:00.0",
            "numa_node": i // 16,
            "pcie_root": f"pci{i // 256:04x}:{(i // 8) % 256:02x}",
            "pcie_switch": f"sw{i // 2}",
        }
        if mig and product != PRODUCTS["pcie"]:
            gpu["mig_enabled"] = True
            if i % 2 == 0:
                gpu["mig_instances"] = [{"profile": "3g.40gb", "start": 0}]
        specs.append(gpu)
    doc: dict[str, Any] = {
        "name": name or f"gen-{wiring}-{gpus}",
        "description": f"{gpus} generated GPUs ({wiring})",
        "driver_version": "565.57.01",
        "gpus": specs,
    }
    nvlink: dict[str, Any] = {}
    if switched:
        nvlink["switch"] = {"gpus": list(switched), "switches": switches}
    if bridged:
        nvlink["bridges"] = [[i, i + 1] for i in range(bridged.start, bridged.stop - 1, 2)]
    if nvlink:
        doc["nvlink"] = nvlink
    return doc


def write_machine(path: Path, gpus: int, wiring: Wiring = "switch", **options: Any) -> Path:
    """The generated machine as a YAML file at `path` (the flow style keeps big machines small)."""
    path.write_text(yaml.safe_dump(machine(gpus, wiring, **options), default_flow_style=None, width=200))
    return path
