"""Which of Tangram's claims the allocator is asked about, with which attempt, and when again.

A claim is asked once (in its namespace's line of the `FairAsker`); again only when it was
released and a pod waits for it again, when it failed before this allocator led, when capacity is
freed (it failed for want of capacity) or once the fleet's nodes change (no node could hold it).
The deletion or the deallocation of a claim the ledger knows becomes a release.

This keeps the book only: what the caller is to publish or write is handed back to it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from services.allocator.asking import FairAsker
from services.allocator.clusterview import ClusterView, Key, key_of, uid_of
from tangram.allocation.ledger import Ledger
from tangram.events import ClaimReleased, ClaimRequested, Event, FailureCause, GangMember, PreemptionPolicy
from tangram.kubernetes.objects.claimbridge import (
    ClaimRef,
    allocation_status,
    claim_released,
    claim_requested,
    classify,
)

Publish = Callable[[Event], Awaitable[object]]
# A claim's priority and preemption policy, from its pods (`Preemptions.rank`); and the claims no
# claim may preempt now, from the disruption budgets (`Preemptions.protected`). Apart, because every
# claim is ranked when it joins the line, and only a request that may preempt needs the budgets.
Rank = Callable[[dict[str, Any]], tuple[int, PreemptionPolicy]]
Protected = Callable[[], list[str]]
# The group of pods a claim is placed with, from its pods (`ClaimBridge` reads it); None: alone.
Gang = Callable[[dict[str, Any]], GangMember | None]


def unranked(claim: dict[str, Any]) -> tuple[int, PreemptionPolicy]:
    return 0, "PreemptLowerPriority"


def unprotected() -> list[str]:
    return []


def alone(claim: dict[str, Any]) -> GangMember | None:
    return None


class ClaimRequester:
    def __init__(
        self,
        view: ClusterView,
        ledger: Ledger,
        publish: Publish,
        *,
        producer: str,
        max_in_flight: int,
        rank: Rank = unranked,
        protected: Protected = unprotected,
        gang: Gang = alone,
    ) -> None:
        self._view = view
        self.rank = rank
        self.protected = protected
        self.gang = gang
        self._ledger = ledger
        self._producer = producer
        self._requested: dict[str, int] = {}  # uid -> the attempt asked last
        self._known: set[str] = set()  # uids of claims this bridge asked about
        self._pending: set[str] = set()  # uids of claims that failed for capacity: asked again on release
        # uids of claims no node could hold: asked again once the fleet's nodes change
        self._unfit: dict[str, frozenset[str]] = {}
        self.asker = FairAsker(publish, self.request_for, max_in_flight=max_in_flight)
        self._attempts: dict[str, int] = {}  # uid -> the attempt it is to be asked with
        self._keys: dict[str, Key] = {}  # uid -> (namespace, name) of the claims asked about
        self._released: set[str] = set()
        # released as deleted, until the ledger has read it so (it holds them until it forgets them)
        self._deleted: dict[str, None] = {}
        self._reasked: set[str] = set()  # released, then asked again for a pod that waits for it
        # The fleet's nodes when last looked at: taken whatever waits, so that a change is one
        # (were it taken only while claims wait, the first inventory after a failure would look
        # like a new fleet, and every claim waiting for capacity would be asked again for nothing).
        self._nodes: frozenset[str] = frozenset(ledger.fleet.node_names)

    def enqueue(self, claim: dict[str, Any], attempt: int) -> None:
        """Put the claim in its namespace's line, to be asked with `attempt` when its turn comes."""
        uid = uid_of(claim)
        self._keys[uid] = key_of(claim)
        self._attempts[uid] = attempt
        self._requested[uid] = attempt
        self._known.add(uid)
        self.asker.enqueue(key_of(claim)[0], uid, self.rank(claim)[0])

    def request_for(self, uid: str) -> ClaimRequested | None:
        claim = self.claim_by_uid(uid)
        if claim is None or classify(claim, self._view.classes) != "tangram":
            return None  # deleted, or no longer Tangram's, while it waited
        priority, policy = self.rank(claim)
        return claim_requested(
            claim,
            self._view.classes,
            producer=self._producer,
            attempt=self._attempts[uid],
            priority=priority,
            preemption_policy=policy,
            protected=self.protected() if policy != "Never" else [],
            gang=self.gang(claim),
        )

    def knows(self, uid: str) -> bool:
        """This bridge asked about the claim, or the ledger decided or holds it."""
        return uid in self._known or uid in self._ledger.decided or uid in self._ledger.outside

    def ask(self, claim: dict[str, Any]) -> dict[str, Any] | None:
        """Ask for the claim once; a decision already made but not written is returned instead,
        for the caller to write.

        Asked again (a later attempt) only when it was released and a pod waits for it again, or
        when it failed before this allocator led (capacity may have changed since); a claim that
        fails while this allocator leads is asked again when capacity is released.
        """
        uid = uid_of(claim)
        released = uid in self._released or uid in self._ledger.released
        if released:
            if uid in self._reasked:
                return None
            self._reasked.add(uid)
            self._released.discard(uid)
        elif self._ledger.decided.get(uid) == "allocated":
            held = self._ledger.fleet.allocation(uid)
            # decided, never written (the allocator stopped in between)
            return None if held is None else allocation_status(held)
        elif uid in self._requested:
            return None
        attempt = max(self._ledger.attempts.get(uid, 0), self._requested.get(uid, 0))
        if released or self._ledger.decided.get(uid) == "failed":
            attempt += 1
        if self._ledger.decided.get(uid) == "failed":
            self._pending.add(uid)
        self.enqueue(claim, attempt)
        return None

    def ask_again(self, claim: dict[str, Any]) -> None:
        """Ask for a claim not allocated again, with a later attempt: what it is asked with changed
        (its group of pods became known)."""
        uid = uid_of(claim)
        if self._ledger.decided.get(uid) == "allocated" or uid in self._ledger.released:
            return
        if uid not in self._requested and uid not in self._ledger.decided:
            return  # never asked yet: it is asked, with what is known then, when its pod waits
        attempt = max(self._ledger.attempts.get(uid, 0), self._requested.get(uid, 0)) + 1
        self.enqueue(claim, attempt)

    def release(self, ref: ClaimRef, *, deleted: bool = False) -> ClaimReleased | None:
        """The release to publish for a claim the ledger knows, once, and once more when a claim
        released (deallocated) is then deleted; None when there is none. Once deleted, the claim
        is forgotten here: it is never asked again."""
        uid = ref.uid
        released = uid in self._released or uid in self._ledger.released
        if uid in self._deleted or uid in self._ledger.deleted:
            return None
        if (released and not deleted) or not (released or self.knows(uid)):
            return None
        attempt = max(self._ledger.attempts.get(uid, 0), self._requested.get(uid, 0))
        self.asker.discard(uid)
        for held in (self._released, self._reasked, self._pending):
            held.discard(uid)
        self._unfit.pop(uid, None)
        if deleted:
            self._forget_read_deletions()
            self._deleted[uid] = None
            for asked in (self._requested, self._attempts, self._keys):
                asked.pop(uid, None)
            self._known.discard(uid)
        else:
            self._released.add(uid)
        return claim_released(ref, producer=self._producer, attempt=attempt, deleted=deleted)

    def _forget_read_deletions(self) -> None:
        """The ledger reads the releases in the order they were sent: the oldest ones it holds
        as deleted need no remembering here."""
        while self._deleted:
            oldest = next(iter(self._deleted))
            if oldest not in self._ledger.deleted:
                break
            del self._deleted[oldest]

    def gone_while_away(self) -> Iterator[ClaimRef]:
        """The claims the ledger holds that are no longer listed (deleted before this allocator
        led), each judged as the caller comes to it."""
        present = {uid_of(c) for c in self._view.claims.values()}
        for uid in sorted(set(self._ledger.decided) | set(self._ledger.outside)):
            if uid in present or uid in self._ledger.deleted:
                continue  # released as deleted already (a claim only deallocated is released again)
            namespace, name = self._ledger.claims.get(uid, ("", ""))
            yield ClaimRef(namespace=namespace, name=name, uid=uid)

    def nodes_seen(self) -> None:
        """The fleet's nodes after an inventory: once they are others than before, the claims that
        wait are asked again (a node cluster-autoscaler added may hold them)."""
        nodes = frozenset(self._ledger.fleet.node_names)
        if nodes == self._nodes:
            return
        self._nodes = nodes
        if self._pending or self._unfit:
            self.retry_pending()

    def retry_pending(self) -> None:
        """Ask again, in their namespaces' lines, the claims that capacity freed now may fit; and
        those no node could hold, once the fleet's nodes are not the ones they failed on."""
        nodes = frozenset(self._ledger.fleet.node_names)
        retry = sorted(self._pending) + sorted(uid for uid, seen in self._unfit.items() if seen != nodes)
        # the highest priority first: the asker serves by priority, and so the retries go out
        for uid in retry:
            if self.asker.waiting(uid):
                continue  # asked again already, and still waiting for its turn
            claim = self.claim_by_uid(uid)
            if claim is None or classify(claim, self._view.classes) != "tangram":
                self._pending.discard(uid)
                self._unfit.pop(uid, None)
                continue
            self._unfit.pop(uid, None)
            attempt = max(self._requested.get(uid, 0), self._ledger.attempts.get(uid, 0)) + 1
            self.enqueue(claim, attempt)

    def counts(self) -> dict[str, int]:
        """How many claims wait in line, are asked and not yet answered, and failed and wait for
        capacity (or for the fleet's nodes) to change."""
        return {
            "waiting": self.asker.waiting_count,
            "asked": self.asker.in_flight,
            "unplaceable": len(self._pending) + len(self._unfit),
        }

    def claim_by_uid(self, uid: str) -> dict[str, Any] | None:
        key = self._keys.get(uid)
        if key is not None:
            claim = self._view.claims.get(key)
            if claim is not None and uid_of(claim) == uid:
                return claim
        return next((c for c in self._view.claims.values() if uid_of(c) == uid), None)

    # --- what the claim writer tells of a decision --------------------------------------------------

    def allocated(self, uid: str) -> None:
        """Allocated: it waits no longer to be asked again."""
        self._pending.discard(uid)
        self._unfit.pop(uid, None)

    def adopted(self, uid: str) -> None:
        """Another writer allocated it: the ledger is told of that allocation, never asked."""
        self._known.add(uid)
        self._pending.discard(uid)
        self._unfit.pop(uid, None)
        self.asker.discard(uid)

    def failed(self, uid: str, cause: FailureCause) -> None:
        """Failed for want of capacity (or inside the allocator): asked again when capacity is
        freed; no node could hold it: asked again once the fleet's nodes change. A claim at fault
        is not asked again: its spec cannot change, so neither can its answer."""
        if cause in ("capacity", "internal"):
            self._pending.add(uid)
        elif cause == "hardware":
            self._unfit[uid] = frozenset(self._ledger.fleet.node_names)
