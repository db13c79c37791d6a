"""MIG placement rules as NVML enforces them, applied to the simulator's state."""

from __future__ import annotations

import pynvml

from tangram.hardware.catalogue import CI_INDEX_BY_SLICES, GiProfileSpec, GpuProduct
from tangram.nvml.sim.state import SimComputeInstance, SimGpu, SimGpuInstance

# Compute-instance sizes a GPU instance of N compute slices offers (`nvidia-smi mig -lcip`).
CI_SIZES_BY_GI_SLICES: dict[int, tuple[int, ...]] = {
    1: (1,),
    2: (1, 2),
    3: (1, 2, 3),
    4: (1, 2, 4),
    7: (1, 2, 3, 4, 7),
}
CI_SLICES_BY_PROFILE_ID: dict[int, int] = {v: k for k, v in CI_INDEX_BY_SLICES.items()}


def error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def gpu_instance_id(product: GpuProduct, start: int, size: int) -> int:
    """The driver's fixed id for a memory-slice range: its node number in the buddy tree of slices."""
    return (product.memory_slices // size - 1) + start // size


def create_gpu_instance(
    gpu: SimGpu, product: GpuProduct, profile_id: int, start: int, size: int
) -> SimGpuInstance:
    if gpu.mig_current != pynvml.NVML_DEVICE_MIG_ENABLE:
        raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    profile = product.profile_by_id(profile_id)
    if profile is None or start not in profile.starts or size != profile.memory_slices:
        raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    wanted = set(range(start, start + size))
    used_compute = 0
    for gi in gpu.gpu_instances:
        existing = product.profile_by_id(gi.profile_id)
        assert existing is not None
        used_compute += existing.compute_slices
        if wanted & set(range(gi.start, gi.start + gi.size)):
            raise error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        if profile.media_extensions and existing.media_extensions:
            raise error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    if used_compute + profile.compute_slices > product.compute_slices:
        raise error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    created = SimGpuInstance(
        id=gpu_instance_id(product, start, size), profile_id=profile_id, start=start, size=size
    )
    gpu.gpu_instances.append(created)
    gpu.gpu_instances.sort(key=lambda g: g.id)
    return created


def ci_sizes(profile: GiProfileSpec) -> tuple[int, ...]:
    return CI_SIZES_BY_GI_SLICES.get(profile.compute_slices, (profile.compute_slices,))


def create_compute_instance(
    gpu: SimGpu, gi: SimGpuInstance, profile: GiProfileSpec, ci_profile_id: int, uuid: str
) -> SimComputeInstance:
    size = CI_SLICES_BY_PROFILE_ID.get(ci_profile_id)
    if size is None:
        raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if size not in ci_sizes(profile):
        raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    taken = [False] * profile.compute_slices
    for ci in gi.compute_instances:
        for s in range(ci.start, ci.start + ci.size):
            taken[s] = True
    for start in range(0, profile.compute_slices - size + 1, size):
        if not any(taken[start : start + size]):
            break
    else:
        raise error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    used_ids = {ci.id for ci in gi.compute_instances}
    ci_id = next(i for i in range(profile.compute_slices + 1) if i not in used_ids)
    created = SimComputeInstance(id=ci_id, profile_id=ci_profile_id, start=start, size=size, uuid=uuid)
    gi.compute_instances.append(created)
    gi.compute_instances.sort(key=lambda c: c.id)
    return created


def destroy_compute_instance(gpu: SimGpu, gi: SimGpuInstance, ci: SimComputeInstance) -> None:
    if any(p.gpu_instance_id == gi.id and p.compute_instance_id == ci.id for p in gpu.processes):
        raise error(pynvml.NVML_ERROR_IN_USE)
    gi.compute_instances.remove(ci)


def destroy_gpu_instance(gpu: SimGpu, gi: SimGpuInstance) -> None:
    if gi.compute_instances or any(p.gpu_instance_id == gi.id for p in gpu.processes):
        raise error(pynvml.NVML_ERROR_IN_USE)
    gpu.gpu_instances.remove(gi)


def set_mig_mode(gpu: SimGpu, product: GpuProduct, mode: int) -> int:
    """Returns NVML's activation status: RESET_REQUIRED on Ampere, where the new mode stays pending."""
    if not product.mig_capable:
        raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    if mode not in (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE):
        raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if gpu.processes or gpu.gpu_instances:
        raise error(pynvml.NVML_ERROR_IN_USE)
    gpu.mig_pending = mode
    if product.mig_toggle_needs_reset and gpu.mig_current != mode:
        return int(pynvml.NVML_ERROR_RESET_REQUIRED)
    gpu.mig_current = mode
    return int(pynvml.NVML_SUCCESS)
