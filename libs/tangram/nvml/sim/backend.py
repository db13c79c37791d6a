"""SimNvml: NVML answered from a machine description, with NVML's values, structs and error codes."""

from __future__ import annotations

import ctypes
import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pynvml

from tangram.hardware.catalogue import CI_INDEX_BY_SLICES, GpuProduct
from tangram.hardware.machines import MachineSpec, load_machine
from tangram.nvml.sim import computemode, handles, mig, wiring
from tangram.nvml.sim.activity import busy_percent, power_mw
from tangram.nvml.sim.hooks import SimHooks
from tangram.nvml.sim.state import (
    SimComputeInstance,
    SimGpu,
    SimGpuInstance,
    SimState,
    StateStore,
    Txn,
)

MIB = 1024 * 1024
_NO_ID = 0xFFFFFFFF
_FABRIC_STATES = {
    "not-started": pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED,
    "in-progress": pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
}
_EVENT_SET_IDS = itertools.count(1)


def initial_state(machine: MachineSpec) -> SimState:
    gpus = []
    for gpu_spec in machine.gpus:
        gpu = SimGpu()
        if gpu_spec.mig_enabled:
            gpu.mig_current = gpu.mig_pending = pynvml.NVML_DEVICE_MIG_ENABLE
        gpus.append(gpu)
    state = SimState(machine=machine.name, gpus=gpus)
    for index, gpu_spec in enumerate(machine.gpus):
        product = gpu_spec.spec
        for inst in gpu_spec.mig_instances:
            profile = product.profile_by_name(inst.profile)
            assert profile is not None  # validated with the machine
            gi = mig.create_gpu_instance(
                gpus[index], product, profile.profile_id, inst.start, profile.memory_slices
            )
            state.generation += 1
            uuid = wiring.mig_uuid(wiring.gpu_uuid(machine, index), gi.id, 0, state.generation)
            mig.create_compute_instance(
                gpus[index], gi, profile, CI_INDEX_BY_SLICES[profile.compute_slices], uuid
            )
    return state


