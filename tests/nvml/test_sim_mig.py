import ctypes
from pathlib import Path

import pynvml
import pytest

from tangram.nvml import calls
from tangram.nvml.inventory import read_node_hardware
from tangram.nvml.sim import SimNvml

ENABLE, DISABLE = pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_DISABLE


def _sim(name: str, state_file: Path | None = None) -> SimNvml:
    sim = SimNvml.from_machine(name, state_file=state_file)
    sim.nvmlInit()
    return sim


def _full_ci(sim: SimNvml, gi: object, gi_slices: int) -> object:
    ci_index = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[gi_slices]
    info = sim.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, ci_index, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    return sim.nvmlGpuInstanceCreateComputeInstance(gi, info.id)


def test_calls_before_init_are_uninitialized() -> None:
    sim = SimNvml.from_machine("l40s-8")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()


def test_overlapping_placement_is_insufficient_resources() -> None:
    sim = _sim("dgx-h100")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceSetMigMode(dev, ENABLE) == pynvml.NVML_SUCCESS  # Hopper: no reset
    assert sim.nvmlDeviceGetMigMode(dev) == [ENABLE, ENABLE]
    calls.create_gpu_instance(sim, dev, 9, 0, 4)  # 3g.40gb at 0
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        calls.create_gpu_instance(sim, dev, 14, 2, 2)  # 2g.20gb at 2 overlaps
    with pytest.raises(pynvml.NVMLError) as exc:
        calls.create_gpu_instance(sim, dev, 14, 1, 2)  # not a placement of 2g
    assert exc.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_media_extension_profile_once_per_gpu() -> None:
    sim = _sim("dgx-h100")
    dev = sim.nvmlDeviceGetHandleByIndex(1)
    sim.nvmlDeviceSetMigMode(dev, ENABLE)
    calls.create_gpu_instance(sim, dev, 20, 0, 1)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        calls.create_gpu_instance(sim, dev, 20, 3, 1)
    calls.create_gpu_instance(sim, dev, 19, 3, 1)


def test_mig_calls_with_mig_off_are_not_supported_but_placements_work() -> None:
    sim = _sim("dgx-h100")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    assert calls.possible_placements(sim, dev, 15) == [(0, 2), (2, 2), (4, 2), (6, 2)]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        calls.create_gpu_instance(sim, dev, 9, 0, 4)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        calls.gpu_instances(sim, dev, 9, 2)
    l40s = _sim("l40s-8")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        l40s.nvmlDeviceGetMigMode(l40s.nvmlDeviceGetHandleByIndex(0))


def test_profile_info_takes_the_index_and_returns_the_id() -> None:
    sim = _sim("hgx-h200")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    info = sim.nvmlDeviceGetGpuInstanceProfileInfo(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2)
    assert (info.id, info.name, info.memorySizeMB, info.instanceCount) == (15, "MIG 1g.35gb", 33024, 4)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetGpuInstanceProfileInfo(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)


def test_destroy_refused_while_compute_instance_or_process_exists() -> None:
    sim = _sim("hgx-h200")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    [gi] = calls.gpu_instances(sim, dev, 19, 7)  # the shipped 1g.18gb at slice 4
    with pytest.raises(pynvml.NVMLError_InUse):
        sim.nvmlGpuInstanceDestroy(gi)
    gi_id = sim.nvmlGpuInstanceGetInfo(gi).id
    assert gi_id == 11  # fixed id of memory slice 4 in the 8-slice tree
    pid = sim.sim_attach_process(0, gpu_instance_id=gi_id, compute_instance_id=0)
    [ci] = calls.compute_instances(sim, gi, 0)
    with pytest.raises(pynvml.NVMLError_InUse):
        sim.nvmlComputeInstanceDestroy(ci)
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(dev, 1)
    assert [p.pid for p in sim.nvmlDeviceGetComputeRunningProcesses(mig)] == [pid]
    sim.sim_detach_process(pid)
    sim.nvmlComputeInstanceDestroy(ci)
    sim.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlGpuInstanceGetInfo(gi)  # stale handle


