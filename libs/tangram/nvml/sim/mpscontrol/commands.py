"""The control daemon's commands: parsed, checked and answered. Pure: no sockets, no files.

What the real daemon documents: the default active thread percentage is 100 and is shown with one
decimal ("100.0"); a pinned memory limit is an integer followed by "G" or "M", given per device
(an ordinal as the daemon sees it, or a device UUID), disabled by default; a limit of at least
1 GiB reads back in whole GiB ("10G"), a smaller one in MiB ("512M"). Set values last until
`quit`. Refusals name the command and what was wrong, on one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_ECHO = 64  # how much of a refused word a reply repeats
_NUMBER = re.compile(r"[0-9]{1,3}(\.[0-9]{1,6})?")
_MEMORY = re.compile(r"([0-9]{1,9})([MG])")
_DEVICE = re.compile(
    r"[0-9]{1,3}|(GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


@dataclass(slots=True)
class DaemonSettings:
    """What one control daemon holds between commands; lost when it quits."""

    active_thread_percentage: float = 100.0
    pinned_mem_limit_mib: dict[str, int] = field(default_factory=dict)  # device -> MiB


@dataclass(frozen=True, slots=True)
class Reply:
    ok: bool
    text: str = ""  # without the trailing newline
    quit: bool = False


def _shown(word: str) -> str:
    cut = word[:MAX_ECHO] + ("..." if len(word) > MAX_ECHO else "")
    return cut.encode("ascii", "backslashreplace").decode("ascii")


def _refuse(reason: str) -> Reply:
    return Reply(ok=False, text=reason)


def _arity(name: str, args: list[str], count: int) -> Reply | None:
    if len(args) == count:
        return None
    wanted = "no arguments" if count == 0 else f"{count} argument{'s' if count > 1 else ''}"
    return _refuse(f"{name}: takes {wanted}, got {len(args)}")


def _device(name: str, word: str) -> str | Reply:
    if _DEVICE.fullmatch(word):
        return word
    return _refuse(f"{name}: invalid device {_shown(word)!r} (a device ordinal or a GPU-/MIG- UUID)")


def show_memory(mib: int) -> str:
    return f"{mib // 1024}G" if mib >= 1024 else f"{mib}M"


def execute(settings: DaemonSettings, line: str) -> Reply:
    """Run one command line against `settings` (changed in place) and give its reply."""
    words = line.split()
    if not words:
        return Reply(ok=True)
    name, args = words[0], words[1:]
    if name == "get_server_list":
        return _arity(name, args, 0) or Reply(ok=True)
    if name == "quit":
        return _arity(name, args, 0) or Reply(ok=True, quit=True)
    if name == "get_default_active_thread_percentage":
        return _arity(name, args, 0) or Reply(ok=True, text=f"{settings.active_thread_percentage:.1f}")
    if name == "set_default_active_thread_percentage":
        refused = _arity(name, args, 1)
        if refused:
            return refused
        value = float(args[0]) if _NUMBER.fullmatch(args[0]) else None
        if value is None or not 1 <= value <= 100:
            return _refuse(f"{name}: invalid percentage {_shown(args[0])!r} (a number from 1 to 100)")
        settings.active_thread_percentage = value
        return Reply(ok=True)
    if name == "get_default_device_pinned_mem_limit":
        refused = _arity(name, args, 1)
        device = refused or _device(name, args[0])
        if isinstance(device, Reply):
            return device
        return Reply(ok=True, text=show_memory(settings.pinned_mem_limit_mib.get(device, 0)))
    if name == "set_default_device_pinned_mem_limit":
        refused = _arity(name, args, 2)
        device = refused or _device(name, args[0])
        if isinstance(device, Reply):
            return device
        match = _MEMORY.fullmatch(args[1])
        if match is None or int(match.group(1)) == 0:
            return _refuse(
                f"{name}: invalid limit {_shown(args[1])!r} (a positive integer followed by G or M)"
            )
        amount = int(match.group(1))
        settings.pinned_mem_limit_mib[device] = amount * 1024 if match.group(2) == "G" else amount
        return Reply(ok=True)
    return _refuse(f"Unrecognized command: {_shown(name)!r}")
