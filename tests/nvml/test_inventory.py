from itertools import combinations

import pynvml
import pytest

from tangram.hardware.machines import list_machines
from tangram.hardware.topology import Topology
from tangram.nvml.inventory import read_node_hardware, semver_driver
from tangram.nvml.sim import SimNvml


def _hw(name: str):  # type: ignore[no-untyped-def]
    sim = SimNvml.from_machine(name)
    sim.nvmlInit()
    return read_node_hardware(sim, name)


@pytest.mark.parametrize("machine", list_machines())
def test_every_machine_reads(machine: str) -> None:
    hw = _hw(machine)
    n = len(hw.gpus)
    assert n >= 4
    assert [(link.a, link.b) for link in hw.links] == list(combinations(range(n), 2))
    assert len({g.uuid for g in hw.gpus}) == n
    assert all(g.uuid.startswith("GPU-") and g.pcie_root for g in hw.gpus)


@pytest.mark.parametrize("machine", ["dgx-h100", "hgx-h200"])
def test_hgx_every_pair_is_nv18(machine: str) -> None:
    hw = _hw(machine)
    assert len(hw.links) == 28
    assert all(link.nvlinks == 18 and link.bandwidth_gbps == 900.0 for link in hw.links)
    assert len({g.nvlink_domain for g in hw.gpus}) == 1 and hw.gpus[0].nvlink_domain is not None
    topo = Topology.from_hardware(hw)
    assert topo.pair_score(0, 1) == 1820  # NODE 20 + 18 x 100
    assert topo.pair_score(0, 4) == 1810  # SYS 10 + 18 x 100


def test_h100_nvl_has_exactly_the_four_bridged_pairs() -> None:
    hw = _hw("h100-nvl-4x2")
    linked = [(link.a, link.b, link.nvlinks, link.bandwidth_gbps) for link in hw.links if link.nvlinks]
    assert linked == [(0, 1, 12, 600.0), (2, 3, 12, 600.0), (4, 5, 12, 600.0), (6, 7, 12, 600.0)]
    domains = [g.nvlink_domain for g in hw.gpus]
    assert domains[0] == domains[1] != domains[2] == domains[3]
    topo = Topology.from_hardware(hw)
    assert topo.pair_score(0, 1) == 1250  # PIX 50 + 12 x 100
    assert topo.pair_score(0, 2) == 40  # PXB
    assert topo.pair_score(1, 5) == 10  # SYS
    assert topo.set_score([0, 1, 2]) == 1250 + 40 + 40


def test_l40s_has_no_nvlink_but_pcie_levels() -> None:
    hw = _hw("l40s-8")
    assert all(link.nvlinks == 0 and link.bandwidth_gbps == 0.0 for link in hw.links)
    assert all(g.nvlink_domain is None for g in hw.gpus)
    levels = {(link.a, link.b): link.pcie_level for link in hw.links}
    assert (levels[(0, 1)], levels[(0, 2)], levels[(0, 4)]) == (10, 20, 50)


def test_gb200_tray_is_one_clique() -> None:
    hw = _hw("gb200-tray")
    cliques = {g.clique_id for g in hw.gpus}
    assert cliques == {"5a1c0e2b-7d3f-4c8a-9b6e-2f4d8c1a7e90.32766"}
    assert all(link.nvlinks == 18 and link.bandwidth_gbps == 1800.0 for link in hw.links)
    assert len({g.nvlink_domain for g in hw.gpus}) == 1


def test_a100_pairs_and_mig_state() -> None:
    hw = _hw("a100-pcie-2x2")
    assert [(link.a, link.b) for link in hw.links if link.nvlinks == 12] == [(0, 1), (2, 3)]
    gpu1 = hw.gpus[1]
    assert gpu1.mig_enabled and gpu1.mig_toggle_needs_reset
    [inst] = gpu1.mig_instances
    assert (inst.profile, inst.profile_id, inst.placement.start, inst.placement.size) == ("2g.20gb", 14, 0, 2)
    assert (inst.gpu_instance_id, inst.compute_instance_id) == (3, 0)
    assert inst.uuid.startswith("MIG-")
    # placements are reported with MIG off too
    assert [p.start for p in hw.gpus[0].mig_profiles[0].placements] == [0, 1, 2, 3, 4, 5, 6]
    assert hw.driver_version == "515.86.1" and hw.cuda_driver_version == "11.7"


def test_gpu_facts_from_nvml() -> None:
    gpu = _hw("hgx-h200").gpus[0]
    assert (gpu.name, gpu.product, gpu.memory_mib, gpu.multiprocessors) == (
        "NVIDIA H200",
        "H200-141GB",
        143771,
        132,
    )
    assert (gpu.memory_slices, gpu.compute_slices, gpu.cuda_compute_capability) == (8, 7, "9.0")
    assert [(m.profile, m.placement.start) for m in gpu.mig_instances] == [("3g.71gb", 0), ("1g.18gb", 4)]


def test_lost_gpu_is_unhealthy_and_health_override() -> None:
    sim = SimNvml.from_machine("l40s-8")
    sim.nvmlInit()
    sim.sim_set_lost(3)
    hw = read_node_hardware(sim, "n", health={5: ("unhealthy", "XID 48")})
    assert (hw.gpus[3].health, hw.gpus[5].health_reason, hw.gpus[0].health) == (
        "unhealthy",
        "XID 48",
        "healthy",
    )


def test_semver_driver() -> None:
    assert semver_driver("580.95.05") == "580.95.5"
    assert semver_driver("535.104") == "535.104.0"


def test_a_read_the_gpus_changed_under_is_read_again() -> None:
    """MIG turned off (or an instance destroyed) between two calls of one read: NVML answers
    NOT_SUPPORTED for a handle read a moment before; the inventory is read again, not lost."""
    nvml = SimNvml.from_machine("hgx-h200")
    nvml.nvmlInit()
    expected = read_node_hardware(nvml, "n1")
    nvml.sim_fail_next("nvmlDeviceGetGpuInstances", pynvml.NVML_ERROR_NOT_SUPPORTED, times=2)
    assert read_node_hardware(nvml, "n1") == expected
    nvml.sim_fail_next("nvmlDeviceGetGpuInstances", pynvml.NVML_ERROR_NOT_SUPPORTED, times=5)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        read_node_hardware(nvml, "n1")
