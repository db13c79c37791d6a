"""What the log says about one node's MIG instances: command outcomes, instances Tangram created,
instances kept warm, and the live claims that own instances. Folded from events; no I/O.

What it keeps grows with the node's instances and live claims (and the claims the allocator
placed on it), not with every claim and command ever seen: a claim deleted is forgotten
`forget_after` past its deletion, by the time of the releases folded (`DeletedClaims`), and a
command's outcome `forget_after` past it, by the time of this node's results folded. Both clocks
are events of the log, so a rebuild forgets as the live fold did. A command is delivered again
only until it is acknowledged, which its outcome precedes; one delivered later than that (its node
down for longer) runs again, and creates and destroys are idempotent on the GPU. A create older
than a claim forgotten since is never run (`may_have_forgotten`).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

from tangram.events import (
    ClaimAllocated,
    ClaimFailed,
    ClaimPrepared,
    ClaimReleased,
    ClaimUnprepared,
    Event,
    PartitionApplied,
    PartitionFailed,
)
from tangram.events.deletions import FORGET_DELETED_AFTER, DeletedClaims
from tangram.partitioning.model import InstanceKey

PartitionResult = PartitionApplied | PartitionFailed


def kept_warm(event: PartitionApplied) -> bool:
    """A destroy answered by keeping the instance for the next claim."""
    return event.action == "destroy" and event.kept_warm


class PartitionLedger:
    def __init__(self, node: str, *, forget_after: timedelta = FORGET_DELETED_AFTER) -> None:
        self.node = node
        self.forget_after = forget_after
        self._outcomes: dict[str, PartitionResult] = {}  # by command, in the order they were folded
        self._created: dict[InstanceKey, PartitionApplied] = {}  # by Tangram, not destroyed since
        self._warm: dict[InstanceKey, PartitionApplied] = {}
        self._claims: dict[str, ClaimAllocated] = {}  # live allocations on this node
        # instance -> live claims holding it, in the order they came: one, or the shares of a share host
        self._owners: dict[InstanceKey, list[str]] = {}
        self._whole_gpus: dict[str, set[str]] = {}  # GPU uuid -> live claims holding it whole
        self._ended: set[str] = set()  # claims released or failed
        # Claims prepared on this node that the allocator did not decide (kube-scheduler did): live
        # from their prepare to their unprepare, as the log of this node's kubelet plugin says.
        self._prepared: set[str] = set()
        # The claims the allocator allocated on this node, kept: a node's prepares are read apart
        # from the decisions, and a prepare read after its claim was forgotten would count as
        # one kube-scheduler allocated, live until an unprepare that came before it.
        self._decided: set[str] = set()
        self.deleted = DeletedClaims(forget_after)
        # the horizon of the last forgetting (every claim released before it may be forgotten):
        # what a command sent before it may be about
        self._forgotten_through: datetime | None = None

    # ---- folding ----------------------------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        match event:
            case PartitionApplied(node=node) if node == self.node:
                self._outcome(event)
                key = InstanceKey.of(event.gpu_uuid, event.placement)
                if event.action == "create":
                    self._created[key] = event
                    self._warm.pop(key, None)
                elif kept_warm(event):
                    self._warm[key] = event
                elif event.action == "destroy":
                    self._created.pop(key, None)
                    self._warm.pop(key, None)
            case PartitionFailed(node=node) if node == self.node:
                self._outcome(event)
            case ClaimAllocated(node=node) if node == self.node and event.uid not in self.deleted:
                # decided again after it failed (capacity freed, a preemption) or was released and
                # asked again for a new pod: live from now on. A decision read after the claim's
                # deletion is not: the claim source published the deletion while the request waited,
                # the allocator decided before it read it, and frees the claim as it does.
                self._ended.discard(event.uid)
                self._decided.add(event.uid)
                self._prepared.discard(event.uid)  # its prepare may be folded first: streams interleave
                self._drop_claim(event.uid)
                self._claims[event.uid] = event
                for device in event.devices:
                    if device.placement is None:
                        self._whole_gpus.setdefault(device.gpu_uuid, set()).add(event.uid)
                    elif not device.partition_command:
                        # A reused instance belongs to the claim from its allocation on. One still
                        # to be created belongs to it only through its own create result: until
                        # then the instance at those slices is a previous claim's, on its way out.
                        key = InstanceKey.of(device.gpu_uuid, device.placement)
                        self._own(key, event.uid)
                        self._warm.pop(key, None)
            case ClaimReleased(uid=uid):
                self._ended.add(uid)
                self._drop_claim(uid)
                self.deleted.note(event)
                self._forget_deleted(event.time)
            case ClaimFailed(uid=uid):
                self._ended.add(uid)
                self._drop_claim(uid)
            case ClaimPrepared(node=node, uid=uid) if node == self.node and uid not in self._decided:
                self._prepared.add(uid)
            case ClaimUnprepared(node=node, uid=uid) if node == self.node:
                self._prepared.discard(uid)
            case _:
                return

    def _outcome(self, result: PartitionResult) -> None:
        outcomes = self._outcomes
        # folded again (published here, then followed): it keeps its place, the order of the times
        outcomes[result.command_id] = result
        horizon = result.time - self.forget_after
        while outcomes:
            oldest = next(iter(outcomes.values()))
            if oldest.time > horizon:
                break
            del outcomes[oldest.command_id]

    def _forget_deleted(self, now: datetime) -> None:
        for uid in self.deleted.due(now):
            if uid in self._claims or uid in self._prepared:
                continue  # live: never a deleted uid (its release ended it; a later decision is stale)
            self._ended.discard(uid)
            self._forgotten_through = now - self.forget_after

    def _drop_claim(self, uid: str) -> None:
        if self._claims.pop(uid, None) is None:
            return
        for key in [k for k, owners in self._owners.items() if uid in owners]:
            left = [h for h in self._owners[key] if h != uid]
            if left:
                self._owners[key] = left
            else:
                del self._owners[key]
        for holders in self._whole_gpus.values():
            holders.discard(uid)

    def record(self, result: PartitionResult) -> None:
        """A result this process published (the follow delivers it again later; folding is idempotent)."""
        self.observe(result)

    def adopt(self, key: InstanceKey, claim_uid: str) -> None:
        """An instance found on the GPU that a live claim's allocation names."""
        self._own(key, claim_uid)

    def _own(self, key: InstanceKey, claim_uid: str) -> None:
        holders = self._owners.setdefault(key, [])
        if claim_uid not in holders:
            holders.append(claim_uid)

    # ---- questions --------------------------------------------------------------------------------------

    def outcome(self, command_id: str) -> PartitionResult | None:
        return self._outcomes.get(command_id)

    def created(self, key: InstanceKey) -> PartitionApplied | None:
        return self._created.get(key)

    def created_keys(self) -> set[InstanceKey]:
        return set(self._created)

    def allocation(self, claim_uid: str) -> ClaimAllocated | None:
        """The live claim's allocation on this node, as read from the log so far."""
        return self._claims.get(claim_uid)

    def created_for(self, claim_uid: str) -> list[PartitionApplied]:
        """Instances Tangram created for the claim and has not destroyed since."""
        return [event for event in self._created.values() if event.claim_uid == claim_uid]

    def has_ended(self, claim_uid: str) -> bool:
        return claim_uid in self._ended

    def may_have_forgotten(self, sent: datetime) -> bool:
        """Whether a claim a command sent at `sent` was about may be forgotten here by now: a
        claim's commands come before its deletion, and it is forgotten `forget_after` past that."""
        # the claim source and the allocator stamp with clocks of their own: a margin for their skew
        margin = self.forget_after / 6
        return self._forgotten_through is not None and sent <= self._forgotten_through + margin

    def sizes(self) -> dict[str, int]:
        """How many entries each of the ledger's per-claim and per-command maps holds."""
        return {
            "outcomes": len(self._outcomes),
            "ended": len(self._ended),
            "decided": len(self._decided),
            "claims": len(self._claims),
            "created": len(self._created),
            "deleted": len(self.deleted.saved()),
        }

    def prepared_outside(self, claim_uid: str) -> bool:
        """Live because this node prepared it, not because the allocator decided it."""
        return claim_uid in self._prepared

    def is_live(self, claim_uid: str) -> bool:
        return claim_uid in self._claims or claim_uid in self._prepared

    def owner(self, key: InstanceKey) -> str | None:
        """The live claim whose allocation or creation holds this instance."""
        holders = self._owners.get(key)
        if holders:
            return holders[0]
        created = self._created.get(key)
        if created is not None and created.claim_uid and self.is_live(created.claim_uid):
            return created.claim_uid
        return None

    def whole_gpu_claimed(self, gpu_uuid: str) -> bool:
        return bool(self._whole_gpus.get(gpu_uuid))

    def is_warm(self, key: InstanceKey) -> bool:
        return key in self._warm

    def warm_counts(self) -> Counter[str]:
        return Counter(event.profile for event in self._warm.values())
