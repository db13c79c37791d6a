"""Which command of a claim for a MIG slot is current, folded from the nodes' partition results.

The allocator and the node both send a claim's create and destroy commands (the node when kubelet
prepares and unprepares it), and both derive the command's id from the claim, the slot and this
count (`ids.partition_command_id`): JetStream stores the command once and the partitioner runs it
once. The count moves on with each failed create or disable-mig and each destroy of the slot for
the claim, so a claim decided or prepared again there gets a command of its own instead of finding
the old one already answered (or dropped by JetStream as a duplicate).
"""

from __future__ import annotations

from collections import Counter

from tangram.events.catalogue import PartitionApplied, PartitionFailed
from tangram.events.ids import partition_command_id

Slot = tuple[str, str, int]  # (claim uid, GPU uuid, first memory slice; 0 for a whole GPU)

# How far back a create id is looked for among the attempts of its slot (a rebuild may read the claims
# before the results that moved the count on). A claim closed this often on one slot is refused by
# then; past it the current count is taken.
_LOOKED_BACK = 64


class SlotAttempts:
    def __init__(self) -> None:
        self._closed: Counter[Slot] = Counter()
        self._slots_of: dict[str, list[Slot]] = {}  # claim uid -> its slots counted

    def observe(self, result: PartitionApplied | PartitionFailed) -> None:
        """Count the result if it closes an attempt: a destroy done, a create or disable-mig failed."""
        if not result.claim_uid:
            return
        closes = (
            result.action == "destroy" if isinstance(result, PartitionApplied) else result.action != "destroy"
        )
        if closes:
            self._count((result.claim_uid, result.gpu_uuid, result.placement.start), 1)

    def _count(self, slot: Slot, closed: int) -> None:
        if slot not in self._closed:
            self._slots_of.setdefault(slot[0], []).append(slot)
        self._closed[slot] += closed

    def forget(self, claim_uid: str) -> None:
        """Drop the claim's counts: it is gone for good (deleted), never to be commanded again."""
        for slot in self._slots_of.pop(claim_uid, ()):
            del self._closed[slot]

    def saved(self) -> list[tuple[Slot, int]]:
        """The counts, each slot's with it, in the order the slots were first closed: what a
        ledger image keeps of them."""
        return list(self._closed.items())

    @classmethod
    def restore(cls, saved: list[tuple[Slot, int]]) -> SlotAttempts:
        """The counts `saved` returned."""
        attempts = cls()
        for slot, closed in saved:
            attempts._count(slot, closed)
        return attempts

    def current(self, claim_uid: str, gpu_uuid: str, start: int) -> int:
        return self._closed.get((claim_uid, gpu_uuid, start), 0)

    def of_create(
        self, claim_uid: str, create_id: str, *, gpu_index: int, gpu_uuid: str, profile_id: int, start: int
    ) -> int:
        """The attempt a create command of the claim was made with, found by its id (the current
        one when no attempt looked at makes that id)."""
        current = self.current(claim_uid, gpu_uuid, start)
        for attempt in (current, *(a for a in range(_LOOKED_BACK) if a != current)):
            made = partition_command_id(
                claim_uid, "create", gpu_index=gpu_index, profile_id=profile_id, start=start, attempt=attempt
            )
            if made == create_id:
                return attempt
        return current
