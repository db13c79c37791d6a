"""A leader whose first read of the log is cut short (a NATS server lost, leaders being elected)
reads it again into a fresh ledger instead of exiting; a refusal is not retried."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import nats.errors
import nats.js.errors
import pytest

from services.allocator.rebuilding import rebuilt_ledger
from services.allocator.settings import AllocatorSettings
from tangram.bus import Bus, BusError
from tangram.events import Event
from tangram.service import ServiceContext

from .helpers import gpus, inventory, request


@dataclass
class FlakyLog:
    """Stands in for the bus: the log's events, after `failures` reads cut short by `cause`."""

    events: list[Event]
    failures: int
    cause: Exception
    reads: int = 0
    config: Any = field(default_factory=type("Config", (), {"producer": "allocator"}))

    async def replay_into(self, sources: object, each: Callable[[Event], object], **_: object) -> int:
        self.reads += 1
        for event in self.events[:1]:
            each(event)  # part of the log is folded before the read is cut short
        if self.reads <= self.failures:
            raise BusError("stream info TANGRAM_INVENTORY: TimeoutError") from self.cause
        for event in self.events[1:]:
            each(event)
        return len(self.events)


SETTINGS = AllocatorSettings(nats_urls=("nats://127.0.0.1:4222",), ledger_image=False)


def _context(log: FlakyLog) -> ServiceContext:
    return ServiceContext(name="allocator", bus=cast(Bus, log), stop=asyncio.Event())


async def test_a_read_cut_short_is_read_again_into_a_fresh_ledger() -> None:
    log = FlakyLog(
        [inventory("l40s-8", "n1"), request(1, gpus(2))], failures=2, cause=nats.errors.TimeoutError()
    )
    ledger = await asyncio.wait_for(rebuilt_ledger(_context(log), SETTINGS), 30)
    assert ledger is not None
    assert log.reads == 3
    # One inventory folded once: a ledger folded three times over would not start from scratch.
    assert ledger.fleet.node_names == ["n1"]
    [allocated] = ledger.apply(request(2, gpus(8)))
    assert type(allocated).__name__ == "ClaimAllocated"


async def test_a_refused_read_is_not_retried() -> None:
    log = FlakyLog([inventory("l40s-8", "n1")], failures=1, cause=nats.js.errors.NotFoundError())
    with pytest.raises(BusError):
        await rebuilt_ledger(_context(log), SETTINGS)
    assert log.reads == 1


async def test_a_stop_while_waiting_to_read_again_ends_without_a_ledger() -> None:
    log = FlakyLog([], failures=1_000, cause=nats.errors.TimeoutError())
    ctx = _context(log)
    ctx.stop.set()
    assert await asyncio.wait_for(rebuilt_ledger(ctx, SETTINGS), 30) is None
