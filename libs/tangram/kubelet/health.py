"""Device health for kubelet's DRA health service: what the node's inventory says, per device.

A device is unhealthy exactly when the ResourceSlices taint it (its GPU is lost or failing: an
XID or ECC error discovery saw), so kubelet's view in pod status and the scheduler's agree.
Devices the node no longer advertises (a MIG instance destroyed) are reported once as unknown.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from tangram import DRIVER_NAME
from tangram.dra import node_devices
from tangram.dra.names import UNHEALTHY_TAINT
from tangram.events import NodeHardware


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    pool: str
    device: str
    status: str  # "healthy" | "unhealthy" | "unknown"
    since: int  # Unix seconds when this status was first seen


def health_of(hardware: NodeHardware, *, driver: str = DRIVER_NAME) -> dict[str, str]:
    """Device name -> "healthy" or "unhealthy", for every device the node advertises."""
    advertised = node_devices(hardware, driver=driver, shared=True)
    unhealthy = f"{driver}/{UNHEALTHY_TAINT}"
    return {
        device.name: "unhealthy" if any(t.key == unhealthy for t in device.taints) else "healthy"
        for device in advertised.devices
    }


class HealthBoard:
    """The latest health of the node's devices, and a change counter watchers wait on."""

    def __init__(self, node: str, *, driver: str = DRIVER_NAME) -> None:
        self.node = node
        self.driver = driver
        self._devices: dict[str, DeviceHealth] = {}
        self._version = 0
        self._bumped = asyncio.Event()  # set (and replaced) at every change

    def snapshot(self) -> list[DeviceHealth]:
        return [self._devices[name] for name in sorted(self._devices)]

    def update(self, hardware: NodeHardware, *, now: float | None = None) -> bool:
        """Fold the node's inventory; True when any device's health changed."""
        if hardware.node != self.node:
            return False
        stamp = int(time.time() if now is None else now)
        current = health_of(hardware, driver=self.driver)
        devices: dict[str, DeviceHealth] = {}
        for name, status in current.items():
            known = self._devices.get(name)
            devices[name] = (
                known
                if known is not None and known.status == status
                else DeviceHealth(self.node, name, status, stamp)
            )
        for name, known in self._devices.items():
            if name not in current and known.status != "unknown":
                devices[name] = DeviceHealth(self.node, name, "unknown", stamp)
        if devices == self._devices:
            return False
        self._devices = devices
        self._version += 1
        self._bumped.set()
        self._bumped = asyncio.Event()
        return True

    async def watch(self) -> AsyncIterator[list[DeviceHealth]]:
        """The devices' health now, then again after every change, until cancelled."""
        seen = -1
        while True:
            bumped = self._bumped
            if self._version != seen:
                seen = self._version
                yield self.snapshot()
                continue
            await bumped.wait()
