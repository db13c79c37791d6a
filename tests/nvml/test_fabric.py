"""GB200 NVL racks in the simulator: what `nvmlDeviceGetGpuFabricInfoV` answers for trays of one
rack, of two racks, of two fabric-manager partitions, for a tray whose registration never
completed and for a degraded fabric; and what the node's inventory makes of it."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from tangram.events import NodeHardware
from tangram.hardware.machines import MachineError, load_machine, rack_tray
from tangram.nvml.inventory import read_node_hardware
from tangram.nvml.sim import SimNvml


def tray(node: str, rack: str, **fabric: object) -> NodeHardware:
    sim = SimNvml(rack_tray(load_machine("gb200-tray"), node=node, rack=rack, **fabric))  # type: ignore[arg-type]
    sim.nvmlInit()
    return read_node_hardware(sim, node)


def test_trays_of_one_rack_share_a_clique_and_trays_of_two_racks_do_not() -> None:
    a1, a2, b1 = tray("a1", "rack-a"), tray("a2", "rack-a"), tray("b1", "rack-b")
    assert len({g.clique_id for g in a1.gpus + a2.gpus}) == 1
    assert {g.clique_id for g in b1.gpus}.isdisjoint({g.clique_id for g in a1.gpus})
    # the cluster UUID is the rack's; the clique id the default partition's
    assert a1.gpus[0].clique_id is not None and a1.gpus[0].clique_id.endswith(".32766")
    assert a1.gpus[0].clique_id.split(".")[0] != b1.gpus[0].clique_id.split(".")[0]  # type: ignore[union-attr]
    # every GPU of the rack has its own UUID
    uuids = [g.uuid for g in a1.gpus + a2.gpus + b1.gpus]
    assert len(set(uuids)) == 12


def test_two_partitions_of_one_rack_are_two_cliques_of_one_cluster() -> None:
    one, two = tray("a1", "rack-a", partition=1), tray("a2", "rack-a", partition=2)
    [c1], [c2] = {g.clique_id for g in one.gpus}, {g.clique_id for g in two.gpus}
    assert c1 is not None and c2 is not None
    assert c1.split(".")[0] == c2.split(".")[0] and (c1.split(".")[1], c2.split(".")[1]) == ("1", "2")


def test_a_tray_whose_registration_did_not_complete_is_in_no_clique() -> None:
    failed = tray("a3", "rack-a", state="in-progress")
    assert all(g.clique_id is None for g in failed.gpus)
    sim = SimNvml(rack_tray(load_machine("gb200-tray"), node="a3", rack="rack-a", state="not-started"))
    sim.nvmlInit()
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    sim.nvmlDeviceGetGpuFabricInfoV(sim.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
    assert (info.state, info.status) == (
        pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED,
        pynvml.NVML_ERROR_NOT_READY,
    )
    assert not any(bytes(info.clusterUuid))


def test_a_degraded_fabric_is_reported_in_the_health_mask_and_the_inventory() -> None:
    sim = SimNvml(rack_tray(load_machine("gb200-tray"), node="a1", rack="rack-a", degraded_bandwidth=True))
    sim.nvmlInit()
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    sim.nvmlDeviceGetGpuFabricInfoV(sim.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
    shift = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
    assert (info.healthMask >> shift) & 0b11 == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE
    assert all(g.fabric_degraded for g in read_node_hardware(sim, "a1").gpus)
    assert not any(g.fabric_degraded for g in tray("a2", "rack-a").gpus)


def test_a_machine_without_fabric_is_no_rack_tray() -> None:
    with pytest.raises(MachineError, match="hgx-h200 has no NVLink fabric"):
        rack_tray(load_machine("hgx-h200"), node="n", rack="r")
