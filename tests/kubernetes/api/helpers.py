"""A node name, a kubeconfig for a test API server, and waiting on a condition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tangram.dra import node_devices
from tangram.kubernetes.objects import K8sVersion, render_slices
from tangram.nvml import SimNvml
from tangram.nvml.inventory import read_node_hardware
from tests.support.driver import DRIVER

NODE = "gpu-node.example.com"


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": {"server": server}}],
                "users": [{"name": "discovery", "user": {"token": "not-checked"}}],
                "contexts": [{"name": "local", "context": {"cluster": "local", "user": "discovery"}}],
                "current-context": "local",
            }
        )
    )
    return path


def simulated(machine: str, state_file: Path) -> SimNvml:
    nvml = SimNvml.from_machine(machine, state_file=state_file)
    nvml.nvmlInit()
    return nvml


def machine_slices(
    nvml: SimNvml, node: str, *, generation: int, k8s_version: K8sVersion = "1.36"
) -> list[dict[str, Any]]:
    hardware = read_node_hardware(nvml, node)
    return render_slices(
        node_devices(hardware, driver=DRIVER), k8s_version=k8s_version, generation=generation, driver=DRIVER
    )
