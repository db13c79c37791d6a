"""The claims whose latest decision failed, by cause, and for how long the oldest has waited: what
the alert on claims pending too long and the dashboard's pending panel read.

Followed from the decisions this allocator makes while it leads; a new leader counts from its own
start (the log says when a claim failed, not how long it has waited since).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable

from tangram.events import ClaimAllocated, ClaimFailed, ClaimReleased, Event


class WaitingClaims:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cause: dict[str, str] = {}  # uid -> the cause of its latest failure
        self._since: dict[str, float] = {}  # uid -> when it first failed, while it still waits

    def observe(self, event: Event, outputs: Iterable[Event]) -> None:
        if isinstance(event, ClaimReleased):
            self._forget(event.uid)
        for output in outputs:
            if isinstance(output, ClaimFailed):
                self._cause[output.uid] = output.cause
                self._since.setdefault(output.uid, self._clock())
            elif isinstance(output, ClaimAllocated | ClaimReleased):
                self._forget(output.uid)

    def _forget(self, uid: str) -> None:
        self._cause.pop(uid, None)
        self._since.pop(uid, None)

    def count(self, cause: str) -> int:
        return Counter(self._cause.values())[cause]

    def oldest_s(self) -> float:
        """How long the claim waiting longest has waited; 0 when none waits."""
        return max((self._clock() - since for since in self._since.values()), default=0.0)
