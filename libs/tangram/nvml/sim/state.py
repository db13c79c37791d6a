"""The simulator's mutable state and where it lives: in memory, or a JSON file shared by processes.

A state file is guarded by an exclusive flock on a sibling `.lock` file and re-read on every call,
so several processes of one simulated node see and change the same GPUs. Writes go to a temporary
file renamed over the old one, so a reader never sees half a state. A call that finds the very
bytes this process last read reuses the state decoded from them: an inventory of a 128-GPU node
makes some 30,000 calls, and decoding the file for each was most of their time.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgspec

from tangram.inputs import InputError, read_bytes

STATE_VERSION = 1


class SimComputeInstance(msgspec.Struct, kw_only=True):
    id: int
    profile_id: int
    start: int  # first compute slice inside the GPU instance
    size: int  # compute slices
    uuid: str


class SimGpuInstance(msgspec.Struct, kw_only=True):
    id: int
    profile_id: int
    start: int  # memory slices
    size: int
    compute_instances: list[SimComputeInstance] = []


class SimProcess(msgspec.Struct, kw_only=True):
    pid: int
    used_mib: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    sm_percent: int = 0  # how busy it keeps its GPU (or MIG device): what utilization reports


class SimGpu(msgspec.Struct, kw_only=True):
    mig_current: int = 0
    mig_pending: int = 0
    compute_mode: int = 0  # NVML_COMPUTEMODE_DEFAULT, what a GPU boots with on Linux
    gpu_instances: list[SimGpuInstance] = []
    processes: list[SimProcess] = []
    lost: bool = False
    xid_events: list[int] = []  # not yet delivered to event sets


class SimFault(msgspec.Struct, kw_only=True):
    function: str
    error: int
    remaining: int = 1


class SimState(msgspec.Struct, kw_only=True):
    version: int = STATE_VERSION
    machine: str
    gpus: list[SimGpu]
    faults: list[SimFault] = []
    next_pid: int = 40000
    generation: int = 0  # bumps on every MIG device creation, so UUIDs are never reused

    def gpu_instance(self, gpu: int, gi_id: int) -> SimGpuInstance | None:
        return next((g for g in self.gpus[gpu].gpu_instances if g.id == gi_id), None)


class StateFileError(RuntimeError):
    pass


@dataclass(slots=True)
class Txn:
    state: SimState
    write: bool = False
    keep_on_error: bool = False


class StateStore:
    """Hands out the state for one call; with a path, under an exclusive file lock."""

    def __init__(self, initial: SimState, path: Path | None) -> None:
        self._path = path
        self._lock_path = None if path is None else path.with_name(path.name + ".lock")
        self._memory = initial
        self._decoded: tuple[bytes, SimState] | None = None  # the file's bytes and their state
        if path is not None:
            with self.transaction() as txn:
                state = txn.state
                if state.machine != initial.machine:
                    raise StateFileError(
                        f"state file {path} belongs to machine {state.machine!r}, not {initial.machine!r}"
                    )

    @contextmanager
    def transaction(self) -> Iterator[Txn]:
        """The state for one call. Changes are kept when the call returns normally with
        `txn.write` set, or when it fails with `txn.keep_on_error` set (a consumed fault)."""
        if self._path is None:
            yield Txn(self._memory)
            return
        assert self._lock_path is not None
        with open(self._lock_path, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                state = self._read()
                txn = Txn(self._memory if state is None else state, write=state is None)
                try:
                    yield txn
                except BaseException:
                    if txn.keep_on_error:
                        self._write(txn.state)
                    elif txn.write:
                        self._decoded = None  # a change that failed half-way is not kept
                    raise
                if txn.write:
                    self._write(txn.state)
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def stamp(self) -> tuple[int, int, int] | None:
        """What changes whenever the state file is replaced (every write renames a new file over
        it): a caller that polls can tell nothing changed without the lock or a read. None in
        memory or before the file exists."""
        if self._path is None:
            return None
        try:
            status = os.stat(self._path)
        except FileNotFoundError:
            return None
        return (status.st_ino, status.st_mtime_ns, status.st_size)

    def _read(self) -> SimState | None:
        assert self._path is not None
        if not self._path.exists():
            return None
        try:
            raw = read_bytes(self._path, "state file")
        except InputError as exc:
            raise StateFileError(str(exc)) from None
        if self._decoded is not None and self._decoded[0] == raw:
            return self._decoded[1]
        self._decoded = None
        try:
            state = msgspec.json.decode(raw, type=SimState)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise StateFileError(f"state file {self._path} is not a simulator state: {exc}") from None
        if state.version != STATE_VERSION:
            raise StateFileError(
                f"state file {self._path} has version {state.version}, expected {STATE_VERSION}"
            )
        self._decoded = (raw, state)
        return state

    def _write(self, state: SimState) -> None:
        assert self._path is not None
        tmp = self._path.with_name(f".{self._path.name}.{os.getpid()}.tmp")
        self._decoded = None  # decoded again on the next read, never shared with the caller's state
        tmp.write_bytes(msgspec.json.encode(state))
        os.replace(tmp, self._path)
