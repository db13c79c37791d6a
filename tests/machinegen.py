"""Machine descriptions of any size, generated: for the bound on machine files and for big nodes.

`machine(n, wiring)` is a machine document (the mapping a machine YAML file holds) with `n` GPUs:
"switch" puts every GPU on one NVSwitch fabric, "bridges" joins them in bridged pairs (an odd last
GPU stays alone), "pcie" has no NVLink at all. GPUs sit eight to a PCIe root, two roots per NUMA
node, so the PCIe levels between pairs vary as on a real board.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml

Wiring = Literal["switch", "bridges", "pcie"]

PRODUCTS: dict[Wiring, str] = {"switch": "H100-SXM5-80GB", "bridges": "H100-NVL", "pcie": "L40S"}


def machine(
    gpus: int, wiring: Wiring = "switch", *, name: str = "", switches: int = 4, mig: bool = False
) -> dict[str, Any]:
    product = PRODUCTS[wiring]
    specs: list[dict[str, Any]] = []
    for i in range(gpus):
        gpu: dict[str, Any] = {
            "product": product,
            # domain, bus and device: unique for up to 65536 * 256 GPUs
            "pci_bus_id": f"{i // 256:08x}:{i % 256:02x}:00.0",
            "numa_node": i // 16,
            "pcie_root": f"pci{i // 256:04x}:{(i // 8) % 256:02x}",
            "pcie_switch": f"sw{i // 2}",
        }
        if mig and wiring != "pcie":
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
    if wiring == "switch":
        doc["nvlink"] = {"switch": {"gpus": list(range(gpus)), "switches": switches}}
    elif wiring == "bridges":
        doc["nvlink"] = {"bridges": [[i, i + 1] for i in range(0, gpus - 1, 2)]}
    return doc


def write_machine(path: Path, gpus: int, wiring: Wiring = "switch", **options: Any) -> Path:
    """The generated machine as a YAML file at `path` (the flow style keeps big machines small)."""
    path.write_text(yaml.safe_dump(machine(gpus, wiring, **options), default_flow_style=None, width=200))
    return path
