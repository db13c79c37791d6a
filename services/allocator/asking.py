"""Asking the allocator about Kubernetes claims, by priority and fairly across namespaces, a
bounded number at a time.

Claims of a higher priority are asked first; among one priority, each namespace waits in its own
line and the lines take turns (`FairQueue`); at most
`max_in_flight` claims are asked and not yet answered (decided, and the decision written back).
A namespace that floods the cluster with claims therefore delays another namespace's claim by
about `max_in_flight` answers plus one per waiting namespace, never by the length of its flood.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from tangram.events import ClaimRequested, Event
from tangram.kubernetes.objects.fairqueue import FairQueue

# Claims asked and not yet answered. Enough to keep the allocator and the writes busy (a decision
# takes about a millisecond, its write some more); few enough that a claim arriving behind a
# flood waits for at most this many answers.
MAX_IN_FLIGHT = 32
# An asked claim whose answer never came back (its request dead-lettered, say) gives its place
# back after this long, so that the line never stops.
IN_FLIGHT_EXPIRY_S = 60.0


class FairAsker:
    """`request(uid)` builds the request to publish when the claim's turn comes, or None when the
    claim is no longer to be asked (deleted, or no longer Tangram's, while it waited)."""

    def __init__(
        self,
        publish: Callable[[Event], Awaitable[object]],
        request: Callable[[str], ClaimRequested | None],
        *,
        max_in_flight: int = MAX_IN_FLIGHT,
        expiry_s: float = IN_FLIGHT_EXPIRY_S,
    ) -> None:
        self._publish = publish
        self._request = request
        self._max_in_flight = max_in_flight
        self._expiry_s = expiry_s
        self._waiting = FairQueue()
        self._in_flight: dict[str, float] = {}  # uid -> when it was asked (loop time)
        self._wake = asyncio.Event()

    def waiting(self, uid: str) -> bool:
        return uid in self._waiting

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def waiting_count(self) -> int:
        return len(self._waiting)

    def enqueue(self, namespace: str, uid: str, priority: int = 0) -> None:
        """Ask about the claim when its namespace's turn comes among the claims of its priority,
        after every claim of a higher priority (once, however often it is put)."""
        self._waiting.push(namespace, uid, priority)
        self._wake.set()

    def discard(self, uid: str) -> None:
        self._waiting.discard(uid)

    def answered(self, uid: str) -> None:
        """The claim's request was decided and the decision acted on: its place goes to the next."""
        if self._in_flight.pop(uid, None) is not None:
            self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        waker = asyncio.create_task(self._wake_on(stop))
        try:
            await self._ask_in_turn(stop)
        finally:
            waker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waker

    async def _wake_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._wake.set()

    async def _ask_in_turn(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            now = loop.time()
            for asked, since in list(self._in_flight.items()):
                if now - since > self._expiry_s:
                    del self._in_flight[asked]
            if not self._waiting or len(self._in_flight) >= self._max_in_flight:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._expiry_s)
                continue
            uid = self._waiting.pop()
            request = None if uid is None else self._request(uid)
            if uid is None or request is None:
                continue
            self._in_flight[uid] = loop.time()
            await self._publish(request)