def _fail(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class SimNvml(SimHooks):
    """A simulated node. State is per instance, or shared through `state_file` between processes."""

    def __init__(self, machine: MachineSpec, *, state_file: Path | None = None) -> None:
        self.machine = machine
        self._products: list[GpuProduct] = [g.spec for g in machine.gpus]
        self._uuids = [wiring.gpu_uuid(machine, i) for i in range(len(machine.gpus))]
        self._pcie_roots: dict[str, str] = {}
        for g in machine.gpus:
            self._pcie_roots.setdefault(g.pci_bus_id.lower(), g.pcie_root)
        self._store = StateStore(initial_state(machine), state_file)
        self._init_count = 0
        self._event_sets: dict[int, dict[int, int]] = {}  # set id -> GPU index -> events seen

    @classmethod
    def from_machine(cls, name_or_path: str | Path, *, state_file: Path | None = None) -> SimNvml:
        return cls(load_machine(name_or_path), state_file=state_file)

    # ---- plumbing -------------------------------------------------------------------------------

    @contextmanager
    def _op(self, function: str, *, write: bool = False) -> Iterator[SimState]:
        if self._init_count <= 0:
            raise _fail(pynvml.NVML_ERROR_UNINITIALIZED)
        with self._store.transaction() as txn:
            self._consume_fault(txn, function)
            txn.write = write
            yield txn.state

    @staticmethod
    def _consume_fault(txn: Txn, function: str) -> None:
        for fault in txn.state.faults:
            if fault.function == function and fault.remaining > 0:
                fault.remaining -= 1
                txn.state.faults = [f for f in txn.state.faults if f.remaining > 0]
                txn.keep_on_error = True
                raise _fail(fault.error)

    def _gpu_index(self, handle: Any, *, mig_ok: bool = False) -> handles.Decoded:
        decoded = handles.decode(handle)
        allowed = (handles.DEVICE, handles.MIG_DEVICE) if mig_ok else (handles.DEVICE,)
        if decoded.kind not in allowed or decoded.gpu >= len(self._products):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return decoded

    def _alive(self, state: SimState, gpu: int) -> SimGpu:
        sim_gpu = state.gpus[gpu]
        if sim_gpu.lost:
            raise _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return sim_gpu

    def _mig_device(self, state: SimState, d: handles.Decoded) -> tuple[SimGpuInstance, SimComputeInstance]:
        gi = state.gpu_instance(d.gpu, d.gi)
        ci = next((c for c in gi.compute_instances if c.id == d.ci), None) if gi else None
        if gi is None or ci is None:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gi, ci

    def _gi(self, state: SimState, handle: Any) -> tuple[handles.Decoded, SimGpuInstance]:
        d = handles.decode(handle)
        if d.kind != handles.GPU_INSTANCE or d.gpu >= len(self._products):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._alive(state, d.gpu)
        gi = state.gpu_instance(d.gpu, d.gi)
        if gi is None:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return d, gi

    def _gi_profile(self, gpu: int, gi: SimGpuInstance) -> Any:
        profile = self._products[gpu].profile_by_id(gi.profile_id)
        assert profile is not None
        return profile

    # ---- init and system --------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._init_count += 1

    def nvmlShutdown(self) -> None:
        if self._init_count <= 0:
            raise _fail(pynvml.NVML_ERROR_UNINITIALIZED)
        self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        with self._op("nvmlSystemGetDriverVersion"):
            return self.machine.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        with self._op("nvmlSystemGetCudaDriverVersion"):
            return self.machine.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        with self._op("nvmlDeviceGetCount"):
            return len(self._products)

    # ---- identity ---------------------------------------------------------------------------------

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        with self._op("nvmlDeviceGetHandleByIndex"):
            if not 0 <= index < len(self._products):
                raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return handles.make(handles.DEVICE, index)

    def nvmlDeviceGetUUID(self, device: Any) -> str:
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceGetUUID") as state:
            if d.kind == handles.MIG_DEVICE:
                return self._mig_device(state, d)[1].uuid
            return self._uuids[d.gpu]

    def nvmlDeviceGetName(self, device: Any) -> str:
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceGetName") as state:
            name = self._products[d.gpu].nvml_name
            if d.kind == handles.MIG_DEVICE:
                gi, _ = self._mig_device(state, d)
                return f"{name} MIG {self._gi_profile(d.gpu, gi).name}"
            return name

    def nvmlDeviceGetPciInfo(self, device: Any) -> Any:
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceGetPciInfo"):
            return _pci_info(self.machine.gpus[d.gpu].pci_bus_id, self._products[d.gpu].pci_device_id)

    def nvmlDeviceGetMinorNumber(self, device: Any) -> int:
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceGetMinorNumber"):
            if d.kind == handles.MIG_DEVICE:
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            minor = self.machine.gpus[d.gpu].minor
            return d.gpu if minor is None else minor

    def nvmlDeviceGetMemoryInfo(self, device: Any) -> Any:
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceGetMemoryInfo") as state:
            gpu = self._alive(state, d.gpu)
            if d.kind == handles.MIG_DEVICE:
                gi, ci = self._mig_device(state, d)
                total = self._gi_profile(d.gpu, gi).memory_mib
                procs = [
                    p for p in gpu.processes if (p.gpu_instance_id, p.compute_instance_id) == (gi.id, ci.id)
                ]
            else:
                total = self._products[d.gpu].memory_mib
                procs = gpu.processes
            used = sum(p.used_mib for p in procs)
            memory = pynvml.c_nvmlMemory_t()
            memory.total, memory.used, memory.free = total * MIB, used * MIB, max(total - used, 0) * MIB
            return memory

    def nvmlDeviceGetUtilizationRates(self, device: Any) -> Any:
        """Not supported on a MIG device nor on a GPU in MIG mode, as on real GPUs."""
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceGetUtilizationRates") as state:
            gpu = self._alive(state, d.gpu)
            if d.kind == handles.MIG_DEVICE or gpu.mig_current == pynvml.NVML_DEVICE_MIG_ENABLE:
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            busy = busy_percent(gpu.processes)
            rates = pynvml.c_nvmlUtilization_t()
            rates.gpu, rates.memory = busy, busy // 2
            return rates

    def nvmlDeviceGetPowerUsage(self, device: Any) -> int:
        """Milliwatts: an idle floor plus the share of the power limit its processes keep busy."""
        d = self._gpu_index(device)
        with self._op("nvmlDeviceGetPowerUsage") as state:
            return power_mw(self._alive(state, d.gpu).processes)

    def nvmlDeviceGetCudaComputeCapability(self, device: Any) -> tuple[int, int]:
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceGetCudaComputeCapability"):
            return self._products[d.gpu].cuda_compute_capability

    def nvmlDeviceGetNumGpuCores(self, device: Any) -> int:
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceGetNumGpuCores") as state:
            product = self._products[d.gpu]
            sms = product.multiprocessors
            if d.kind == handles.MIG_DEVICE:
                sms = self._mig_multiprocessors(d.gpu, *self._mig_device(state, d))
            return sms * (64 if product.architecture == "ampere" else 128)

    def _mig_multiprocessors(self, gpu: int, gi: SimGpuInstance, ci: SimComputeInstance) -> int:
        profile = self._gi_profile(gpu, gi)
        return int(profile.multiprocessors * ci.size // profile.compute_slices)

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceGetAttributes") as state:
            if d.kind != handles.MIG_DEVICE:
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            gi, ci = self._mig_device(state, d)
            profile = self._gi_profile(d.gpu, gi)
            attrs = pynvml.c_nvmlDeviceAttributes()
            attrs.multiprocessorCount = self._mig_multiprocessors(d.gpu, gi, ci)
            attrs.sharedCopyEngineCount = profile.copy_engines
            attrs.sharedDecoderCount = profile.decoders
            attrs.sharedJpegCount = profile.jpeg
            attrs.sharedOfaCount = profile.ofa
            attrs.gpuInstanceSliceCount = profile.compute_slices
            attrs.computeInstanceSliceCount = ci.size
            attrs.memorySizeMB = profile.memory_mib
            return attrs

    def nvmlDeviceGetNumaNodeId(self, device: Any) -> int:
        d = self._gpu_index(device)
        with self._op("nvmlDeviceGetNumaNodeId"):
            numa = self.machine.gpus[d.gpu].numa_node
            if numa is None:
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return numa

    def nvmlDeviceGetComputeRunningProcesses(self, device: Any) -> list[Any]:
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceGetComputeRunningProcesses") as state:
            gpu = self._alive(state, d.gpu)
            procs = gpu.processes
            if d.kind == handles.MIG_DEVICE:
                gi, ci = self._mig_device(state, d)
                procs = [p for p in procs if (p.gpu_instance_id, p.compute_instance_id) == (gi.id, ci.id)]
            result = []
            for p in procs:
                info = pynvml.c_nvmlProcessInfo_t()
                info.pid, info.usedGpuMemory = p.pid, p.used_mib * MIB
                info.gpuInstanceId = _NO_ID if p.gpu_instance_id is None else p.gpu_instance_id
                info.computeInstanceId = _NO_ID if p.compute_instance_id is None else p.compute_instance_id
                result.append(pynvml.nvmlStructToFriendlyObject(info))
            return result

    # ---- compute mode -------------------------------------------------------------------------------

    def nvmlDeviceGetComputeMode(self, device: Any) -> int:
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceGetComputeMode") as state:
            gpu = self._alive(state, d.gpu)
            if d.kind == handles.MIG_DEVICE:
                self._mig_device(state, d)
            return gpu.compute_mode

    def nvmlDeviceSetComputeMode(self, device: Any, mode: int) -> None:
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceSetComputeMode", write=True) as state:
            gpu = self._alive(state, d.gpu)
            if d.kind == handles.MIG_DEVICE:
                self._mig_device(state, d)
            computemode.set_compute_mode(gpu, mode, mig_device=d.kind == handles.MIG_DEVICE)

    # ---- MIG ----------------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        d = self._gpu_index(device)
        with self._op("nvmlDeviceGetMigMode") as state:
            if not self._products[d.gpu].mig_capable:
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
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
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if version == 2:
                info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
                info.name = f"MIG {spec.name}".encode()
            elif version == 1:
                info = pynvml.c_nvmlGpuInstanceProfileInfo_t()
            else:
                raise _fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
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
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            count = handles.out_value(countRef)
            if placementsRef is not None:
                if len(placementsRef) < len(spec.starts):
                    count.value = len(spec.starts)
                    raise _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
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
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if self._products[d.gpu].profile_by_id(profileId) is None:
                raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            found = [gi for gi in gpu.gpu_instances if gi.profile_id == profileId]
            count = handles.out_value(countRef)
            if gpuInstancesRef is not None and len(gpuInstancesRef) < len(found):
                count.value = len(found)
                raise _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for i, gi in enumerate(found):
                gpuInstancesRef[i] = handles.make(handles.GPU_INSTANCE, d.gpu, gi.id)
            count.value = len(found)
            return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        d = self._gpu_index(device)
        with self._op("nvmlDeviceGetGpuInstanceById") as state:
            gpu = self._alive(state, d.gpu)
            if gpu.mig_current != pynvml.NVML_DEVICE_MIG_ENABLE:
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if state.gpu_instance(d.gpu, gpuInstanceId) is None:
                raise _fail(pynvml.NVML_ERROR_NOT_FOUND)
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
                raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if size not in mig.ci_sizes(gi_profile):
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
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
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            found = [ci for ci in gi.compute_instances if ci.profile_id == profileId]
            count = handles.out_value(countRef)
            if computeInstancesRef is not None and len(computeInstancesRef) < len(found):
                count.value = len(found)
                raise _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for i, ci in enumerate(found):
                computeInstancesRef[i] = handles.make(handles.COMPUTE_INSTANCE, d.gpu, gi.id, ci.id)
            count.value = len(found)
            return int(pynvml.NVML_SUCCESS)

    def _ci(self, state: SimState, handle: Any) -> tuple[handles.Decoded, SimGpuInstance, SimComputeInstance]:
        d = handles.decode(handle)
        if d.kind != handles.COMPUTE_INSTANCE or d.gpu >= len(self._products):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
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
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return self._products[d.gpu].max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        d = self._gpu_index(device)
        with self._op("nvmlDeviceGetMigDeviceHandleByIndex") as state:
            gpu = self._alive(state, d.gpu)
            product = self._products[d.gpu]
            if not product.mig_capable or not 0 <= index < product.max_mig_devices:
                raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            devices = [(gi.id, ci.id) for gi in gpu.gpu_instances for ci in gi.compute_instances]
            if gpu.mig_current != pynvml.NVML_DEVICE_MIG_ENABLE or index >= len(devices):
                raise _fail(pynvml.NVML_ERROR_NOT_FOUND)
            gi_id, ci_id = devices[index]
            return handles.make(handles.MIG_DEVICE, d.gpu, gi_id, ci_id)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        d = self._gpu_index(migDevice, mig_ok=True)
        if d.kind != handles.MIG_DEVICE:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._op("nvmlDeviceGetDeviceHandleFromMigDeviceHandle"):
            return handles.make(handles.DEVICE, d.gpu)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceGetGpuInstanceId") as state:
            if d.kind != handles.MIG_DEVICE:
                raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return self._mig_device(state, d)[0].id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceGetComputeInstanceId") as state:
            if d.kind != handles.MIG_DEVICE:
                raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return self._mig_device(state, d)[1].id

    # ---- topology ---------------------------------------------------------------------------------

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        a, b = self._gpu_index(device1), self._gpu_index(device2)
        with self._op("nvmlDeviceGetTopologyCommonAncestor"):
            return wiring.pcie_level(self.machine.gpus[a.gpu], self.machine.gpus[b.gpu])

    def _link(self, device: Any, link: int, function: str) -> wiring.LinkEnd:
        d = self._gpu_index(device)
        with self._op(function) as state:
            self._alive(state, d.gpu)
            spec = self._products[d.gpu].nvlink
            if spec is None or not 0 <= link < spec.links:
                raise _fail(
                    pynvml.NVML_ERROR_NOT_SUPPORTED if spec is None else pynvml.NVML_ERROR_INVALID_ARGUMENT
                )
            end = wiring.link_end(self.machine, d.gpu, link)
            if end is None:
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return end

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        try:
            self._link(device, link, "nvmlDeviceGetNvLinkState")
        except pynvml.NVMLError as exc:
            if (
                exc.value != pynvml.NVML_ERROR_NOT_SUPPORTED
                or self._products[handles.decode(device).gpu].nvlink is None
            ):
                raise
            return int(pynvml.NVML_FEATURE_DISABLED)
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        end = self._link(device, link, "nvmlDeviceGetNvLinkRemotePciInfo")
        return _pci_info(end.remote_pci_bus_id, 0 if end.remote_is_switch else None)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        end = self._link(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType")
        kind = (
            pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
            if end.remote_is_switch
            else pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
        )
        return int(kind)

    def nvmlDeviceGetP2PStatus(self, device1: Any, device2: Any, p2pIndex: int) -> int:
        a, b = self._gpu_index(device1), self._gpu_index(device2)
        with self._op("nvmlDeviceGetP2PStatus"):
            nvlinked = wiring.nvlink_connected(self.machine, a.gpu, b.gpu)
            if p2pIndex == pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
                return int(pynvml.NVML_P2P_STATUS_OK if nvlinked else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED)
            level = wiring.pcie_level(self.machine.gpus[a.gpu], self.machine.gpus[b.gpu])
            if nvlinked or level < 50:
                return int(pynvml.NVML_P2P_STATUS_OK)
            return int(pynvml.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED)

    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int:
        d = self._gpu_index(device)
        info = handles.out_value(gpuFabricInfo)
        with self._op("nvmlDeviceGetGpuFabricInfoV"):
            product = self._products[d.gpu]
            if product.architecture not in ("hopper", "blackwell"):
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            fabric = self.machine.fabric
            if fabric is None or not self.machine.switch_attached(d.gpu):
                info.state, info.status = (
                    pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
                    pynvml.NVML_ERROR_NOT_SUPPORTED,
                )
                return int(pynvml.NVML_SUCCESS)
            if fabric.state != "completed":
                # registration with the fabric manager not done: no cluster, no clique yet
                info.state = _FABRIC_STATES[fabric.state]
                info.status = pynvml.NVML_ERROR_NOT_READY
                return int(pynvml.NVML_SUCCESS)
            raw = bytes.fromhex(fabric.cluster_uuid.replace("-", ""))
            ctypes.memmove(info.clusterUuid, raw, len(raw))
            info.state, info.status = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS
            info.cliqueId = fabric.clique_id
            degraded = (
                pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE
                if fabric.degraded_bandwidth
                else pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
            )
            if hasattr(info, "healthMask"):  # v2 and later of the struct
                info.healthMask = degraded << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
            return int(pynvml.NVML_SUCCESS)

    def pcie_root_of(self, pci_bus_id: str) -> str | None:
        return self._pcie_roots.get(pci_bus_id.lower())

    # ---- health events ----------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        with self._op("nvmlEventSetCreate"):
            set_id = next(_EVENT_SET_IDS)
            self._event_sets[set_id] = {}
            return handles.make(handles.EVENT_SET, 0, set_id >> 12, set_id & 0xFFF)

    def _event_set(self, event_set: Any) -> dict[int, int]:
        d = handles.decode(event_set)
        registered = self._event_sets.get((d.gi << 12) | d.ci) if d.kind == handles.EVENT_SET else None
        if registered is None:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return registered

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        d = self._gpu_index(handle)
        registered = self._event_set(eventSet)
        with self._op("nvmlDeviceRegisterEvents") as state:
            if eventTypes & pynvml.nvmlEventTypeXidCriticalError:
                registered[d.gpu] = len(state.gpus[d.gpu].xid_events)

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        registered = self._event_set(eventSet)
        deadline = time.monotonic() + timeoutms / 1000
        looked: tuple[int, int, int] | None = None
        while True:
            # A state file unchanged since the last look has no new event: the poll stays a stat,
            # as real NVML's wait costs nothing while no event comes.
            stamp = self._store.stamp()
            if stamp is None or stamp != looked:
                looked = stamp
                with self._op("nvmlEventSetWait") as state:
                    for gpu, seen in sorted(registered.items()):
                        events = state.gpus[gpu].xid_events
                        if len(events) > seen:
                            registered[gpu] = seen + 1
                            data = pynvml.c_nvmlEventData_t()
                            data.device = handles.make(handles.DEVICE, gpu)
                            data.eventType = pynvml.nvmlEventTypeXidCriticalError
                            data.eventData = events[seen]
                            data.gpuInstanceId = data.computeInstanceId = _NO_ID
                            return data
            if time.monotonic() >= deadline:
                raise _fail(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(min(0.01, max(deadline - time.monotonic(), 0)))

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._event_set(eventSet)
        d = handles.decode(eventSet)
        del self._event_sets[(d.gi << 12) | d.ci]


def _pci_info(bus_id: str, device_id: int | None) -> Any:
    domain, bus, rest = bus_id.upper().split(":")
    device = rest.split(".")[0]
    info = pynvml.nvmlPciInfo_t()
    info.busId = bus_id.upper().encode()
    info.busIdLegacy = f"{domain[-4:]}:{bus}:{rest}".encode()
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(device, 16)
    info.pciDeviceId = device_id or 0
    info.pciSubSystemId = 0
    return info
