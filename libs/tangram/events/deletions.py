"""Deleted claims, each forgotten a while after its deletion, by the claims stream's own clock.

A claim's uid is never asked again once the claim is deleted, yet whoever follows the claims keeps
what it learnt of it (its decision, its attempts, its commands) only as long as something about
it may still arrive: a resend, a redelivery, a node's late result. The clock is the time of the
claim events folded, never the wall clock, so two folds of the same log forget at the same events.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

from tangram.events.catalogue import ClaimReleased

# Far longer than anything sent before a deletion can take to arrive: JetStream de-duplicates
# resends for 2 minutes, and a redelivery comes within the consumer's ack wait, or at the next
# start, which folds the log in the same order.
FORGET_DELETED_AFTER = timedelta(hours=1)


class DeletedClaims:
    def __init__(
        self, after: timedelta = FORGET_DELETED_AFTER, saved: Iterable[tuple[datetime, str]] = ()
    ) -> None:
        self.after = after
        self._queue: deque[tuple[datetime, str]] = deque()  # (release time, uid), as folded
        self._noted: Counter[str] = Counter()  # uid -> its entries in the queue (a release sent again)
        for entry in saved:
            self._add(entry)

    def note(self, released: ClaimReleased) -> None:
        if released.deleted:
            self._add((released.time, released.uid))

    def _add(self, entry: tuple[datetime, str]) -> None:
        self._queue.append(entry)
        self._noted[entry[1]] += 1

    def __contains__(self, uid: object) -> bool:
        """Deleted, and not forgotten yet."""
        return uid in self._noted

    def due(self, now: datetime) -> Iterator[str]:
        """The claims deleted `after` before `now` or earlier, each taken off once."""
        horizon = now - self.after
        queue = self._queue
        while queue and queue[0][0] <= horizon:
            uid = queue.popleft()[1]
            self._noted[uid] -= 1
            if not self._noted[uid]:
                del self._noted[uid]
            yield uid

    def waiting(self) -> bool:
        return bool(self._queue)

    def saved(self) -> list[tuple[datetime, str]]:
        return list(self._queue)
