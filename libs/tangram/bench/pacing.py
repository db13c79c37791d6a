"""Open-loop pacing for the benchmarks that run at a rate: the one way to wait for an arrival's turn."""

from __future__ import annotations

import asyncio
import time


async def pace(started: float, index: int, interval: float | None) -> None:
    """Wait until `started + index * interval` on the perf_counter clock: arrival `index` of a paced
    run starts then, whatever the ones before it still wait for. Saturated runs (`None`) never wait."""
    if interval is not None:
        delay = started + index * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
