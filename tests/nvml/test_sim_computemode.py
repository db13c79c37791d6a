from pathlib import Path

import pynvml
import pytest

from tangram.nvml.sim import SimNvml

DEFAULT = pynvml.NVML_COMPUTEMODE_DEFAULT
EXCLUSIVE_PROCESS = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
PROHIBITED = pynvml.NVML_COMPUTEMODE_PROHIBITED


def _sim(name: str, state_file: Path | None = None) -> SimNvml:
    sim = SimNvml.from_machine(name, state_file=state_file)
    sim.nvmlInit()
    return sim


def test_nvml_enum_values_are_the_ones_the_simulator_speaks() -> None:
    assert (DEFAULT, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD, PROHIBITED, EXCLUSIVE_PROCESS) == (0, 1, 2, 3)


def test_every_gpu_boots_in_default_and_takes_each_supported_mode() -> None:
    sim = _sim("l40s-8")
    for index in range(sim.nvmlDeviceGetCount()):
        assert sim.nvmlDeviceGetComputeMode(sim.nvmlDeviceGetHandleByIndex(index)) == DEFAULT
    dev = sim.nvmlDeviceGetHandleByIndex(3)
    for mode in (EXCLUSIVE_PROCESS, PROHIBITED, DEFAULT):
        sim.nvmlDeviceSetComputeMode(dev, mode)
        assert sim.nvmlDeviceGetComputeMode(dev) == mode
    sim.nvmlDeviceSetComputeMode(dev, EXCLUSIVE_PROCESS)
    assert sim.nvmlDeviceGetComputeMode(sim.nvmlDeviceGetHandleByIndex(2)) == DEFAULT  # per GPU


@pytest.mark.parametrize("mode", [4, 7, 99, -1])
def test_a_mode_outside_the_enum_is_invalid_argument(mode: int) -> None:
    sim = _sim("l40s-8")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    sim.nvmlDeviceSetComputeMode(dev, PROHIBITED)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceSetComputeMode(dev, mode)
    assert sim.nvmlDeviceGetComputeMode(dev) == PROHIBITED  # unchanged


def test_exclusive_thread_is_no_longer_supported() -> None:
    sim = _sim("l40s-8")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceSetComputeMode(dev, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD)
    assert sim.nvmlDeviceGetComputeMode(dev) == DEFAULT


def test_mig_enabled_gpu_refuses_all_but_default() -> None:
    sim = _sim("hgx-h200")
    gpu = sim.nvmlDeviceGetHandleByIndex(0)  # shipped with MIG on
    assert sim.nvmlDeviceGetMigMode(gpu)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
    for mode in (EXCLUSIVE_PROCESS, PROHIBITED):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            sim.nvmlDeviceSetComputeMode(gpu, mode)
    sim.nvmlDeviceSetComputeMode(gpu, DEFAULT)
    assert sim.nvmlDeviceGetComputeMode(gpu) == DEFAULT
    sim.nvmlDeviceSetComputeMode(sim.nvmlDeviceGetHandleByIndex(1), EXCLUSIVE_PROCESS)  # MIG off


def test_a_mig_device_handle_reads_its_parent_and_cannot_be_set() -> None:
    sim = _sim("hgx-h200")
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(sim.nvmlDeviceGetHandleByIndex(0), 0)
    assert sim.nvmlDeviceGetUUID(mig).startswith("MIG-")
    assert sim.nvmlDeviceGetComputeMode(mig) == DEFAULT
    for mode in (DEFAULT, EXCLUSIVE_PROCESS):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            sim.nvmlDeviceSetComputeMode(mig, mode)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceSetComputeMode(mig, 42)


def test_lost_gpu_and_uninitialised_library_answer_as_nvml() -> None:
    sim = _sim("l40s-8")
    dev = sim.nvmlDeviceGetHandleByIndex(1)
    sim.sim_set_lost(1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetComputeMode(dev)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceSetComputeMode(dev, EXCLUSIVE_PROCESS)
    sim.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetComputeMode(sim.nvmlDeviceGetHandleByIndex(0))


def test_injected_fault_is_returned_once() -> None:
    sim = _sim("l40s-8")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    sim.sim_fail_next("nvmlDeviceSetComputeMode", pynvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        sim.nvmlDeviceSetComputeMode(dev, EXCLUSIVE_PROCESS)
    assert sim.nvmlDeviceGetComputeMode(dev) == DEFAULT
    sim.nvmlDeviceSetComputeMode(dev, EXCLUSIVE_PROCESS)
    assert sim.nvmlDeviceGetComputeMode(dev) == EXCLUSIVE_PROCESS


def test_mode_is_shared_through_the_state_file(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    writer, reader = _sim("dgx-h100", state), _sim("dgx-h100", state)
    writer.nvmlDeviceSetComputeMode(writer.nvmlDeviceGetHandleByIndex(5), EXCLUSIVE_PROCESS)
    assert reader.nvmlDeviceGetComputeMode(reader.nvmlDeviceGetHandleByIndex(5)) == EXCLUSIVE_PROCESS
    assert reader.nvmlDeviceGetComputeMode(reader.nvmlDeviceGetHandleByIndex(4)) == DEFAULT
