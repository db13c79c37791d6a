"""Every shipped simulated machine, read through simulated NVML, renders valid slices for every version."""

from typing import Any

import pytest

from tangram.dra import node_devices
from tangram.events.inventory import NodeHardware
from tangram.hardware.machines import list_machines
from tangram.kubernetes.objects import check_limits, render_slices
from tangram.nvml import open_backend
from tangram.nvml.inventory import read_node_hardware
from tests.kubernetes.objects.schema import validate_strictly
from tests.support.driver import DRIVER

VERSIONS = ["1.34", "1.35", "1.36", "1.37"]
SLICE_COUNTERS = {"memory-slice-0", "memory-slice-1"}  # present in every MIG counter set


def read(machine: str) -> NodeHardware:
    nvml = open_backend(sim=machine)
    try:
        return read_node_hardware(nvml, machine)
    finally:
        nvml.nvmlShutdown()


@pytest.fixture(scope="module")
def hardware() -> dict[str, NodeHardware]:
    return {name: read(name) for name in list_machines()}


def test_the_expected_machines_are_shipped() -> None:
    assert {"dgx-h100", "hgx-h200", "l40s-8", "a100-pcie-2x2", "gb200-tray"} <= set(list_machines())


def _devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices") or []]


def _slices_of(consumption: dict[str, Any]) -> set[int]:
    return {
        int(k.removeprefix("memory-slice-")) for k in consumption["counters"] if k.startswith("memory-slice-")
    }


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("machine", list_machines())
def test_shipped_machine_slices(machine: str, version: str, hardware: dict[str, NodeHardware]) -> None:
    hw = hardware[machine]
    slices = render_slices(node_devices(hw, driver=DRIVER), k8s_version=version, driver=DRIVER)  # type: ignore[arg-type]
    assert check_limits(slices, version) == []
    for obj in slices:
        validate_strictly(obj, version)

    devices = _devices(slices)
    sets = {cs["name"]: cs["counters"] for s in slices for cs in s["spec"].get("sharedCounters") or []}
    by_gpu_uuid = {
        d["attributes"]["uuid"]["string"]: d for d in devices if d["attributes"]["type"]["string"] == "gpu"
    }
    mig = [d for d in devices if d["attributes"]["type"]["string"] == "mig"]
    for gpu in hw.gpus:
        partitions = [d for d in mig if d["attributes"]["parentUUID"]["string"] == gpu.uuid]
        whole = by_gpu_uuid.get(gpu.uuid)
        if not gpu.mig_capable:
            assert partitions == []
            assert whole is not None
            assert "consumesCounters" not in whole
            continue
        if gpu.mig_toggle_needs_reset and not gpu.mig_enabled:
            assert partitions == []  # Ampere with MIG off: nothing to carve without a reset
            assert whole is not None
            assert "consumesCounters" not in whole
            continue
        # every placement NVML reports is advertised once and consumes exactly its memory slices
        advertised = {
            (d["attributes"]["profile"]["string"], d["attributes"]["placementStart"]["int"]): d
            for d in partitions
        }
        expected = {(p.name, pl.start): pl for p in gpu.mig_profiles for pl in p.placements}
        assert set(advertised) == set(expected)
        for key, placement in expected.items():
            [consumption] = advertised[key]["consumesCounters"]
            assert _slices_of(consumption) == set(placement.slices)
            assert set(sets[consumption["counterSet"]]) >= SLICE_COUNTERS
        if whole is not None:
            [consumption] = whole["consumesCounters"]
            assert consumption["counters"] == sets[consumption["counterSet"]]
            assert _slices_of(consumption) == set(range(gpu.memory_slices))
        else:
            assert gpu.mig_enabled and gpu.mig_toggle_needs_reset


@pytest.mark.parametrize("version", VERSIONS)
def test_shipped_machine_names_are_stable(version: str) -> None:
    first = render_slices(node_devices(read("mixed"), driver=DRIVER), k8s_version=version, driver=DRIVER)  # type: ignore[arg-type]
    second = render_slices(node_devices(read("mixed"), driver=DRIVER), k8s_version=version, driver=DRIVER)  # type: ignore[arg-type]
    assert [d["name"] for d in _devices(first)] == [d["name"] for d in _devices(second)]
    assert first == second
