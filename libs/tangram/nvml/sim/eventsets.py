"""NVML's event sets on the simulated node: XID critical errors, waited for as NVML waits."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pynvml

from tangram.nvml.sim import handles
from tangram.nvml.sim.core import NO_ID, SimCore, fail

_EVENT_SET_IDS = itertools.count(1)


class SimEventSets(SimCore):
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
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
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
                            data.gpuInstanceId = data.computeInstanceId = NO_ID
                            return data
            if time.monotonic() >= deadline:
                raise fail(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(min(0.01, max(deadline - time.monotonic(), 0)))

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._event_set(eventSet)
        d = handles.decode(eventSet)
        del self._event_sets[(d.gi << 12) | d.ci]
