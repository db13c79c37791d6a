"""The executor against simulated H100, H200, A100-80GB and A30 machines."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pynvml
import pytest

from tangram.events import MigPlacement
from tangram.hardware.machines import load_machine
from tangram.nvml import SimNvml, calls
from tangram.partitioning import InstanceNotFound, MigExecutor, PartitionError
from tests.partitioner.helpers import MINORS, enable_mig_with_reset, gpu_uuid, sim

# (profile id, name, starts, size) per product, as `nvidia-smi mig -lgip/-lgipp` lists them.
H100 = [
    (19, "1g.10gb", (0, 1, 2, 3, 4, 5, 6), 1),
    (20, "1g.10gb+me", (0, 1, 2, 3, 4, 5, 6), 1),
    (15, "1g.20gb", (0, 2, 4, 6), 2),
    (14, "2g.20gb", (0, 2, 4), 2),
    (9, "3g.40gb", (0, 4), 4),
    (5, "4g.40gb", (0,), 4),
    (0, "7g.80gb", (0,), 8),
]
H200 = [
    (19, "1g.18gb", (0, 1, 2, 3, 4, 5, 6), 1),
    (20, "1g.18gb+me", (0, 1, 2, 3, 4, 5, 6), 1),
    (15, "1g.35gb", (0, 2, 4, 6), 2),
    (14, "2g.35gb", (0, 2, 4), 2),
    (9, "3g.71gb", (0, 4), 4),
    (5, "4g.71gb", (0,), 4),
    (0, "7g.141gb", (0,), 8),
]
A100_80 = H100  # same names, ids and placements
A30 = [
    (14, "1g.6gb", (0, 1, 2, 3), 1),
    (21, "1g.6gb+me", (0, 1, 2, 3), 1),
    (5, "2g.12gb", (0, 2), 2),
    (6, "2g.12gb+me", (0, 2), 2),
    (0, "4g.24gb", (0,), 4),
]
# The driver's fixed GPU-instance id of a memory-slice range (nvidia-smi shows 1g at slice 0 as GI 7).
GI_ID_8 = {8: {0: 0}, 4: {0: 1, 4: 2}, 2: {0: 3, 2: 4, 4: 5, 6: 6}, 1: {s: 7 + s for s in range(7)}}
GI_ID_4 = {4: {0: 0}, 2: {0: 1, 2: 2}, 1: {s: 3 + s for s in range(4)}}

# machine, GPU index used (starts with MIG off and no instance), Ampere (MIG on by reset), table, ids
CASES = [
    ("dgx-h100", 2, False, H100, GI_ID_8),
    ("hgx-h200", 1, False, H200, GI_ID_8),
    ("a100-pcie-2x2", 2, True, A100_80, GI_ID_8),
    ("a30-4", 1, True, A30, GI_ID_4),
]


def _cap_minors(gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
    """NVIDIA's static numbering in /proc/driver/nvidia-caps/mig-minors (15 GIs x (1 + 8 CIs) per GPU)."""
    gi_minor = 3 + gpu_minor * 135 + gi * 9
    return gi_minor, gi_minor + 1 + ci


@pytest.mark.parametrize(
    ("machine", "gpu", "ampere", "profile_id", "name", "starts", "size", "gi_ids"),
    [(m, g, a, *row, ids) for m, g, a, table, ids in CASES for row in table],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_every_profile_and_placement_created_and_destroyed(
    machine: str,
    gpu: int,
    ampere: bool,
    profile_id: int,
    name: str,
    starts: tuple[int, ...],
    size: int,
    gi_ids: dict[int, dict[int, int]],
) -> None:
    nvml = sim(machine)
    if ampere:
        enable_mig_with_reset(nvml, gpu)
    executor = MigExecutor(nvml, minors=MINORS)
    uuid = gpu_uuid(nvml, gpu)
    seen_uuids = set()
    for start in starts:
        made = executor.create(uuid, profile_id, MigPlacement(start=start, size=size))
        assert (made.gpu_index, made.gpu_uuid, made.profile_id, made.profile) == (gpu, uuid, profile_id, name)
        assert made.placement == MigPlacement(start=start, size=size)
        assert made.gpu_instance_id == gi_ids[size][start]
        assert made.compute_instance_id == 0
        assert (made.gi_cap_minor, made.ci_cap_minor) == _cap_minors(gpu, made.gpu_instance_id, 0)
        assert made.mig_uuid.startswith("MIG-") and len(made.mig_uuid) == 40
        assert made.mig_uuid not in seen_uuids
        seen_uuids.add(made.mig_uuid)
        [observed] = executor.observe(gpu)
        assert (observed.mig_uuid, observed.compute_instance_ids, observed.in_use) == (
            made.mig_uuid,
            (0,),
            False,
        )
        gone = executor.destroy(gpu, placement=MigPlacement(start=start, size=size))
        assert (gone.mig_uuid, gone.gpu_instance_id, gone.profile) == (
            made.mig_uuid,
            made.gpu_instance_id,
            name,
        )
        assert executor.observe(gpu) == []
    assert executor.mig_enabled(gpu)  # MIG stays on after the last instance is gone


def test_hopper_mig_mode_is_turned_on_by_the_first_create() -> None:
    nvml = sim("dgx-h100")
    device = nvml.nvmlDeviceGetHandleByIndex(3)
    assert nvml.nvmlDeviceGetMigMode(device) == [pynvml.NVML_DEVICE_MIG_DISABLE] * 2
    MigExecutor(nvml, minors=MINORS).create(3, 9, MigPlacement(start=0, size=4))
    assert nvml.nvmlDeviceGetMigMode(device) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2


def test_hopper_with_processes_on_the_whole_gpu_keeps_mig_off() -> None:
    nvml = sim("dgx-h100")
    nvml.sim_attach_process(4)
    with pytest.raises(PartitionError) as failure:
        MigExecutor(nvml, minors=MINORS).create(4, 19, MigPlacement(start=0, size=1))
    assert failure.value.nvml_error == "NVML_ERROR_IN_USE"
    assert "1 compute process(es) run on the whole GPU" in failure.value.reason
    assert nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(4))[0] == pynvml.NVML_DEVICE_MIG_DISABLE


