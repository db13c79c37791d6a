"""The CDI container edits of one device share. Pure: no file access.

An MPS client needs three things: the pipe directory of its device's control daemon, where it finds
the daemon's socket (mounted read-write at the same path, so the path the daemon announced is
the path the client uses, and nothing in it can act as a device, setuid or program); the variable that
names it, `CUDA_MPS_PIPE_DIRECTORY`; and its limits, `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and
`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (`<device>=<N>M`, the device as the container numbers it: 0,
its only device). Time-slicing needs nothing beyond the device itself.

Only the documented variables are set, and nothing from a claim reaches them but numbers checked
here; the pipe directory comes from the node's MPS manager and is checked all the same.
"""

from __future__ import annotations

import re
from typing import Any

from tangram.cdi.devices import ResolvedDevice

MIB = 1024 * 1024
# Container device index of the shared device: a share is the container's only device of its kind.
CONTAINER_DEVICE_INDEX = 0
PIPE_MOUNT_OPTIONS = ("rw", "nosuid", "nodev", "noexec", "bind")
_PIPE_DIR = re.compile(r"(/[A-Za-z0-9._-]+)+")
MAX_PIPE_DIR = 4096


def _checked_pipe_dir(pipe_dir: str) -> str:
    parts = pipe_dir.split("/")[1:]
    if (
        len(pipe_dir) > MAX_PIPE_DIR
        or not _PIPE_DIR.fullmatch(pipe_dir)
        or any(part in (".", "..") for part in parts)
    ):
        raise ValueError(
            f"MPS pipe directory {pipe_dir[:100]!r} is not an absolute normalised path "
            "of letters, digits, '.', '_' and '-'"
        )
    return pipe_dir


def pinned_limit_mib(memory_bytes: int) -> int | None:
    """The client's limit in whole MiB, rounded down so that it never exceeds the share; None
    without a limit. A positive limit under 1 MiB cannot be expressed and is refused."""
    if memory_bytes == 0:
        return None
    if memory_bytes < MIB:
        raise ValueError(f"MPS memory limit of {memory_bytes} bytes is below 1 MiB")
    return memory_bytes // MIB


def share_edits(device: ResolvedDevice, pipe_dir: str) -> dict[str, Any]:
    """The containerEdits that give a container its share of `device`.

    `pipe_dir` is the device's MPS pipe directory for an MPS share, "" for a time-slicing one.
    Raises ValueError for a device without a share, or limits or a path that cannot be used.
    """
    share = device.share
    if share is None:
        raise ValueError(f"device {device.device} is not shared")
    if (
        isinstance(share.memory_bytes, bool)
        or not isinstance(share.memory_bytes, int)
        or share.memory_bytes < 0
    ):
        raise ValueError(f"share {share.id}: memory_bytes must be a non-negative integer")
    if share.strategy == "TimeSlicing":
        if pipe_dir:
            raise ValueError(f"share {share.id} is time-slicing: it has no MPS pipe directory")
        return {}
    if share.strategy != "MPS":
        raise ValueError(f"share {share.id}: unknown sharing strategy {share.strategy!r}")
    percent = share.compute_percent
    if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 100:
        raise ValueError(f"share {share.id}: compute_percent must be an integer from 1 to 100")
    directory = _checked_pipe_dir(pipe_dir)
    env = [f"CUDA_MPS_PIPE_DIRECTORY={directory}", f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percent}"]
    limit = pinned_limit_mib(share.memory_bytes)
    if limit is not None:
        env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={CONTAINER_DEVICE_INDEX}={limit}M")
    return {
        "env": env,
        "mounts": [{"hostPath": directory, "containerPath": directory, "options": list(PIPE_MOUNT_OPTIONS)}],
    }
