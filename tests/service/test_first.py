"""`first`: a background task's failure fails the wait while the service runs; when the stop and
the failure arrive together (stopping closed a client under a task still reading), the stop wins."""

from __future__ import annotations

import asyncio

import pytest

from tangram.service.tasks import first


async def broken_when(event: asyncio.Event) -> None:
    await event.wait()
    raise RuntimeError("Session is closed")


async def test_a_task_failing_while_the_service_runs_fails_the_wait() -> None:
    stop, broken = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(broken_when(broken))
    broken.set()
    with pytest.raises(RuntimeError, match="Session is closed"):
        await first(stop.wait(), [task])


async def test_a_task_broken_by_the_stop_itself_does_not_fail_the_stopping_service() -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(broken_when(stop))  # breaks when the stop closes what it reads
    stop.set()
    await first(stop.wait(), [task])  # the stop is what happened: no failure raised
    assert task.done() and isinstance(task.exception(), RuntimeError)
