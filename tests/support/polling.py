"""Waiting on a condition: the one poll-until of the tests."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
from collections.abc import Callable
from typing import Any

WAIT_S = 120.0


async def until(
    what: str,
    check: Callable[[], Any],
    timeout: float = WAIT_S,
    every: float = 0.1,
    *,
    process: subprocess.Popen[Any] | None = None,
) -> Any:
    """Poll `check` (plain, or returning an awaitable) until it gives something truthy, and return
    that. The deadline bounds a wait on a loaded machine; it never asserts how long anything took.
    With `process`, fail as soon as that process exits first: what it was to do will not come."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{what}: the process exited ({process.returncode}) first")
        found = check()
        if inspect.isawaitable(found):
            found = await found
        if found:
            return found
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(every)