def test_ampere_mig_toggle_needs_reset() -> None:
    sim = _sim("a100-pcie-2x2")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceSetMigMode(dev, ENABLE) == pynvml.NVML_ERROR_RESET_REQUIRED
    assert sim.nvmlDeviceGetMigMode(dev) == [DISABLE, ENABLE]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        calls.create_gpu_instance(sim, dev, 0, 0, 8)
    sim.sim_reset_gpu(0)
    assert sim.nvmlDeviceGetMigMode(dev) == [ENABLE, ENABLE]
    calls.create_gpu_instance(sim, dev, 0, 0, 8)


def test_mig_enable_refused_with_processes_and_disable_with_instances() -> None:
    sim = _sim("hgx-h200")
    pid = sim.sim_attach_process(1)
    with pytest.raises(pynvml.NVMLError_InUse):
        sim.nvmlDeviceSetMigMode(sim.nvmlDeviceGetHandleByIndex(1), ENABLE)
    sim.sim_detach_process(pid)
    with pytest.raises(pynvml.NVMLError_InUse):
        sim.nvmlDeviceSetMigMode(sim.nvmlDeviceGetHandleByIndex(0), DISABLE)


@pytest.mark.parametrize(
    ("machine", "gpu"), [("dgx-h100", 0), ("hgx-h200", 1), ("a100-pcie-2x2", 1), ("a30-4", 1)]
)
def test_every_placement_of_every_profile_creates_and_destroys(machine: str, gpu: int) -> None:
    sim = _sim(machine)
    dev = sim.nvmlDeviceGetHandleByIndex(gpu)
    if (
        sim.nvmlDeviceGetMigMode(dev)[0] != ENABLE
        and sim.nvmlDeviceSetMigMode(dev, ENABLE) == pynvml.NVML_ERROR_RESET_REQUIRED
    ):
        sim.sim_reset_gpu(gpu)
    for gi in calls.gpu_instances(sim, dev, 14, 7):  # clear the shipped layout
        for ci in calls.compute_instances(sim, gi, 0) + calls.compute_instances(sim, gi, 1):
            sim.nvmlComputeInstanceDestroy(ci)
        sim.nvmlGpuInstanceDestroy(gi)
    created = 0
    for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = sim.nvmlDeviceGetGpuInstanceProfileInfo(dev, index)
        except pynvml.NVMLError_NotSupported:
            continue
        for start, size in calls.possible_placements(sim, dev, info.id):
            gi = calls.create_gpu_instance(sim, dev, info.id, start, size)
            ci = _full_ci(sim, gi, info.sliceCount)
            uuid = sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetMigDeviceHandleByIndex(dev, 0))
            assert uuid.startswith("MIG-")
            sim.nvmlComputeInstanceDestroy(ci)
            sim.nvmlGpuInstanceDestroy(gi)
            created += 1
    assert created == (4 + 4 + 2 + 2 + 1 if machine == "a30-4" else 7 + 7 + 4 + 3 + 2 + 1 + 1)
    assert read_node_hardware(sim, "n").gpus[gpu].mig_instances == []


def test_full_h100_layouts() -> None:
    sim = _sim("dgx-h100")
    dev = sim.nvmlDeviceGetHandleByIndex(2)
    sim.nvmlDeviceSetMigMode(dev, ENABLE)
    for start in range(7):
        calls.create_gpu_instance(sim, dev, 19, start, 1)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        calls.create_gpu_instance(sim, dev, 20, 6, 1)
    gpu_ids = [sim.nvmlGpuInstanceGetInfo(gi).id for gi in calls.gpu_instances(sim, dev, 19, 7)]
    assert gpu_ids == [7, 8, 9, 10, 11, 12, 13]


def test_compute_instances_inside_a_3g() -> None:
    sim = _sim("dgx-h100")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    sim.nvmlDeviceSetMigMode(dev, ENABLE)
    gi = calls.create_gpu_instance(sim, dev, 9, 4, 4)
    one = sim.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 0)
    assert (one.id, one.instanceCount, one.multiprocessorCount, one.name) == (0, 3, 20, "MIG 1c.3g.40gb")
    for _ in range(3):
        sim.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        sim.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlGpuInstanceCreateComputeInstance(gi, 4)  # 7-slice CI in a 3g


