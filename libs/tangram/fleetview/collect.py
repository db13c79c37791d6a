"""Fill a FleetView from the bus: once (`tangram status`) or live (`tangram ui`), and judge service health."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import aiohttp

from tangram.bus import STREAMS, Bus, current_leader
from tangram.events import Event
from tangram.fleetview.model import FleetView, ServiceHealth

HEALTH_TIMEOUT_S = 2.0


async def snapshot(bus: Bus) -> FleetView:
    """Everything the streams hold now, folded."""
    view = FleetView()
    for spec in STREAMS:
        async for _, event in bus.replay(spec.name):
            view.apply(event)
    return view


async def follow(
    bus: Bus, view: FleetView, *, stop: asyncio.Event, changed: Callable[[Event], None] | None = None
) -> None:
    """Keep `view` current until `stop` is set: each stream's history, then its live events."""

    def apply(event: Event) -> None:
        view.apply(event)
        if changed is not None:
            changed(event)

    followers = [
        asyncio.create_task(bus.follow(spec.name, spec.subjects, apply, stop=stop)) for spec in STREAMS
    ]
    try:
        await asyncio.gather(*followers)
    finally:
        for task in followers:
            task.cancel()
        await asyncio.gather(*followers, return_exceptions=True)


async def services(
    bus: Bus, view: FleetView, health_urls: Sequence[tuple[str, str]] = (), now: datetime | None = None
) -> list[ServiceHealth]:
    """What the bus says of each service, and what each configured health endpoint answers."""
    now = now or datetime.now(UTC)
    leader = await current_leader(bus, "allocator")
    found = [
        ServiceHealth("allocator", "ok", f"leader {leader}")
        if leader
        else ServiceHealth("allocator", "down", "no leader holds the allocator lease")
    ]
    for name, node in sorted(view.nodes.items()):
        age = (now - node.inventory_at).total_seconds()
        found.append(ServiceHealth(f"discovery@{name}", "ok", f"last inventory {age:.0f}s ago"))
    for consumer, count in sorted(view.dead_letters.items()):
        found.append(ServiceHealth(f"dead letters ({consumer})", "stale", f"{count} messages"))
    if health_urls:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)) as session:
            found.extend(await asyncio.gather(*(_probe(session, n, u) for n, u in health_urls)))
    return found


async def _probe(session: aiohttp.ClientSession, name: str, url: str) -> ServiceHealth:
    base = url.rstrip("/")
    try:
        async with session.get(f"{base}/readyz") as response:
            ready = response.status == 200
    except (aiohttp.ClientError, TimeoutError) as error:
        return ServiceHealth(name, "down", f"{base}: {type(error).__name__} {error}".strip())
    return ServiceHealth(
        name, "ok" if ready else "stale", f"{base}/readyz {'ready' if ready else 'not ready'}"
    )
