"""Watches NVML XID events and turns the critical ones into GPU health."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pynvml

from tangram.nvml import NvmlBackend

log = logging.getLogger("tangram.discovery.health")

# XIDs caused by the application, not the GPU (as the NVIDIA device plugin treats them).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def is_critical(xid: int) -> bool:
    return xid not in APPLICATION_XIDS


class XidWatcher:
    """Blocks in nvmlEventSetWait on a thread; calls `on_xid(gpu_index, xid)` for each event."""

    def __init__(self, nvml: NvmlBackend, on_xid: Callable[[int, int], None], wait_ms: int = 500) -> None:
        self._nvml = nvml
        self._on_xid = on_xid
        self._wait_ms = wait_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        event_set = self._nvml.nvmlEventSetCreate()
        index_by_uuid: dict[str, int] = {}
        for index in range(self._nvml.nvmlDeviceGetCount()):
            device = self._nvml.nvmlDeviceGetHandleByIndex(index)
            index_by_uuid[self._nvml.nvmlDeviceGetUUID(device)] = index
            try:
                self._nvml.nvmlDeviceRegisterEvents(device, pynvml.nvmlEventTypeXidCriticalError, event_set)
            except pynvml.NVMLError as exc:
                log.warning("XID events not supported on GPU", extra={"gpu": index, "error": str(exc)})
        self._thread = threading.Thread(
            target=self._run, args=(event_set, index_by_uuid), name="xid-watcher", daemon=True
        )
        self._thread.start()

    def _run(self, event_set: object, index_by_uuid: dict[str, int]) -> None:
        try:
            while not self._stop.is_set():
                try:
                    data = self._nvml.nvmlEventSetWait(event_set, self._wait_ms)
                except pynvml.NVMLError_Timeout:
                    continue
                except pynvml.NVMLError as exc:
                    log.warning("waiting for XID events failed", extra={"error": str(exc)})
                    self._stop.wait(1.0)
                    continue
                uuid = self._nvml.nvmlDeviceGetUUID(data.device)
                index = index_by_uuid.get(uuid)
                if index is not None:
                    self._on_xid(index, int(data.eventData))
        finally:
            self._nvml.nvmlEventSetFree(event_set)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
