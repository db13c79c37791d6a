"""One MPS control daemon per shared device: brought up (or adopted), and taken down."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tangram.sharing.control import MpsControl, MpsControlError
from tangram.sharing.devices import CONTROL_SOCKET, DeviceDirs

PID_FILE = "nvidia-cuda-mps-control.pid"  # the control daemon's pid, in its pipe directory
FULL_DEVICE_PERCENTAGE = 100


@dataclass(frozen=True, slots=True)
class MpsDefaults:
    """What each device's daemon gives clients that ask for nothing themselves: the whole device.

    A pinned memory limit of None leaves the daemon's memory limiting off, its own default."""

    active_thread_percentage: int = FULL_DEVICE_PERCENTAGE
    pinned_mem_limit_mib: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.active_thread_percentage <= 100:
            raise ValueError("default active thread percentage must be from 1 to 100")
        if self.pinned_mem_limit_mib is not None and self.pinned_mem_limit_mib < 1:
            raise ValueError("default pinned memory limit must be at least 1 MiB")

    def commands(self) -> list[str]:
        # Device 0: the daemon sees its own device only (CUDA_VISIBLE_DEVICES is that device).
        commands = [f"set_default_active_thread_percentage {self.active_thread_percentage}"]
        if self.pinned_mem_limit_mib is not None:
            commands.append(f"set_default_device_pinned_mem_limit 0 {self.pinned_mem_limit_mib}M")
        return commands


def process_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _daemon_pid(dirs: DeviceDirs) -> int | None:
    try:
        text = (dirs.pipe / PID_FILE).read_text(encoding="ascii", errors="replace").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return int(text) if text.isdigit() and 0 < int(text) < 2**22 else None


@dataclass(frozen=True, slots=True)
class Daemons:
    control: MpsControl
    defaults: MpsDefaults = MpsDefaults()
    ready_timeout_s: float = 30.0
    stop_timeout_s: float = 30.0

    async def ensure(self, dirs: DeviceDirs) -> Literal["adopted", "started"]:
        """A daemon answering on the device's pipe directory: the one there, or a new one."""
        if (dirs.pipe / CONTROL_SOCKET).exists() and await self.control.running(dirs):
            return "adopted"
        await asyncio.to_thread(dirs.create)
        await self.control.start(dirs)
        await self._until_ready(dirs)
        await self.control.command(dirs, *self.defaults.commands())
        return "started"

    async def _until_ready(self, dirs: DeviceDirs) -> None:
        """A daemon may return from `-d` before it listens: ask until it answers, bounded."""
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + self.ready_timeout_s, 0.02
        while not await self.control.running(dirs):
            if loop.time() > deadline:
                raise MpsControlError(
                    f"the MPS control daemon of {dirs.uuid} did not answer within {self.ready_timeout_s:g} s"
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)

    async def stop(self, dirs: DeviceDirs) -> bool:
        """Quit the device's daemon if one runs, wait for it to be gone, and remove its
        directories. True when a daemon was running."""
        # No socket, no daemon: nothing to ask (and no control program needed to know it).
        was_running = (dirs.pipe / CONTROL_SOCKET).exists() and await self.control.running(dirs)
        if was_running:
            pid = _daemon_pid(dirs)
            await self.control.command(dirs, "quit")
            if pid is not None:
                await self._until_gone(dirs, pid)
        await asyncio.to_thread(dirs.remove)
        return was_running

    async def _until_gone(self, dirs: DeviceDirs, pid: int) -> None:
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + self.stop_timeout_s, 0.02
        while process_alive(pid):
            if loop.time() > deadline:
                raise MpsControlError(
                    f"the MPS control daemon of {dirs.uuid} (pid {pid}) still runs "
                    f"{self.stop_timeout_s:g} s after quit"
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)