def test_fault_injection_between_gi_and_ci_creation() -> None:
    sim = _sim("dgx-h100")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    sim.nvmlDeviceSetMigMode(dev, ENABLE)
    sim.sim_fail_next("nvmlGpuInstanceCreateComputeInstance", pynvml.NVML_ERROR_UNKNOWN)
    gi = calls.create_gpu_instance(sim, dev, 14, 0, 2)
    with pytest.raises(pynvml.NVMLError_Unknown):
        sim.nvmlGpuInstanceCreateComputeInstance(gi, 1)
    [half] = read_node_hardware(sim, "n").gpus[0].mig_instances
    assert (half.profile, half.compute_instance_id, half.uuid) == ("2g.20gb", -1, "")
    sim.nvmlGpuInstanceCreateComputeInstance(gi, 1)  # the fault was used once
    with pytest.raises(ValueError, match="not an NVML function"):
        sim.sim_fail_next("createEverything", 1)


def test_state_file_is_shared_between_instances(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    first, second = _sim("dgx-h100", state), _sim("dgx-h100", state)
    dev = first.nvmlDeviceGetHandleByIndex(3)
    first.nvmlDeviceSetMigMode(dev, ENABLE)
    gi = calls.create_gpu_instance(first, dev, 5, 0, 4)
    _full_ci(first, gi, 4)
    seen = read_node_hardware(second, "n").gpus[3]
    assert seen.mig_enabled and [(m.profile, m.placement.start) for m in seen.mig_instances] == [
        ("4g.40gb", 0)
    ]
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        calls.create_gpu_instance(second, second.nvmlDeviceGetHandleByIndex(3), 9, 0, 4)
    second.sim_fail_next("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(pynvml.NVMLError_Unknown):
        first.nvmlDeviceGetCount()
    assert first.nvmlDeviceGetCount() == 8


def test_state_file_of_another_machine_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    _sim("dgx-h100", state)
    with pytest.raises(RuntimeError, match="belongs to machine 'dgx-h100', not 'l40s-8'"):
        SimNvml.from_machine("l40s-8", state_file=state)


def test_xid_event_reaches_event_set() -> None:
    sim = _sim("l40s-8")
    events = sim.nvmlEventSetCreate()
    sim.nvmlDeviceRegisterEvents(
        sim.nvmlDeviceGetHandleByIndex(2), pynvml.nvmlEventTypeXidCriticalError, events
    )
    sim.sim_inject_xid(2, 79)
    data = sim.nvmlEventSetWait(events, 1000)
    assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 79)
    assert (
        ctypes.cast(data.device, ctypes.c_void_p).value
        == ctypes.cast(sim.nvmlDeviceGetHandleByIndex(2), ctypes.c_void_p).value
    )
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait(events, 0)
    sim.nvmlEventSetFree(events)


def test_xid_events_written_by_another_process_reach_a_waiting_event_set_one_by_one(tmp_path: Path) -> None:
    # the discovery's watcher and the injecting process share the state file; waits that find the
    # file unchanged do not read it again, so each event must still be delivered once, in order
    state = tmp_path / "node.json"
    watcher = _sim("l40s-8", state)
    injector = _sim("l40s-8", state)
    events = watcher.nvmlEventSetCreate()
    for index in (1, 3):
        watcher.nvmlDeviceRegisterEvents(
            watcher.nvmlDeviceGetHandleByIndex(index), pynvml.nvmlEventTypeXidCriticalError, events
        )
    with pytest.raises(pynvml.NVMLError_Timeout):
        watcher.nvmlEventSetWait(events, 30)
    injector.sim_inject_xid(3, 48)
    injector.sim_inject_xid(1, 79)
    injector.sim_inject_xid(3, 94)
    seen = [watcher.nvmlEventSetWait(events, 1000).eventData for _ in range(3)]
    assert sorted(seen) == [48, 79, 94]
    assert seen.index(48) < seen.index(94)  # one GPU's events in the order they came
    with pytest.raises(pynvml.NVMLError_Timeout):
        watcher.nvmlEventSetWait(events, 30)