@pytest.mark.parametrize(("machine", "gpu"), [("a100-pcie-2x2", 0), ("a30-4", 2)])
def test_ampere_with_mig_off_is_refused_with_reset_reason(machine: str, gpu: int) -> None:
    nvml = sim(machine)
    with pytest.raises(PartitionError) as failure:
        MigExecutor(nvml, minors=MINORS).create(
            gpu, 0, MigPlacement(start=0, size=8 if "a100" in machine else 4)
        )
    assert "needs a GPU reset" in failure.value.reason
    assert failure.value.nvml_error == "NVML_ERROR_RESET_REQUIRED"
    # Nothing was left pending: the partitioner never asked for a mode change.
    assert nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(gpu)) == [0, 0]


def test_overlapping_placement_is_insufficient_resources() -> None:
    nvml = sim("hgx-h200")  # GPU 0: 3g.71gb at 0 and 1g.18gb at 4
    executor = MigExecutor(nvml, minors=MINORS)
    with pytest.raises(PartitionError) as failure:
        executor.create(0, 14, MigPlacement(start=2, size=2))
    assert failure.value.nvml_error == "NVML_ERROR_INSUFFICIENT_RESOURCES"
    assert failure.value.reason.startswith("creating 2g.35gb at slices 2+2 of GPU GPU-")
    assert "taken by another instance" in failure.value.reason
    assert [o.profile for o in executor.observe(0)] == ["3g.71gb", "1g.18gb"]


def test_placement_that_the_profile_does_not_have_is_named() -> None:
    nvml = sim("dgx-h100")
    with pytest.raises(
        PartitionError, match=r"slices 1\+2 is not a placement of 2g.20gb \(allowed: 0\+2, 2\+2, 4\+2\)"
    ):
        MigExecutor(nvml, minors=MINORS).create(0, 14, MigPlacement(start=1, size=2))
    with pytest.raises(PartitionError, match="profile id 77 is not offered"):
        MigExecutor(nvml, minors=MINORS).create(0, 77, MigPlacement(start=0, size=1))
    with pytest.raises(PartitionError, match="GPU GPU-nope is not on this node"):
        MigExecutor(nvml, minors=MINORS).create("GPU-nope", 19, MigPlacement(start=0, size=1))


