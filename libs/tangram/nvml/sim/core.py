"""The base of the simulated NVML: machine, state, fault injection and the checks every call makes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pynvml

from tangram.hardware.catalogue import CI_INDEX_BY_SLICES, GpuProduct
from tangram.hardware.machines import MachineSpec
from tangram.nvml.sim import handles, mig, wiring
from tangram.nvml.sim.state import (
    SimComputeInstance,
    SimGpu,
    SimGpuInstance,
    SimState,
    StateStore,
    Txn,
)

MIB = 1024 * 1024
NO_ID = 0xFFFFFFFF  # NVML's "no GPU/compute instance" in process and event structs


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


def fail(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def fill_out_array(refs: Any, count_ref: Any, items: list[Any]) -> int:
    """NVML's output arrays: the count is always set, and an array too short for every item
    gets none of them and NVML_ERROR_INSUFFICIENT_SIZE, so the caller can size it and ask again."""
    count = handles.out_value(count_ref)
    count.value = len(items)
    if refs is not None and len(refs) < len(items):
        raise fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    for i, item in enumerate(items):
        refs[i] = item
    return int(pynvml.NVML_SUCCESS)


def pci_info(bus_id: str, device_id: int | None) -> Any:
    domain, bus, rest = bus_id.upper().split(":")
    device = rest.split(".")[0]
    info = pynvml.nvmlPciInfo_t()
    info.busId = bus_id.upper().encode()
    info.busIdLegacy = f"{domain[-4:]}:{bus}:{rest}".encode()
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(device, 16)
    info.pciDeviceId = device_id or 0
    info.pciSubSystemId = 0
    return info


class SimCore:
    """What every group of simulated NVML calls stands on: the machine, its state, handle checks."""

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

    # ---- plumbing -------------------------------------------------------------------------------

    @contextmanager
    def _op(self, function: str, *, write: bool = False) -> Iterator[SimState]:
        if self._init_count <= 0:
            raise fail(pynvml.NVML_ERROR_UNINITIALIZED)
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
                raise fail(fault.error)

    def _gpu_index(self, handle: Any, *, mig_ok: bool = False) -> handles.Decoded:
        decoded = handles.decode(handle)
        allowed = (handles.DEVICE, handles.MIG_DEVICE) if mig_ok else (handles.DEVICE,)
        if decoded.kind not in allowed or decoded.gpu >= len(self._products):
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return decoded

    def _alive(self, state: SimState, gpu: int) -> SimGpu:
        sim_gpu = state.gpus[gpu]
        if sim_gpu.lost:
            raise fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return sim_gpu

    def _mig_device(self, state: SimState, d: handles.Decoded) -> tuple[SimGpuInstance, SimComputeInstance]:
        gi = state.gpu_instance(d.gpu, d.gi)
        ci = next((c for c in gi.compute_instances if c.id == d.ci), None) if gi else None
        if gi is None or ci is None:
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gi, ci

    def _gi(self, state: SimState, handle: Any) -> tuple[handles.Decoded, SimGpuInstance]:
        d = handles.decode(handle)
        if d.kind != handles.GPU_INSTANCE or d.gpu >= len(self._products):
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._alive(state, d.gpu)
        gi = state.gpu_instance(d.gpu, d.gi)
        if gi is None:
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return d, gi

    def _gi_profile(self, gpu: int, gi: SimGpuInstance) -> Any:
        profile = self._products[gpu].profile_by_id(gi.profile_id)
        assert profile is not None
        return profile
