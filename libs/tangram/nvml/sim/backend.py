"""SimNvml: NVML answered from a machine description, with NVML's values, structs and error codes.

The calls are grouped by what they touch: devices and the system here, MIG (`migcalls`), topology
(`topology`), event sets (`eventsets`), all on the shared base (`core`); test hooks in `hooks`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml

from tangram.hardware.machines import load_machine
from tangram.nvml.sim import computemode, handles
from tangram.nvml.sim.activity import busy_percent, power_mw
from tangram.nvml.sim.core import MIB, NO_ID, fail, initial_state, pci_info
from tangram.nvml.sim.eventsets import SimEventSets
from tangram.nvml.sim.hooks import SimHooks
from tangram.nvml.sim.migcalls import SimMigCalls
from tangram.nvml.sim.state import SimComputeInstance, SimGpuInstance
from tangram.nvml.sim.topology import SimTopologyCalls

__all__ = ["SimNvml", "initial_state"]


class SimNvml(SimMigCalls, SimTopologyCalls, SimEventSets, SimHooks):
    """A simulated node. State is per instance, or shared through `state_file` between processes."""

    @classmethod
    def from_machine(cls, name_or_path: str | Path, *, state_file: Path | None = None) -> SimNvml:
        return cls(load_machine(name_or_path), state_file=state_file)

    # ---- init and system --------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._init_count += 1

    def nvmlShutdown(self) -> None:
        if self._init_count <= 0:
            raise fail(pynvml.NVML_ERROR_UNINITIALIZED)
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
                raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
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
            return pci_info(self.machine.gpus[d.gpu].pci_bus_id, self._products[d.gpu].pci_device_id)

    def nvmlDeviceGetMinorNumber(self, device: Any) -> int:
        d = self._gpu_index(device, mig_ok=True)
        with self._op("nvmlDeviceGetMinorNumber"):
            if d.kind == handles.MIG_DEVICE:
                raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
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
                raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
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
                raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
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
                raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
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
                info.gpuInstanceId = NO_ID if p.gpu_instance_id is None else p.gpu_instance_id
                info.computeInstanceId = NO_ID if p.compute_instance_id is None else p.compute_instance_id
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
