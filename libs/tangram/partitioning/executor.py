"""MIG instances created and destroyed through NVML calls only, so it runs unchanged on the simulator.

Synchronous: the service runs each call in a worker thread, one operation at a time per GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pynvml

from tangram.events import MigPlacement
from tangram.nvml import NvmlBackend, calls
from tangram.partitioning.errors import PartitionError, nvml_error_name
from tangram.partitioning.model import CreatedInstance, DestroyedInstance, ObservedInstance
from tangram.partitioning.policy import enable_mig_refusal, mig_toggle_needs_reset

log = logging.getLogger("tangram.partitioning")

GpuRef = int | str  # a GPU index or a GPU UUID
_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
_DISABLE = pynvml.NVML_DEVICE_MIG_DISABLE
_SHARED = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED


class InstanceNotFound(PartitionError):
    """No GPU instance where a destroy looked for one (already gone: the wanted state holds)."""


def _slices(placement: MigPlacement) -> str:
    return f"slices {placement.start}+{placement.size}"


class MigExecutor:
    def __init__(self, nvml: NvmlBackend, *, minors: Mapping[str, int]) -> None:
        """`minors` is the parsed mig-minors table (tangram.nvml.parse_mig_minors)."""
        self._nvml = nvml
        self._minors = minors
        # Built once, on first use; replaced whole, never filled in place (see _uuid_table).
        self._index_by_uuid: dict[str, int] | None = None

    # ---- GPUs and profiles --------------------------------------------------------------------------

    def gpu_count(self) -> int:
        return self._nvml.nvmlDeviceGetCount()

    def resolve(self, gpu: GpuRef) -> tuple[int, Any, str]:
        """(index, device handle, UUID) of a GPU named by index or UUID."""
        nvml = self._nvml
        if isinstance(gpu, int):
            if not 0 <= gpu < nvml.nvmlDeviceGetCount():
                raise PartitionError(f"GPU index {gpu} does not exist on this node")
            device = nvml.nvmlDeviceGetHandleByIndex(gpu)
            return gpu, device, calls.text(nvml.nvmlDeviceGetUUID(device))
        found = self._uuid_table().get(gpu)
        if found is None:
            raise PartitionError(f"GPU {gpu} is not on this node")
        return found, nvml.nvmlDeviceGetHandleByIndex(found), gpu

    def _uuid_table(self) -> dict[str, int]:
        """UUID -> index of every GPU on the node.

        The partitioner works several GPUs at once from worker threads, so first calls can run
        concurrently: each builds a complete table and only then publishes it (one attribute store),
        so no caller ever reads a table that another one is still filling.
        """
        table = self._index_by_uuid
        if table is None:
            nvml = self._nvml
            table = {
                calls.text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))): index
                for index in range(nvml.nvmlDeviceGetCount())
            }
            self._index_by_uuid = table
        return table

    def _gi_profiles(self, device: Any) -> list[Any]:
        """GPU-instance profile infos; NVML is queried by profile index and answers the real id."""
        found = []
        for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                found.append(self._nvml.nvmlDeviceGetGpuInstanceProfileInfo(device, index))
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                continue
        return found

    def _gi_profile(self, device: Any, profile_id: int) -> Any:
        for info in self._gi_profiles(device):
            if info.id == profile_id:
                return info
        raise PartitionError(f"GPU-instance profile id {profile_id} is not offered by this GPU")

    def _full_ci_profile(self, gpu_instance: Any, compute_slices: int) -> Any:
        """The compute-instance profile that spans the whole GPU instance (the default one)."""
        for index in reversed(range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
            try:
                info = self._nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gpu_instance, index, _SHARED)
            except pynvml.NVMLError:
                continue
            if info.sliceCount == compute_slices:
                return info
        raise PartitionError(f"no compute-instance profile spans all {compute_slices} compute slices")

    # ---- reading --------------------------------------------------------------------------------------

    def mig_enabled(self, gpu: GpuRef) -> bool:
        _, device, _ = self.resolve(gpu)
        try:
            return bool(self._nvml.nvmlDeviceGetMigMode(device)[0] == _ENABLE)
        except pynvml.NVMLError_NotSupported:
            return False

    def observe(self, gpu: GpuRef) -> list[ObservedInstance]:
        """Every GPU instance on the GPU, including ones without a compute instance."""
        index, device, uuid = self.resolve(gpu)
        nvml = self._nvml
        try:
            if nvml.nvmlDeviceGetMigMode(device)[0] != _ENABLE:
                return []
        except pynvml.NVMLError_NotSupported:
            return []
        mig_devices = calls.mig_devices(self._nvml, device)
        found = []
        for profile in self._gi_profiles(device):
            name = calls.profile_name(profile.name)
            for gi in calls.gpu_instances(nvml, device, profile.id, profile.instanceCount):
                info = nvml.nvmlGpuInstanceGetInfo(gi)
                ci_ids = tuple(sorted(self._ci_ids(gi)))
                first = mig_devices.get((info.id, ci_ids[0]), ("", False)) if ci_ids else ("", False)
                busy = any(mig_devices.get((info.id, c), ("", False))[1] for c in ci_ids)
                found.append(
                    ObservedInstance(
                        gpu_index=index,
                        gpu_uuid=uuid,
                        profile_id=profile.id,
                        profile=name,
                        placement=MigPlacement(start=info.placement.start, size=info.placement.size),
                        gpu_instance_id=info.id,
                        compute_instance_ids=ci_ids,
                        mig_uuid=first[0],
                        in_use=busy or first[1],
                    )
                )
        return sorted(found, key=lambda o: (o.placement.start, o.gpu_instance_id))

    def observe_all(self) -> list[ObservedInstance]:
        return [
            o for index in range(self.gpu_count()) if self._mig_capable(index) for o in self.observe(index)
        ]

    def _mig_capable(self, index: int) -> bool:
        try:
            self._nvml.nvmlDeviceGetMigMode(self._nvml.nvmlDeviceGetHandleByIndex(index))
        except pynvml.NVMLError_NotSupported:
            return False
        return True

    def find(self, gpu: GpuRef, placement: MigPlacement) -> ObservedInstance | None:
        return next((o for o in self.observe(gpu) if o.placement == placement), None)

    def _ci_ids(self, gpu_instance: Any) -> list[int]:
        ids = []
        for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = self._nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gpu_instance, index, _SHARED)
                cis = calls.compute_instances(self._nvml, gpu_instance, info.id)
            except pynvml.NVMLError:
                continue
            ids += [self._nvml.nvmlComputeInstanceGetInfo(ci).id for ci in cis]
        return ids

    def _compute_instances(self, gpu_instance: Any) -> list[Any]:
        found = []
        for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = self._nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gpu_instance, index, _SHARED)
                found += calls.compute_instances(self._nvml, gpu_instance, info.id)
            except pynvml.NVMLError:
                continue
        return found

    def cap_minors(self, gpu: GpuRef, gpu_instance_id: int, compute_instance_id: int) -> tuple[int, int]:
        _, device, _ = self.resolve(gpu)
        minor = self._nvml.nvmlDeviceGetMinorNumber(device)
        gi_key = f"gpu{minor}/gi{gpu_instance_id}/access"
        ci_key = f"gpu{minor}/gi{gpu_instance_id}/ci{compute_instance_id}/access"
        missing = [k for k in (gi_key, ci_key) if k not in self._minors]
        if missing:
            raise PartitionError(f"the mig-minors table has no entry {missing[0]}")
        return self._minors[gi_key], self._minors[ci_key]

    def describe(self, observed: ObservedInstance) -> CreatedInstance:
        """An existing, complete instance in the shape `create` returns."""
        if observed.empty:
            raise PartitionError(f"GPU instance {observed.gpu_instance_id} has no compute instance")
        ci_id = observed.compute_instance_ids[0]
        gi_minor, ci_minor = self.cap_minors(observed.gpu_index, observed.gpu_instance_id, ci_id)
        return CreatedInstance(
            gpu_index=observed.gpu_index,
            gpu_uuid=observed.gpu_uuid,
            profile_id=observed.profile_id,
            profile=observed.profile,
            placement=observed.placement,
            mig_uuid=observed.mig_uuid,
            gpu_instance_id=observed.gpu_instance_id,
            compute_instance_id=ci_id,
            gi_cap_minor=gi_minor,
            ci_cap_minor=ci_minor,
        )

    # ---- changing -------------------------------------------------------------------------------------

    def create(self, gpu: GpuRef, profile_id: int, placement: MigPlacement) -> CreatedInstance:
        """A GPU instance at `placement` and its default compute instance; all or nothing."""
        try:
            return self._create(gpu, profile_id, placement)
        except pynvml.NVMLError as exc:
            raise PartitionError.from_nvml(f"reading GPU {gpu}", exc) from None

    def _create(self, gpu: GpuRef, profile_id: int, placement: MigPlacement) -> CreatedInstance:
        nvml = self._nvml
        index, device, uuid = self.resolve(gpu)
        profile = self._gi_profile(device, profile_id)
        name = calls.profile_name(profile.name)
        allowed = calls.possible_placements(nvml, device, profile_id)
        if (placement.start, placement.size) not in allowed:
            listed = ", ".join(f"{s}+{z}" for s, z in allowed)
            raise PartitionError(
                f"{_slices(placement)} is not a placement of {name} (allowed: {listed})",
                nvml_error=nvml_error_name(pynvml.NVML_ERROR_INVALID_ARGUMENT),
            )
        self._ensure_mig_on(device, uuid)
        doing = f"creating {name} at {_slices(placement)} of GPU {uuid}"
        try:
            gpu_instance = calls.create_gpu_instance(
                nvml, device, profile_id, placement.start, placement.size
            )
        except pynvml.NVMLError as exc:
            raise PartitionError.from_nvml(doing, exc) from None
        gi_id = nvml.nvmlGpuInstanceGetInfo(gpu_instance).id
        compute_instance = None
        try:
            ci_profile = self._full_ci_profile(gpu_instance, profile.sliceCount)
            compute_instance = nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, ci_profile.id)
            ci_id = nvml.nvmlComputeInstanceGetInfo(compute_instance).id
            mig_uuid = calls.mig_devices(self._nvml, device).get((gi_id, ci_id), ("", False))[0]
            if not mig_uuid:
                raise PartitionError(
                    f"NVML shows no MIG device for GPU instance {gi_id}, compute instance {ci_id}"
                )
            gi_minor, ci_minor = self.cap_minors(index, gi_id, ci_id)
        except (pynvml.NVMLError, PartitionError) as exc:
            self._roll_back(gpu_instance, compute_instance, gi_id)
            if isinstance(exc, PartitionError):
                raise PartitionError(
                    f"{doing}: {exc.reason} (GPU instance rolled back)", nvml_error=exc.nvml_error
                ) from None
            failed = PartitionError.from_nvml(f"{doing}: compute instance", exc)
            raise PartitionError(
                f"{failed.reason} (GPU instance rolled back)", nvml_error=failed.nvml_error
            ) from None
        return CreatedInstance(
            gpu_index=index,
            gpu_uuid=uuid,
            profile_id=profile_id,
            profile=name,
            placement=placement,
            mig_uuid=mig_uuid,
            gpu_instance_id=gi_id,
            compute_instance_id=ci_id,
            gi_cap_minor=gi_minor,
            ci_cap_minor=ci_minor,
        )

    def _roll_back(self, gpu_instance: Any, compute_instance: Any | None, gi_id: int) -> None:
        try:
            if compute_instance is not None:
                self._nvml.nvmlComputeInstanceDestroy(compute_instance)
            self._nvml.nvmlGpuInstanceDestroy(gpu_instance)
        except pynvml.NVMLError as exc:
            # Left for start-up reconciliation, which removes GPU instances without compute instances.
            log.error(
                "rollback of a half-created MIG instance failed",
                extra={"gpu_instance_id": gi_id, "nvml_error": nvml_error_name(exc)},
            )

    def _ensure_mig_on(self, device: Any, uuid: str) -> None:
        nvml = self._nvml
        current, _pending = nvml.nvmlDeviceGetMigMode(device)
        if current == _ENABLE:
            return
        major, _ = nvml.nvmlDeviceGetCudaComputeCapability(device)
        needs_reset = mig_toggle_needs_reset(major)
        processes = len(nvml.nvmlDeviceGetComputeRunningProcesses(device))
        refusal = enable_mig_refusal(needs_reset=needs_reset, processes=processes)
        if refusal is not None:
            code = pynvml.NVML_ERROR_RESET_REQUIRED if needs_reset else pynvml.NVML_ERROR_IN_USE
            raise PartitionError(f"GPU {uuid}: {refusal}", nvml_error=nvml_error_name(code))
        try:
            status = nvml.nvmlDeviceSetMigMode(device, _ENABLE)
        except pynvml.NVMLError as exc:
            raise PartitionError.from_nvml(f"enabling MIG mode on GPU {uuid}", exc) from None
        if status != pynvml.NVML_SUCCESS or nvml.nvmlDeviceGetMigMode(device)[0] != _ENABLE:
            raise PartitionError(
                f"enabling MIG mode on GPU {uuid} needs a GPU reset", nvml_error=nvml_error_name(status)
            )
        log.info("MIG mode enabled", extra={"gpu_uuid": uuid})

    def destroy(
        self, gpu: GpuRef, *, placement: MigPlacement | None = None, gpu_instance_id: int | None = None
    ) -> DestroyedInstance:
        """Compute instances, then the GPU instance; refused while processes run on it."""
        if (placement is None) == (gpu_instance_id is None):
            raise ValueError("name the instance by exactly one of placement or gpu_instance_id")
        try:
            return self._destroy(gpu, placement, gpu_instance_id)
        except pynvml.NVMLError as exc:
            raise PartitionError.from_nvml(f"reading GPU {gpu}", exc) from None

    def _destroy(self, gpu: GpuRef, placement: MigPlacement | None, gi_id: int | None) -> DestroyedInstance:
        nvml = self._nvml
        index, device, uuid = self.resolve(gpu)
        where = _slices(placement) if placement is not None else f"GPU instance {gi_id}"
        target = next(
            (
                o
                for o in self.observe(index)
                if (placement is not None and o.placement == placement) or o.gpu_instance_id == gi_id
            ),
            None,
        )
        if target is None:
            raise InstanceNotFound(
                f"no GPU instance at {where} of GPU {uuid}",
                nvml_error=nvml_error_name(pynvml.NVML_ERROR_NOT_FOUND),
            )
        doing = f"destroying {target.profile} at {_slices(target.placement)} of GPU {uuid}"
        if target.in_use:
            raise PartitionError(
                f"{doing}: compute processes run on it", nvml_error=nvml_error_name(pynvml.NVML_ERROR_IN_USE)
            )
        try:
            gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(device, target.gpu_instance_id)
            for compute_instance in self._compute_instances(gpu_instance):
                nvml.nvmlComputeInstanceDestroy(compute_instance)
            nvml.nvmlGpuInstanceDestroy(gpu_instance)
        except pynvml.NVMLError as exc:
            raise PartitionError.from_nvml(doing, exc) from None
        return DestroyedInstance(
            gpu_index=index,
            gpu_uuid=uuid,
            profile=target.profile,
            placement=target.placement,
            mig_uuid=target.mig_uuid,
            gpu_instance_id=target.gpu_instance_id,
        )

    def needs_reset(self, gpu: GpuRef) -> bool:
        """Whether a MIG mode change on this GPU takes effect only after a GPU reset."""
        _, device, _ = self.resolve(gpu)
        major, _ = self._nvml.nvmlDeviceGetCudaComputeCapability(device)
        return mig_toggle_needs_reset(major)

    def disable_mig(self, gpu: GpuRef) -> bool:
        """Turn MIG off when no GPU instance remains and the GPU needs no reset for it."""
        _, device, uuid = self.resolve(gpu)
        nvml = self._nvml
        major, _ = nvml.nvmlDeviceGetCudaComputeCapability(device)
        if mig_toggle_needs_reset(major) or self.observe(gpu):
            return False
        try:
            status = nvml.nvmlDeviceSetMigMode(device, _DISABLE)
        except pynvml.NVMLError as exc:
            raise PartitionError.from_nvml(f"disabling MIG mode on GPU {uuid}", exc) from None
        return bool(status == pynvml.NVML_SUCCESS)
