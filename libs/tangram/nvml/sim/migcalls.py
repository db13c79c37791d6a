"""NVML's MIG calls on the simulated node: MIG mode, GPU and compute instances, MIG device handles."""

from __future__ import annotations

from typing import Any

import pynvml

from tangram.nvml.sim import handles, mig, wiring
from tangram.nvml.sim.core import SimCore, fail, fill_out_array
from tangram.nvml.sim.state import SimComputeInstance, SimGpuInstance, SimState


class SimMigCalls(SimCore):
    # ---- MIG ----------------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        d = self._gpu_index(device)
        with self._op("nvmlDeviceGetMigMode") as state:
            if not self._products[d.gpu].mig_capable:
                raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            gpu = self._alive(state, d.gpu)
            return [gpu.mig_current, gpu.mig_pending]

    def nvmlDeviceSetMigMode(self, device: Any, mode: int) -> int:
        d = self._gpu_index(device)
        with self._op("nvmlDeviceSetMigMode", write=True) as state:
            return mig.set_mig_mode(self._alive(state, d.gpu), self._products[d.gpu], mode)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int, version: int = 2) -> Any:
        d = self._gpu_index(device)
        with self._op("nvmlDeviceGetGpuInstanceProfileInfo"):
            spec = self._products[d.gpu].profile_by_index(profile)
            if spec is None:
                raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if version == 2:
                info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
                info.name = f"MIG {spec.name}".encode()
            elif version == 1:
                info = pynvml.c_nvmlGpuInstanceProfileInfo_t()
            else:
                raise fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            info.id, info.isP2pSupported, info.sliceCount = spec.profile_id, 0, spec.compute_slices
            info.instanceCount, info.multiprocessorCount = spec.instance_count, spec.multiprocessors
            info.copyEngineCount, info.decoderCount, info.encoderCount = spec.copy_engines, spec.decoders, 0
            info.jpegCount, info.ofaCount, info.memorySizeMB = spec.jpeg, spec.ofa, spec.memory_mib
            return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        d = self._gpu_index(device)
        with self._op("nvmlDeviceGetGpuInstancePossiblePlacements"):
            spec = self._products[d.gpu].profile_by_id(profileId)
            if spec is None:
                raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            count = handles.out_value(countRef)
            if placementsRef is not None:
                if len(placementsRef) < len(spec.starts):
                    count.value = len(spec.starts)
                    raise fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
                for i, start in enumerate(spec.starts):
                    placementsRef[i].start, placementsRef[i].size = start, spec.memory_slices
            count.value = len(spec.starts)
            return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device: Any, profileId: int, placement: Any) -> Any:
        d = self._gpu_index(device)
        where = handles.out_value(placement)
        with self._op("nvmlDeviceCreateGpuInstanceWithPlacement", write=True) as state:
            gpu = self._alive(state, d.gpu)
            gi = mig.create_gpu_instance(gpu, self._products[d.gpu], profileId, where.start, where.size)
            return handles.make(handles.GPU_INSTANCE, d.gpu, gi.id)

    def nvmlDeviceGetGpuInstances(
        self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        d = self._gpu_index(device)
        with self._op("nvmlDeviceGetGpuInstances") as state:
            gpu = self._alive(state, d.gpu)
            if gpu.mig_current != pynvml.NVML_DEVICE_MIG_ENABLE:
                raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if self._products[d.gpu].profile_by_id(profileId) is None:
                raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            found = [
                handles.make(handles.GPU_INSTANCE, d.gpu, gi.id)
                for gi in gpu.gpu_instances
                if gi.profile_id == profileId
            ]
            return fill_out_array(gpuInstancesRef, countRef, found)

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        d = self._gpu_index(device)
        with self._op("nvmlDeviceGetGpuInstanceById") as state:
            gpu = self._alive(state, d.gpu)
            if gpu.mig_current != pynvml.NVML_DEVICE_MIG_ENABLE:
                raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if state.gpu_instance(d.gpu, gpuInstanceId) is None:
                raise fail(pynvml.NVML_ERROR_NOT_FOUND)
            return handles.make(handles.GPU_INSTANCE, d.gpu, gpuInstanceId)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        with self._op("nvmlGpuInstanceGetInfo") as state:
            d, gi = self._gi(state, gpuInstance)
            info = pynvml.c_nvmlGpuInstanceInfo_t()
            info.device = handles.make(handles.DEVICE, d.gpu)
            info.id, info.profileId = gi.id, gi.profile_id
            info.placement.start, info.placement.size = gi.start, gi.size
            return info

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        with self._op("nvmlGpuInstanceDestroy", write=True) as state:
            d, gi = self._gi(state, gpuInstance)
            mig.destroy_gpu_instance(state.gpus[d.gpu], gi)
            return int(pynvml.NVML_SUCCESS)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        with self._op("nvmlGpuInstanceGetComputeInstanceProfileInfo") as state:
            d, gi = self._gi(state, device)
            gi_profile = self._gi_profile(d.gpu, gi)
            size = mig.CI_SLICES_BY_PROFILE_ID.get(profile)
            if engProfile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED or size is None:
                raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if size not in mig.ci_sizes(gi_profile):
                raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if version == 2:
                info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
                full = size == gi_profile.compute_slices
                info.name = (f"MIG {gi_profile.name}" if full else f"MIG {size}c.{gi_profile.name}").encode()
            else:
                info = pynvml.c_nvmlComputeInstanceProfileInfo_t()
            info.id, info.sliceCount = profile, size
            info.instanceCount = gi_profile.compute_slices // size
            info.multiprocessorCount = gi_profile.multiprocessors * size // gi_profile.compute_slices
            info.sharedCopyEngineCount, info.sharedDecoderCount = gi_profile.copy_engines, gi_profile.decoders
            info.sharedJpegCount, info.sharedOfaCount = gi_profile.jpeg, gi_profile.ofa
            return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        with self._op("nvmlGpuInstanceCreateComputeInstance", write=True) as state:
            d, gi = self._gi(state, gpuInstance)
            state.generation += 1
            uuid = wiring.mig_uuid(self._uuids[d.gpu], gi.id, len(gi.compute_instances), state.generation)
            ci = mig.create_compute_instance(
                state.gpus[d.gpu], gi, self._gi_profile(d.gpu, gi), profileId, uuid
            )
            return handles.make(handles.COMPUTE_INSTANCE, d.gpu, gi.id, ci.id)

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        with self._op("nvmlGpuInstanceGetComputeInstances") as state:
            d, gi = self._gi(state, gpuInstance)
            size = mig.CI_SLICES_BY_PROFILE_ID.get(profileId)
            if size is None or size not in mig.ci_sizes(self._gi_profile(d.gpu, gi)):
                raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            found = [
                handles.make(handles.COMPUTE_INSTANCE, d.gpu, gi.id, ci.id)
                for ci in gi.compute_instances
                if ci.profile_id == profileId
            ]
            return fill_out_array(computeInstancesRef, countRef, found)

    def _ci(self, state: SimState, handle: Any) -> tuple[handles.Decoded, SimGpuInstance, SimComputeInstance]:
        d = handles.decode(handle)
        if d.kind != handles.COMPUTE_INSTANCE or d.gpu >= len(self._products):
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._alive(state, d.gpu)
        gi, ci = self._mig_device(state, d)
        return d, gi, ci

    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any:
        with self._op("nvmlComputeInstanceGetInfo") as state:
            d, gi, ci = self._ci(state, computeInstance)
            info = pynvml.c_nvmlComputeInstanceInfo_t()
            info.device = handles.make(handles.DEVICE, d.gpu)
            info.gpuInstance = handles.make(handles.GPU_INSTANCE, d.gpu, gi.id)
            info.id, info.profileId = ci.id, ci.profile_id
            info.placement.start, info.placement.size = ci.start, ci.size
            return info

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        with self._op("nvmlComputeInstanceDestroy", write=True) as state:
            d, gi, ci = self._ci(state, computeInstance)
            mig.destroy_compute_instance(state.gpus[d.gpu], gi, ci)
            return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        d = self._gpu_index(device)
        with self._op("nvmlDeviceGetMaxMigDeviceCount"):
            if not self._products[d.gpu].mig_capable:
                raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return self._products[d.gpu].max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        d = self._gpu_index(device)
        with self._op("nvmlDeviceGetMigDeviceHandleByIndex") as state:
            gpu = self._alive(state, d.gpu)
            product = self._products[d.gpu]
            if not product.mig_capable or not 0 <= index < product.max_mig_devices:
                raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            devices = [(gi.id, ci.id) for gi in gpu.gpu_instances for ci in gi.compute_instances]
            if gpu.mig_current != pynvml.NVML_DEVICE_MIG_ENABLE or index >= len(devices):
                raise fail(pynvml.NVML_ERROR_NOT_FOUND)
            gi_id, ci_id = devices[index]
            return handles.make(handles.MIG_DEVICE, d.gpu, gi_id, ci_id)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        d = self._gpu_index(migDevice, mig_ok=True)
        if d.kind != handles.MIG_DEVICE:
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._op("nvmlDeviceGetDeviceHandleFromMigDeviceHandle"):
            return handles.make(handles.DEVICE, d.gpu)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceGetGpuInstanceId") as state:
            if d.kind != handles.MIG_DEVICE:
                raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return self._mig_device(state, d)[0].id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceGetComputeInstanceId") as state:
            if d.kind != handles.MIG_DEVICE:
                raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return self._mig_device(state, d)[1].id
