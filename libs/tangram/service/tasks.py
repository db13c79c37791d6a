"""The background tasks of a service: wait for a milestone unless a task fails first, then settle."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tangram.bus import Bus
from tangram.events import Event


async def first(awaitable: Awaitable[object], tasks: Sequence[asyncio.Task[None]]) -> None:
    """Wait for `awaitable`, unless a background task fails first: then that failure is raised.

    When both are done at one wake-up (a stop that closes a client under a task still reading),
    the awaitable came first: a service told to stop is not failed by what stopping broke."""
    waiter: asyncio.Future[object] = asyncio.ensure_future(awaitable)
    try:
        while not waiter.done():
            pending: list[asyncio.Future[Any]] = [waiter, *tasks]
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if waiter.done():
                break
            for task in tasks:
                failure = task.exception() if task.done() and not task.cancelled() else None
                if failure is not None:
                    raise failure
        waiter.result()
    finally:
        if not waiter.done():
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)


async def reached(milestone: asyncio.Event, stop: asyncio.Event, tasks: Sequence[asyncio.Task[None]]) -> bool:
    """Wait for `milestone` unless the service stops first (False) or a background task fails
    first (raised). A service told to stop while it starts must not wait for a milestone that
    the tasks it stopped will never reach."""
    watchers = [asyncio.ensure_future(milestone.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await first(asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED), tasks)
    finally:
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
    return milestone.is_set()


async def settle(tasks: Sequence[asyncio.Task[None]]) -> None:
    """Wait for every task (the service is stopping); the first failure among them is raised."""
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
            raise outcome


def follow_all(
    bus: Bus,
    sources: Sequence[tuple[str, Sequence[str]]],
    handler: Callable[[Event], None],
    *,
    stop: asyncio.Event,
) -> tuple[list[asyncio.Task[None]], Awaitable[object]]:
    """Follow each (stream, subjects) into one handler; returns the tasks and an awaitable that
    completes once every stream's history has been handled."""
    tasks = []
    caught_up = []
    for stream, subjects in sources:
        done = asyncio.Event()
        caught_up.append(done)
        tasks.append(asyncio.create_task(bus.follow(stream, subjects, handler, stop=stop, caught_up=done)))
    return tasks, asyncio.gather(*(event.wait() for event in caught_up))
