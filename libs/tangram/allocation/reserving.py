"""The ledger's preemptions (pure): the reservation a preemptor holds on a node, the nodes it fences
off from claims of its priority or lower, and the plan made when a claim fails for capacity.

`Ledger` folds them in with the rest of its state; they live here so that the fold reads as one
thing, and what preemption adds to it as another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from tangram.allocation.fleet import FleetState
from tangram.allocation.model import Claim, Failed, Policy
from tangram.allocation.preemption import plan_preemption
from tangram.allocation.spec import DeviceClass
from tangram.events import ClaimPreempting, ClaimRequested, Event, PreemptionVictim
from tangram.events.ids import derived_id


@dataclass(frozen=True)
class Reservation:
    """A preemption under way: the victims' devices on `node` are the preemptor's once freed; no
    claim of `priority` or lower but the preemptor is placed on the node until it is allocated."""

    node: str
    priority: int
    victims: tuple[str, ...]


@dataclass(frozen=True)
class GangHold:
    """A waiting group's fabric clique: no claim of `priority` or lower but the group's own is
    placed on these nodes until the group is placed, so the group fills the clique as claims there
    end instead of being passed over for ever by smaller claims asked after it."""

    nodes: frozenset[str]
    priority: int


class Reserving:
    """What the ledger's preemptions read and keep; `Ledger` holds each of these as a field."""

    fleet: FleetState
    policy: Policy
    producer: str
    positions: dict[str, int]
    claims: dict[str, tuple[str, str]]  # uid -> (namespace, name)
    priorities: dict[str, int]  # uid -> the priority its last request carried
    reservations: dict[str, Reservation]  # preemptor uid -> its reservation
    gang_holds: dict[tuple[str, str], GangHold]  # (namespace, group) -> the clique kept for it
    gangs: dict[tuple[str, str], dict[str, ClaimRequested]]  # (namespace, group) -> its claims' requests

    def _fenced_for(self, request: ClaimRequested) -> set[str]:
        """Nodes reserved for another claim's preemption or kept for another waiting group, which
        this claim may not take from it: all of them for a claim of the same priority or lower. A
        claim of a group may take what is reserved for any claim of its group."""
        own = (request.namespace, request.gang.group) if request.gang is not None else None
        ours = set(self.gangs.get(own, {})) if own is not None else set()
        ours.add(request.uid)
        fenced = {
            r.node
            for uid, r in self.reservations.items()
            if uid not in ours and request.priority <= r.priority
        }
        for key, hold in self.gang_holds.items():
            if key != own and request.priority <= hold.priority:
                fenced |= hold.nodes
        return fenced

    def _preempt(
        self, request: ClaimRequested, claim: Claim, classes: Mapping[str, DeviceClass], failed: Failed
    ) -> tuple[list[Event], Failed]:
        """A claim that did not fit for want of capacity: the preemption that makes room for it, or
        the one under way for it; and the failure that tells its pods what they wait for.

        A preemption is planned once: the claim is asked again as its victims' devices are freed,
        and waits for them while any of them still holds its devices. It is planned again only
        once they are all freed and it still does not fit, or when one of them may no longer be
        preempted (its eviction was refused)."""
        reservation = self.reservations.get(request.uid)
        if reservation is not None:
            holding = [v for v in reservation.victims if self.fleet.allocation(v) is not None]
            if holding and not set(holding) & set(request.protected):
                return [], msgspec.structs.replace(
                    failed,
                    reason=f"{failed.reason}; preempting {len(holding)} claim"
                    f"{'s' if len(holding) != 1 else ''} of lower priority on node {reservation.node} "
                    f"({', '.join(self._claim_name(v) for v in holding)}): waits for their devices",
                )
            del self.reservations[request.uid]
        if request.preemption_policy == "Never" or not self._may_be_lower(request.priority):
            return [], failed
        plan = plan_preemption(
            self.fleet,
            claim,
            classes,
            self.policy,
            priority=request.priority,
            priorities=self.priorities,
            protected=set(request.protected),
            fenced={r.node for uid, r in self.reservations.items() if uid != request.uid},
            companions=self._companions(),
        )
        if plan is None:
            return [], failed
        self.reservations[request.uid] = Reservation(
            node=plan.node, priority=request.priority, victims=plan.victims
        )
        victims = [self.victim(v) for v in plan.victims]
        preempting = ClaimPreempting(
            key=request.key,
            event_id=derived_id(request.uid, "preempting", request.attempt),
            producer=self.producer,
            namespace=request.namespace,
            name=request.name,
            uid=request.uid,
            node=plan.node,
            priority=request.priority,
            victims=victims,
            reason=failed.reason,
            positions=dict(self.positions),
            attempt=request.attempt,
        )
        named = ", ".join(f"{self._claim_name(v.uid)} (priority {v.priority})" for v in victims)
        reason = (
            f"{failed.reason}; preempting {len(victims)} claim{'s' if len(victims) != 1 else ''} of "
            f"lower priority on node {plan.node}: {named}"
        )
        return [preempting], msgspec.structs.replace(failed, reason=reason)

    def _companions(self) -> dict[str, tuple[str, ...]]:
        """uid -> the other claims its group of pods holds, for each claim of a group that holds
        devices: preempting one preempts them all."""
        found: dict[str, tuple[str, ...]] = {}
        for members in self.gangs.values():
            holding = [uid for uid in members if self.fleet.allocation(uid) is not None]
            for uid in holding:
                found[uid] = tuple(u for u in holding if u != uid)
        return found

    def victim(self, uid: str) -> PreemptionVictim:
        """The claim as a preemption names it: where it is, and the priority it was asked with."""
        namespace, name = self.claims.get(uid, ("", ""))
        return PreemptionVictim(namespace=namespace, name=name, uid=uid, priority=self.priorities.get(uid, 0))

    def _may_be_lower(self, priority: int) -> bool:
        """Whether any claim the ledger knows has a priority below `priority`: without one there is
        nobody to preempt, and no node is looked at (the common case, every claim at priority 0)."""
        return priority > 0 or any(p < priority for p in self.priorities.values())

    def _claim_name(self, uid: str) -> str:
        namespace, name = self.claims.get(uid, ("", uid))
        return f"{namespace}/{name}" if namespace else name