def test_compute_instance_failure_rolls_the_gpu_instance_back() -> None:
    nvml = sim("dgx-h100")
    executor = MigExecutor(nvml, minors=MINORS)
    executor.create(0, 19, MigPlacement(start=6, size=1))
    nvml.sim_fail_next("nvmlGpuInstanceCreateComputeInstance", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(PartitionError) as failure:
        executor.create(0, 9, MigPlacement(start=0, size=4))
    assert failure.value.nvml_error == "NVML_ERROR_UNKNOWN"
    assert failure.value.reason.endswith("(GPU instance rolled back)")
    assert [(o.profile, o.placement.start) for o in executor.observe(0)] == [("1g.10gb", 6)]
    # The slices are free again.
    assert executor.create(0, 9, MigPlacement(start=0, size=4)).gpu_instance_id == 1


def test_destroy_in_use_is_refused_and_keeps_the_instance() -> None:
    nvml = sim("hgx-h200")
    executor = MigExecutor(nvml, minors=MINORS)
    [big, small] = executor.observe(0)
    nvml.sim_attach_process(0, gpu_instance_id=small.gpu_instance_id, compute_instance_id=0)
    with pytest.raises(PartitionError) as failure:
        executor.destroy(0, placement=small.placement)
    assert failure.value.nvml_error == "NVML_ERROR_IN_USE"
    assert executor.observe(0) == [big, dataclasses.replace(small, in_use=True)]
    with pytest.raises(InstanceNotFound):
        executor.destroy(0, placement=MigPlacement(start=6, size=1))


def test_reconfiguring_one_instance_leaves_the_others_untouched() -> None:
    nvml = sim("dgx-h100")
    executor = MigExecutor(nvml, minors=MINORS)
    executor.create(5, 14, MigPlacement(start=0, size=2))
    executor.create(5, 14, MigPlacement(start=2, size=2))
    executor.create(5, 9, MigPlacement(start=4, size=4))
    before = {
        o.placement.start: (o.mig_uuid, o.gpu_instance_id, o.compute_instance_ids)
        for o in executor.observe(5)
    }
    executor.destroy(5, placement=MigPlacement(start=2, size=2))
    executor.create(5, 19, MigPlacement(start=2, size=1))
    executor.create(5, 19, MigPlacement(start=3, size=1))
    after = {
        o.placement.start: (o.mig_uuid, o.gpu_instance_id, o.compute_instance_ids)
        for o in executor.observe(5)
    }
    assert after[0] == before[0] and after[4] == before[4]
    assert sorted(after) == [0, 2, 3, 4]


def test_disable_mig_only_without_instances_and_never_on_ampere() -> None:
    nvml = sim("dgx-h100")
    executor = MigExecutor(nvml, minors=MINORS)
    executor.create(6, 19, MigPlacement(start=0, size=1))
    assert executor.disable_mig(6) is False
    executor.destroy(6, placement=MigPlacement(start=0, size=1))
    assert executor.disable_mig(6) is True
    assert not executor.mig_enabled(6)
    ampere = sim("a100-pcie-2x2")
    a_exec = MigExecutor(ampere, minors=MINORS)
    a_exec.destroy(1, placement=MigPlacement(start=0, size=2))
    assert a_exec.disable_mig(1) is False
    assert a_exec.mig_enabled(1)


def test_half_created_instance_is_seen_as_empty() -> None:
    nvml = sim("dgx-h100")
    nvml.nvmlDeviceSetMigMode(nvml.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_DEVICE_MIG_ENABLE)
    calls.create_gpu_instance(nvml, nvml.nvmlDeviceGetHandleByIndex(0), 9, 4, 4)
    [observed] = MigExecutor(nvml, minors=MINORS).observe(0)
    assert (observed.empty, observed.mig_uuid, observed.gpu_instance_id) == (True, "", 2)


class _FirstReaderPauses(SimNvml):
    """Holds the first thread that reads GPU UUIDs after its first answer, until told to go on.

    That is the moment a UUID table filled in place holds one GPU out of eight.
    """

    def __init__(self, machine: str) -> None:
        super().__init__(load_machine(machine))
        self.armed = False
        self.first_reader: int | None = None
        self.answers = 0
        self.paused = threading.Event()
        self.go_on = threading.Event()

    def nvmlDeviceGetUUID(self, device: Any) -> str:
        uuid = super().nvmlDeviceGetUUID(device)
        if self.armed:
            if self.first_reader is None:
                self.first_reader = threading.get_ident()
            if self.first_reader == threading.get_ident():
                self.answers += 1
                if self.answers == 2:
                    self.paused.set()
                    assert self.go_on.wait(timeout=60), "the second caller never finished"
        return uuid


def test_concurrent_first_lookups_by_uuid_both_find_the_gpu() -> None:
    nvml = _FirstReaderPauses("hgx-h200")
    nvml.nvmlInit()
    last = nvml.nvmlDeviceGetCount() - 1
    wanted = gpu_uuid(nvml, last)
    executor = MigExecutor(nvml, minors=MINORS)
    nvml.armed = True
    first: list[tuple[int, Any, str] | BaseException] = []

    def lookup() -> None:
        try:
            first.append(executor.resolve(wanted))
        except BaseException as error:
            first.append(error)

    thread = threading.Thread(target=lookup)
    thread.start()
    try:
        assert nvml.paused.wait(timeout=60)  # the first lookup is half-way through reading the GPUs
        try:
            index, _, uuid = executor.resolve(wanted)
        finally:
            nvml.go_on.set()
    finally:
        thread.join(timeout=60)
    assert (index, uuid) == (last, wanted)
    assert len(first) == 1 and not isinstance(first[0], BaseException), first
    assert (first[0][0], first[0][2]) == (last, wanted)
