"""`tangram discover --format slices` for every shipped machine, created on a real kube-apiserver.

Schema validation (tests/kubernetes/objects) does not run the API server's own validation code nor
its field dropping for disabled feature gates; this does, on each release the tests build. Each
server takes its own layout with partitionable devices and device taints on, and Tangram's
degraded rendering with partitionable devices off. A 1.34 server refuses the 1.35-and-later layout
wherever a slice's devices consume counters kept in another slice (the split 1.34 does not know);
a 1.37 server takes it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ResourceV1Api

from tangram.cli import main
from tangram.dra import node_devices, whole_devices_only
from tangram.hardware.machines import list_machines
from tangram.kubernetes.api import KubeApiError, call
from tangram.kubernetes.objects import render_slices
from tangram.local.controlplane import Release
from tangram.nvml.inventory import read_node_hardware
from tests.kubernetes.api.helpers import simulated
from tests.support.driver import DRIVER

# the first test to use a control plane also pays for starting it (a minute or more on a loaded
# machine), inside its own timeout
pytestmark = [pytest.mark.timeout(300), pytest.mark.controlplane]

MACHINES = list_machines()


def discover(machine: str, node: str, version: str, state: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    status = main(
        [
            "discover",
            "--sim",
            machine,
            "--node",
            node,
            "--format",
            "slices",
            "--k8s-version",
            version,
            "--state-file",
            str(state),
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    return json.loads(out)


async def create_and_read_back(kube: Any, resource_slice: dict[str, Any]) -> dict[str, Any]:
    api = ResourceV1Api(kube)
    name = resource_slice["metadata"]["name"]
    await call(f"create {name}", api.create_resource_slice(resource_slice))
    response = await api.read_resource_slice(name, _preload_content=False)
    held: dict[str, Any] = await response.json()
    await call(f"delete {name}", api.delete_resource_slice(name))
    return held


def test_every_shipped_machine_is_covered() -> None:
    assert {"dgx-h100", "hgx-h200", "gb200-tray", "a100-pcie-2x2", "l40s-8", "mixed"} <= set(MACHINES)


@pytest.mark.parametrize("machine", MACHINES)
async def test_the_servers_own_layout_is_accepted_and_kept_whole(
    machine: str, release: Release, kube: Any, unique: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slices = discover(machine, unique, release.minor, tmp_path / "gpus.json", capsys)
    assert slices
    for resource_slice in slices:
        held = await create_and_read_back(kube, resource_slice)
        assert held["spec"] == resource_slice["spec"], resource_slice["metadata"]["name"]


@pytest.mark.parametrize("machine", MACHINES)
async def test_the_degraded_rendering_is_accepted_without_partitionable_devices(
    machine: str, release: Release, kube_whole_devices: Any, unique: str, tmp_path: Path
) -> None:
    hardware = read_node_hardware(simulated(machine, tmp_path / "gpus.json"), unique)
    devices = whole_devices_only(node_devices(hardware, driver=DRIVER))
    slices = render_slices(devices, k8s_version=release.layout, generation=1, driver=DRIVER)
    gpus = [
        d["name"]
        for s in slices
        for d in s["spec"].get("devices", [])
        if d["attributes"]["type"] == {"string": "gpu"}
    ]
    assert gpus, "every shipped machine offers whole GPUs"
    for resource_slice in slices:
        held = await create_and_read_back(kube_whole_devices, resource_slice)
        assert held["spec"] == resource_slice["spec"], resource_slice["metadata"]["name"]


@pytest.mark.parametrize("version", ["1.35", "1.36", "1.37"])
@pytest.mark.parametrize("machine", MACHINES)
async def test_the_split_layouts_are_refused_by_1_34_where_counters_are_split_and_accepted_later(
    machine: str,
    version: str,
    release: Release,
    kube: Any,
    unique: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    slices = discover(machine, unique, version, tmp_path / "gpus.json", capsys)
    split = any("consumesCounters" in device for s in slices for device in s["spec"].get("devices", []))
    refused: list[str] = []
    for resource_slice in slices:
        try:
            held = await create_and_read_back(kube, resource_slice)
        except KubeApiError as error:
            assert (error.status, error.reason) == (422, "Invalid"), error
            refused.append(resource_slice["metadata"]["name"])
            continue
        # A 1.34 server writes the device list of a counters-only slice as null rather than omitting it.
        assert {k: v for k, v in held["spec"].items() if v is not None} == resource_slice["spec"]
    # 1.34 wants counter sets beside the devices that consume them; 1.35 and later in slices of their own
    assert bool(refused) == (split and release.minor == "1.34"), refused
