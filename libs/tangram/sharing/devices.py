"""Shared devices by UUID, and the directories of each device's MPS control daemon.

A device UUID becomes a directory name, so it is checked first: "GPU-" or "MIG-" followed by an
RFC 4122 UUID, which is what NVML reports for GPUs and (since R470) for MIG devices. Nothing else,
the older "MIG-GPU-<uuid>/<gi>/<ci>" form with its slashes included, ever names a directory.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

_DEVICE_UUID = re.compile(r"(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
DEVICE_UUID_LENGTH = 40
CONTROL_SOCKET = "control"  # what nvidia-cuda-mps-control makes in its pipe directory
MAX_UNIX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the terminating NUL

ROOT_MODE = 0o711  # others may pass through to a pipe directory they know, never list devices
DEVICE_MODE = 0o711
PIPE_MODE = 0o755  # mounted into client containers, as NVIDIA's MPS plugins mount it
LOG_MODE = 0o700  # the daemon's log is the node's business


class InvalidDeviceUuid(ValueError):
    """A device UUID that cannot name a shared device (and so never names a directory)."""


def validate_device_uuid(uuid: str) -> str:
    if not isinstance(uuid, str) or not _DEVICE_UUID.fullmatch(uuid):
        shown = uuid[:60] + "..." if isinstance(uuid, str) and len(uuid) > 60 else uuid
        raise InvalidDeviceUuid(
            f"device UUID {shown!r} is not 'GPU-' or 'MIG-' followed by a lower-case RFC 4122 UUID"
        )
    return uuid


def is_whole_gpu(uuid: str) -> bool:
    return validate_device_uuid(uuid).startswith("GPU-")


def check_root(root: Path) -> Path:
    """`root` if every device's control socket under it fits in a unix socket address."""
    if not root.is_absolute():
        raise ValueError(f"MPS root {root} is not an absolute path")
    longest = len(os.fsencode(root / ("X" * DEVICE_UUID_LENGTH) / "pipe" / CONTROL_SOCKET))
    if longest > MAX_UNIX_SOCKET_PATH:
        raise ValueError(
            f"MPS root {root} is too long: a control socket under it would take {longest} bytes, "
            f"more than the {MAX_UNIX_SOCKET_PATH} a unix socket address holds"
        )
    return root


@dataclass(frozen=True, slots=True)
class DeviceDirs:
    """`<root>/<uuid>/pipe` and `<root>/<uuid>/log` of one shared device."""

    root: Path
    uuid: str

    def __post_init__(self) -> None:
        validate_device_uuid(self.uuid)

    @property
    def device(self) -> Path:
        return self.root / self.uuid

    @property
    def pipe(self) -> Path:
        return self.device / "pipe"

    @property
    def log(self) -> Path:
        return self.device / "log"

    def create(self) -> None:
        """Make the directories with their modes, whatever the umask. The root keeps the mode it
        has when it exists already: it is the node's, only the device directories are Tangram's."""
        if not self.root.exists():
            self.root.mkdir(mode=ROOT_MODE, parents=True, exist_ok=True)
            os.chmod(self.root, ROOT_MODE)
        for path, mode in ((self.device, DEVICE_MODE), (self.pipe, PIPE_MODE), (self.log, LOG_MODE)):
            path.mkdir(mode=mode, exist_ok=True)
            if path.is_symlink() or not path.is_dir():
                raise ValueError(f"{path} is not a directory")
            os.chmod(path, mode)

    def remove(self) -> None:
        """Remove the device's directories, if any."""
        if self.device.is_symlink():
            self.device.unlink()
            return
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.device)


def found_devices(root: Path) -> list[str]:
    """UUIDs of the device directories under `root`; anything else there is not Tangram's."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(name for name in names if _DEVICE_UUID.fullmatch(name) and (root / name).is_dir())
