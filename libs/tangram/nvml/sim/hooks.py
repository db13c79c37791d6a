"""Test hooks of the simulator: things that happen to GPUs outside NVML (not NVML calls)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pynvml

from tangram.nvml.migminors import render_mig_minors
from tangram.nvml.sim.activity import busy_percent
from tangram.nvml.sim.state import SimFault, SimProcess, SimState, StateStore


class SimHooks:
    _store: StateStore

    # ---- test hooks (not NVML) --------------------------------------------------------------------

    @contextmanager
    def _sim_state(self) -> Iterator[SimState]:
        with self._store.transaction() as txn:
            txn.write = True
            yield txn.state

    def sim_attach_process(
        self,
        gpu: int,
        *,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
        used_mib: int = 1024,
        sm_percent: int = 0,
    ) -> int:
        """Start a fake compute process on a GPU (MIG off) or on a MIG device, keeping it
        `sm_percent` busy; returns its pid."""
        if not 0 <= sm_percent <= 100:
            raise ValueError(f"sm_percent {sm_percent} is not a percentage")
        with self._sim_state() as state:
            sim_gpu = state.gpus[gpu]
            if sim_gpu.mig_current == pynvml.NVML_DEVICE_MIG_ENABLE:
                gi = state.gpu_instance(gpu, gpu_instance_id if gpu_instance_id is not None else -1)
                if gi is None or not any(c.id == compute_instance_id for c in gi.compute_instances):
                    raise ValueError(f"GPU {gpu} is in MIG mode: name an existing GPU and compute instance")
            elif gpu_instance_id is not None or compute_instance_id is not None:
                raise ValueError(f"GPU {gpu} is not in MIG mode")
            pid = state.next_pid
            state.next_pid += 1
            sim_gpu.processes.append(
                SimProcess(
                    pid=pid,
                    used_mib=used_mib,
                    gpu_instance_id=gpu_instance_id,
                    compute_instance_id=compute_instance_id,
                    sm_percent=sm_percent,
                )
            )
            return pid

    def sim_engine_activity(self, gpu: int, gpu_instance_id: int | None = None) -> float:
        """The share of time the graphics engine of a GPU, or of one of its GPU instances, is busy
        (0-1): what DCGM's profiling reports (`DCGM_FI_PROF_GR_ENGINE_ACTIVE`), which NVML does
        not. A MIG device's is its processes' alone."""
        with self._store.transaction() as txn:
            processes = txn.state.gpus[gpu].processes
            if gpu_instance_id is not None:
                processes = [p for p in processes if p.gpu_instance_id == gpu_instance_id]
            return busy_percent(processes) / 100

    def sim_detach_process(self, pid: int) -> None:
        with self._sim_state() as state:
            for gpu in state.gpus:
                gpu.processes = [p for p in gpu.processes if p.pid != pid]

    def sim_inject_xid(self, gpu: int, xid: int) -> None:
        """Deliver an XID critical-error event to event sets registered on this GPU."""
        with self._sim_state() as state:
            state.gpus[gpu].xid_events.append(xid)

    def sim_set_lost(self, gpu: int, lost: bool = True) -> None:
        """A GPU that fell off the bus: its NVML calls fail with GPU_IS_LOST."""
        with self._sim_state() as state:
            state.gpus[gpu].lost = lost

    def sim_fail_next(self, function: str, error: int, *, times: int = 1) -> None:
        """Make the next `times` calls of an NVML function fail with NVML error `error`."""
        if not function.startswith("nvml") or not hasattr(self, function):
            raise ValueError(f"{function!r} is not an NVML function of this backend")
        with self._sim_state() as state:
            state.faults.append(SimFault(function=function, error=error, remaining=times))

    def sim_reset_gpu(self, gpu: int) -> None:
        """A GPU reset: a pending MIG mode becomes current."""
        with self._sim_state() as state:
            sim_gpu = state.gpus[gpu]
            if sim_gpu.processes:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)
            sim_gpu.mig_current = sim_gpu.mig_pending
            if sim_gpu.mig_current != pynvml.NVML_DEVICE_MIG_ENABLE:
                sim_gpu.gpu_instances = []

    def sim_mig_minors(self) -> str:
        """The content /proc/driver/nvidia-caps/mig-minors has on this machine."""
        return render_mig_minors()
