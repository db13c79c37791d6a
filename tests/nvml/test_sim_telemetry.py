"""What the simulator tells of GPU use, as NVML and NVIDIA's DCGM exporter tell it: utilization and
power from the processes a test attaches, NOT_SUPPORTED where real GPUs answer so, and the
exporter's metric names and labels for whole GPUs and MIG devices."""

from __future__ import annotations

import re

import pynvml
import pytest

from tangram.nvml.inventory import read_node_hardware
from tangram.nvml.sim import SimNvml
from tangram.nvml.sim.dcgm import exporter_text

# hgx-h200: GPU 0 comes in MIG mode with a 3g.71gb (GPU instance 1) and a 1g.18gb (11)
MACHINE = "hgx-h200"


@pytest.fixture
def sim() -> SimNvml:
    nvml = SimNvml.from_machine(MACHINE)
    nvml.nvmlInit()
    return nvml


def samples(text: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    found = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            found[frozenset(re.findall(r'(\w+)="([^"]*)"', labels))] = float(value)
    return found


def test_utilization_and_power_follow_the_processes_and_mig_answers_not_supported(sim: SimNvml) -> None:
    gpu1 = sim.nvmlDeviceGetHandleByIndex(1)
    idle_mw = sim.nvmlDeviceGetPowerUsage(gpu1)
    assert sim.nvmlDeviceGetUtilizationRates(gpu1).gpu == 0
    sim.sim_attach_process(1, sm_percent=30)
    sim.sim_attach_process(1, sm_percent=50)
    assert sim.nvmlDeviceGetUtilizationRates(gpu1).gpu == 80
    assert sim.nvmlDeviceGetPowerUsage(gpu1) > idle_mw
    sim.sim_attach_process(1, sm_percent=60)
    assert sim.nvmlDeviceGetUtilizationRates(gpu1).gpu == 100  # a GPU is at most all busy
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetUtilizationRates(sim.nvmlDeviceGetHandleByIndex(0))  # in MIG mode
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetUtilizationRates(
            sim.nvmlDeviceGetMigDeviceHandleByIndex(sim.nvmlDeviceGetHandleByIndex(0), 0)
        )
    with pytest.raises(ValueError, match="not a percentage"):
        sim.sim_attach_process(1, sm_percent=101)


def test_the_exporter_labels_whole_gpus_and_mig_devices_as_dcgm_does(sim: SimNvml) -> None:
    hardware = read_node_hardware(sim, "node-a")
    gpu0, gpu1 = hardware.gpus[0], hardware.gpus[1]
    small = next(i for i in gpu0.mig_instances if i.profile == "1g.18gb")
    sim.sim_attach_process(1, sm_percent=40, used_mib=2048)
    sim.sim_attach_process(
        0, gpu_instance_id=small.gpu_instance_id, compute_instance_id=small.compute_instance_id, sm_percent=70
    )
    text = exporter_text(sim, "node-a")

    whole = frozenset(
        {
            ("gpu", "1"),
            ("UUID", gpu1.uuid),
            ("pci_bus_id", gpu1.pci_bus_id),
            ("device", f"nvidia{gpu1.minor}"),
            ("modelName", gpu1.name),
            ("Hostname", "node-a"),
            ("DCGM_FI_DRIVER_VERSION", sim.nvmlSystemGetDriverVersion()),
        }
    )
    assert samples(text, "DCGM_FI_DEV_GPU_UTIL")[whole] == 40
    assert samples(text, "DCGM_FI_DEV_FB_USED")[whole] == 2048
    assert samples(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")[whole] == 0.4
    mig = frozenset(
        {*(pair for pair in whole if pair[0] not in {"gpu", "UUID", "pci_bus_id", "device", "modelName"})}
        | {
            ("gpu", "0"),
            ("UUID", gpu0.uuid),
            ("pci_bus_id", gpu0.pci_bus_id),
            ("device", f"nvidia{gpu0.minor}"),
            ("modelName", gpu0.name),
            ("GPU_I_PROFILE", "1g.18gb"),
            ("GPU_I_ID", str(small.gpu_instance_id)),
        }
    )
    assert samples(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")[mig] == 0.7
    # a GPU in MIG mode has no utilization series, neither whole nor per MIG device
    assert not [k for k in samples(text, "DCGM_FI_DEV_GPU_UTIL") if ("UUID", gpu0.uuid) in k]
    # power is the GPU's, never a MIG device's
    assert all(
        ("GPU_I_ID", str(small.gpu_instance_id)) not in k for k in samples(text, "DCGM_FI_DEV_POWER_USAGE")
    )
    assert "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge" in text


def test_a_gpu_off_the_bus_has_no_series(sim: SimNvml) -> None:
    uuid = read_node_hardware(sim, "node-a").gpus[2].uuid
    sim.sim_set_lost(2)
    assert uuid not in exporter_text(sim, "node-a")
