"""Simulated nodes and claims for the allocator service tests."""

from __future__ import annotations

from typing import Any

from tangram.allocation import DeviceClass
from tangram.events import ClaimRequested, NodeHardware, NodeInventory, subject_token
from tangram.k8s.deviceclasses import load_shipped_device_classes
from tangram.nvml import SimNvml
from tangram.nvml.inventory import read_node_hardware

# The shipped DeviceClasses, by name: what the allocator decides with by default.
CLASSES = {c.name: c for c in (DeviceClass.from_manifest(m) for m in load_shipped_device_classes())}


def hardware(machine: str, node: str) -> NodeHardware:
    nvml = SimNvml.from_machine(machine)
    nvml.nvmlInit()
    return read_node_hardware(nvml, node)


def inventory(machine: str, node: str) -> NodeInventory:
    return NodeInventory(key=subject_token(node), hardware=hardware(machine, node))


def gpus(count: int) -> dict[str, Any]:
    return {
        "devices": {
            "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.tangram.dev", "count": count}}]
        }
    }


def mig(profile: str) -> dict[str, Any]:
    expression = f'device.attributes["gpu.tangram.dev"].profile == "{profile}"'
    return {
        "devices": {
            "requests": [
                {
                    "name": "mig",
                    "exactly": {
                        "deviceClassName": "mig.gpu.tangram.dev",
                        "selectors": [{"cel": {"expression": expression}}],
                    },
                }
            ]
        }
    }


def request(n: int, spec: dict[str, Any], namespace: str = "team") -> ClaimRequested:
    uid = f"00000000-0000-4000-8000-{n:012d}"
    return ClaimRequested(key=uid, namespace=namespace, name=f"claim-{n}", uid=uid, spec=spec)
