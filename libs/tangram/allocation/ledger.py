"""The allocator's state as a fold over its event log: pure, no I/O.

Live events produce output events; replayed history only rebuilds state. A decision is made once
per claim: a redelivered request, or a request already decided in the log, produces nothing new.
Output event ids are derived from the claim uid and the attempt decided, so a decision republished
after a crash is de-duplicated by JetStream instead of stored twice, while a claim decided again (asked
with a later attempt after a failure or a release) gets ids of its own: JetStream would drop the new
allocation and its partition commands as duplicates of the first, and no node would see them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec

from tangram.allocation.commanding import Commanding, token_or_none
from tangram.allocation.fleet import FleetState
from tangram.allocation.grouping import Grouping, claim_of
from tangram.allocation.model import (
    Allocated,
    Claim,
    Decision,
    Policy,
    internal_failure,
)
from tangram.allocation.reserving import GangHold, Reservation, Reserving
from tangram.allocation.resolutions import carried_class
from tangram.allocation.spec import DeviceClass
from tangram.dra.imex import ImexChannel
from tangram.dra.sharing import allocation_shares
from tangram.events import (
    CLAIMS_STREAM,
    ClaimAllocated,
    ClaimFailed,
    ClaimPreempting,
    ClaimPrepared,
    ClaimReleased,
    ClaimRequested,
    ClaimUnprepared,
    Event,
    MigPlacement,
    NodeInventory,
    PartitionApplied,
    PartitionFailed,
    PartitionRequested,
    subject_token,
)
from tangram.events.attempts import SlotAttempts
from tangram.events.deletions import DeletedClaims
from tangram.events.ids import derived_id, numbered_id


@dataclass
class Ledger(Commanding, Reserving, Grouping):
    fleet: FleetState
    classes: Mapping[str, DeviceClass]
    policy: Policy = "tangram"
    producer: str = "allocator"
    decided: dict[str, str] = field(default_factory=dict)  # uid -> "allocated" | "failed"
    released: set[str] = field(default_factory=set)
    claims: dict[str, tuple[str, str]] = field(default_factory=dict)  # uid -> (namespace, name)
    commands: dict[str, str] = field(default_factory=dict)  # create command id -> claim uid
    # create command id -> the node (subject token) it was sent to: a result counts only from there
    command_nodes: dict[str, str] = field(default_factory=dict)
    created: dict[str, str] = field(default_factory=dict)  # create command id -> MIG device UUID
    # stream -> last sequence folded, for the inputs read apart from the claims (stamped on decisions)
    positions: dict[str, int] = field(default_factory=dict)
    # Claims allocated outside the allocator (kube-scheduler), learned from their node's prepare:
    # uid -> node. Their node destroys what it made for them, so their release emits nothing.
    outside: dict[str, str] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)  # what two deciders gave out at once
    # uid -> the attempt of its last decided request: a failed claim is decided again only when
    # asked with a later attempt (after capacity was released), never on a redelivery.
    attempts: dict[str, int] = field(default_factory=dict)
    # Destroy commands of released claims that no result has answered yet: uid -> command id ->
    # command. A release the allocator folded at a rebuild may be one its previous process read but
    # died before acting on; the consumer delivers it again, and the destroys go out then.
    unanswered_destroys: dict[str, dict[str, PartitionRequested]] = field(default_factory=dict)
    _destroy_claims: dict[str, str] = field(default_factory=dict)  # destroy command id -> claim uid
    # (node, GPU uuid, start) -> destroy commands sent there and not answered. A rebuild folds the
    # results the live allocator read after a release only at the next decision, or at the end: the
    # result of an older destroy at a placement must not count as the destroy of the instance a
    # later release left there.
    _destroys_at: dict[tuple[str, str, int], set[str]] = field(default_factory=dict)
    # Requests read back from the log whose decision is still to come: counted in the demand mix
    # when it comes (counts_as_demand), as the live fold counted them when it decided.
    _undecided: dict[str, ClaimRequested] = field(default_factory=dict)
    # uid -> the priority its last request carried (its pods' PriorityClass): who may preempt whom
    priorities: dict[str, int] = field(default_factory=dict)
    reservations: dict[str, Reservation] = field(default_factory=dict)  # preemptor uid -> its reservation
    # (namespace, group) -> uid -> the last request of each claim of a group of pods (gangs.py)
    gangs: dict[tuple[str, str], dict[str, ClaimRequested]] = field(default_factory=dict)
    # "<namespace>/<group>" -> the IMEX channel of a group's NVLink domain, while a claim holds it
    domains: dict[str, ImexChannel] = field(default_factory=dict)
    gang_holds: dict[tuple[str, str], GangHold] = field(default_factory=dict)  # waiting groups' cliques
    _domain_members: dict[str, set[str]] = field(default_factory=dict)  # domain -> claim uids
    # which command of a claim for a MIG slot is current, as its node counts it (events.attempts)
    slot_attempts: SlotAttempts = field(default_factory=SlotAttempts)
    # Deleted claims, forgotten a while after their release (by the claims stream's clock, so a
    # rebuild forgets at exactly the events the live ledger did): what the ledger holds grows with
    # the claims that exist, not with every claim ever decided.
    deleted: DeletedClaims = field(default_factory=DeletedClaims)
    _commands_of: dict[str, list[str]] = field(default_factory=dict)  # claim uid -> its create commands

    def folded(self, stream: str, sequence: int) -> None:
        """The event about to be folded is at `sequence` of `stream` (decisions record it, for replay).

        The claims stream is read in order by one consumer: a decision's place in it is its request's.
        """
        if stream != CLAIMS_STREAM:
            self.positions[stream] = sequence

    def snapshot(self) -> dict[str, Any]:
        """What the ledger holds, in a stable order: a live ledger and one rebuilt from the same
        log must agree on it (inventory-derived details, which depend on when each inventory was
        read, are left out)."""
        fleet = self.fleet.snapshot()
        return {
            "decided": dict(sorted(self.decided.items())),
            "released": sorted(self.released),
            "held": fleet["claims"],
            "allocated": {name: node["allocated"] for name, node in fleet["nodes"].items()},
            "domains": {domain: c.model_dump(mode="json") for domain, c in sorted(self.domains.items())},
            "gang_holds": {
                f"{ns}/{group}": sorted(h.nodes) for (ns, group), h in sorted(self.gang_holds.items())
            },
            "reservations": {
                uid: {"node": r.node, "priority": r.priority, "victims": list(r.victims)}
                for uid, r in sorted(self.reservations.items())
            },
        }

    def frees_capacity(self, uid: str) -> bool:
        """Whether the claim's release would free what another claim may take: devices it holds on
        a node of the fleet, a node reserved for it, or the nodes kept for its group. A claim that
        failed, or that another writer allocated on a node this fleet does not have, frees nothing
        when it goes."""
        if uid in self.reservations or self.fleet.holds_on_a_node(uid):
            return True
        group = self._gang_of(uid) if self.gang_holds else None
        return group is not None and group in self.gang_holds

    def observe(self, event: Event) -> None:
        """Fold an event that can produce no output (inventory)."""
        self.apply(event, live=False)

    def apply(self, event: Event, *, live: bool = True) -> list[Event]:
        if isinstance(event, ClaimRequested | ClaimReleased) and self.deleted.waiting():
            # The clock is the claim source's events alone: the live allocator reads those, and
            # not its own decisions, which a rebuild folds besides.
            self._forget_deleted(event.time)
        match event:
            case NodeInventory(hardware=hardware):
                self.fleet.apply_inventory(hardware)
            case ClaimRequested(allocation=allocation) if allocation is not None:
                self.claims[event.uid] = (event.namespace, event.name)
                self.priorities[event.uid] = event.priority
                return self._adopt_allocation(event, allocation, live=live)
            case ClaimRequested():
                self.claims[event.uid] = (event.namespace, event.name)
                self.priorities[event.uid] = event.priority
                if event.uid in self.released and event.attempt > self.attempts.get(event.uid, 0):
                    # Released (deallocated) and asked again with a later attempt: a new pod uses it.
                    self.released.discard(event.uid)
                    self.decided.pop(event.uid, None)
                if event.gang is not None:
                    self.gangs.setdefault((event.namespace, event.gang.group), {})[event.uid] = event
                if live and self._to_decide(event):
                    self._undecided.pop(event.uid, None)
                    try:
                        if event.gang is not None:
                            return self._decide_in_gang(event)
                        return self._decide(event)
                    except Exception as error:
                        # One claim that cannot be decided must not stop the claims after it
                        # (redelivered, then dead-lettered, while the next ones wait behind it).
                        return self._failed_inside(event, error)
                if not live and self._to_decide(event):
                    # Deciding counts the claim in the demand mix; a claim read back from the log
                    # is counted at its decision instead, in the same order, so a rebuild weighs
                    # as the live fold did.
                    self._undecided[event.uid] = event
            case ClaimAllocated():
                self._note_decided(event.uid, counted=True)
                self.reservations.pop(event.uid, None)
                self._drop_hold(event.uid)
                self._adopt(event)
            case ClaimPreempting(uid=uid):
                self.reservations[uid] = Reservation(
                    node=event.node, priority=event.priority, victims=tuple(v.uid for v in event.victims)
                )
            case ClaimFailed(uid=uid):
                if event.held_for_group:
                    self._hold(uid, event.held_for_group)
                if not event.reserved_node:
                    # a reservation given up when the claim was decided again is given up on replay too
                    self.reservations.pop(uid, None)
                self._note_decided(uid, counted=event.cause == "capacity")
                self.decided[uid] = "failed"
                self.attempts[uid] = max(self.attempts.get(uid, 0), event.attempt)
                # A claim fails after its allocation when its MIG instance could not be created;
                # live, its devices were freed then and its other instances' destroys sent, and a
                # rebuild frees them too and waits for the same destroys.
                self._release(uid, replayed=True)
                self._leave_domain(uid)
            case ClaimReleased(uid=uid) if uid in self.outside:
                self._leave_gang(uid)
                self._leave_domain(uid)
                self._undecided.pop(uid, None)
                self.reservations.pop(uid, None)
                self.priorities.pop(uid, None)
                # Allocated by another writer and adopted: its node destroys what it made for it.
                del self.outside[uid]
                self.released.add(uid)
                self.deleted.note(event)
                if live:
                    self.fleet.release(uid, destroy_mig=False)
                else:
                    self.fleet.release_replayed(uid)
            case ClaimReleased(uid=uid):
                self._leave_gang(uid)
                self._leave_domain(uid)
                self._undecided.pop(uid, None)
                self.reservations.pop(uid, None)
                self.priorities.pop(uid, None)
                self.deleted.note(event)  # a claim deallocated first is released again when deleted
                if uid in self.released:
                    # Sent again, not decided again: the partitioner runs each command once.
                    return list(self.unanswered_destroys.get(uid, {}).values()) if live else []
                self.released.add(uid)
                if not live:
                    self._release(uid, replayed=True)
                    return []
                return self._release(uid)
            case PartitionFailed(action="create" | "disable-mig", command_id=command_id):
                self._count_closed(event)
                # Only a result of a command this allocator sent to that node counts: a command
                # sent before a crash and decided differently after it names no one. Read back
                # from the log it changes nothing: the claims stream holds the failure the
                # allocator published for it, and one it died before publishing is delivered
                # again live, unacknowledged, to be acted on and published then.
                if live and self._answers(event):
                    uid = self.commands[command_id]
                    if self._waits_on(uid, command_id):
                        return self._fail_after_partition(uid, event)
            case PartitionFailed(action="destroy", node=node, gpu_uuid=gpu_uuid, placement=placement):
                if self._destroy_answered(event.command_id, (node, gpu_uuid, placement.start)):
                    self.fleet.destroy_refused(node, gpu_uuid, placement.start)
            case PartitionApplied(action="destroy", node=node, gpu_uuid=gpu_uuid, placement=placement):
                self._count_closed(event)
                freed = self._destroy_answered(event.command_id, (node, gpu_uuid, placement.start))
                self.fleet.destroy_done(node, gpu_uuid, placement.start, event.mig_uuid, slot_freed=freed)
            case PartitionApplied(action="create", command_id=command_id, mig_uuid=mig_uuid):
                if self._answers(event):
                    self.created[command_id] = mig_uuid
            case ClaimPrepared(node=node) if token_or_none(node) == event.key:
                self._adopt_prepared(event)
            case ClaimUnprepared(uid=uid) if self.outside.get(uid) == event.node:
                del self.outside[uid]
                if live:
                    self.fleet.release(uid)  # marks its MIG slots as on their way out until inventory says
                else:
                    self.fleet.release_replayed(uid)
            case _:
                pass
        return []

    def _forget_deleted(self, now: datetime) -> None:
        """Forget the claims deleted long enough before `now` that nothing about them can arrive
        any more but a stale copy: a claim forgotten would be decided if asked again, which a
        deleted claim never is."""
        for uid in self.deleted.due(now):
            if uid not in self.released or uid in self.outside or self.fleet.allocation(uid) is not None:
                continue  # asked again after its release after all: it is not gone
            self.released.discard(uid)
            self.decided.pop(uid, None)
            self.claims.pop(uid, None)
            self.attempts.pop(uid, None)
            self.priorities.pop(uid, None)
            self._undecided.pop(uid, None)
            self._drop_commands(uid)
            self.slot_attempts.forget(uid)
            self.fleet.forget(uid)

    def _note_decided(self, uid: str, *, counted: bool) -> None:
        # A decision that counts nothing leaves the request to the next: a claim of a group of pods
        # fails while it waits for the others and is allocated, and counted, with the group later,
        # by another member's request.
        if not counted:
            return
        request = self._undecided.pop(uid, None)
        if request is not None:
            claim = Claim(namespace=request.namespace, name=request.name, uid=uid, spec=request.spec)
            self.fleet.note_demand(claim, self.classes_for(request))

    def classes_for(self, request: ClaimRequested) -> Mapping[str, DeviceClass]:
        """The configured classes, overridden by those the request carries (as the cluster held
        them when the claim was read). A carried class that does not parse is left out: the claim
        then fails naming it as missing, live and in a replay alike."""
        if not request.classes:
            return self.classes
        classes = dict(self.classes)
        for name, manifest in request.classes.items():
            device_class = carried_class(manifest)
            if device_class is None:
                classes.pop(name, None)
            else:
                classes[name] = device_class
        return classes

    def _to_decide(self, request: ClaimRequested) -> bool:
        if request.uid in self.released or request.uid in self.outside:
            return False
        state = self.decided.get(request.uid)
        if state is None:
            return True
        return state == "failed" and request.attempt > self.attempts.get(request.uid, 0)

    def _decide(self, request: ClaimRequested) -> list[Event]:
        claim = Claim(namespace=request.namespace, name=request.name, uid=request.uid, spec=request.spec)
        self.attempts[request.uid] = request.attempt
        classes = self.classes_for(request)
        reservation = self.reservations.get(request.uid)
        decision: Decision | None = None
        if reservation is not None:
            # A preemptor is placed on the node reserved for it, or waits for it to be freed
            decision = self.fleet.decide_on(reservation.node, claim, classes, self.policy)
        reserved = decision is not None
        if decision is None:
            decision = self.fleet.allocate(claim, classes, self.policy, fenced=self._fenced_for(request))
        if not isinstance(decision, Allocated):
            self.decided[request.uid] = "failed"
            preempting: list[Event] = []
            if decision.cause == "capacity":
                preempting, decision = self._preempt(request, claim, classes, decision)
            standing = self.reservations.get(request.uid)
            return [
                *preempting,
                ClaimFailed(
                    key=request.key,
                    event_id=numbered_id(request.uid, "failed", attempt=request.attempt),
                    producer=self.producer,
                    namespace=request.namespace,
                    name=request.name,
                    uid=request.uid,
                    reason=decision.reason,
                    positions=dict(self.positions),
                    attempt=request.attempt,
                    cause=decision.cause,
                    reserved_node=standing.node if standing is not None else "",
                ),
            ]
        return self._allocated(request, decision, adopt=reserved, classes=classes)

    def _allocated(
        self,
        request: ClaimRequested,
        decision: Allocated,
        *,
        adopt: bool,
        classes: Mapping[str, DeviceClass],
    ) -> list[Event]:
        """The claim's allocation and the partition commands it waits for; with `adopt`, a decision
        made in a trial fleet is held in the fleet now, exactly as a replay of it holds it."""
        self.decided[request.uid] = "allocated"
        self.reservations.pop(request.uid, None)
        # Numbered as the node numbers its own commands for the claim (in Kubernetes it sends them
        # when kubelet prepares): the two are one command, stored once and run once.
        commands = [
            self._command(
                request.uid,
                decision.node,
                plan,
                plan.action,
                self.slot_attempts.current(request.uid, plan.gpu_uuid, plan.placement.start),
            )
            for plan in decision.partitions
        ]
        by_slot: dict[tuple[int, MigPlacement | None], str] = {}
        for command in commands:
            self._note_command(request.uid, command.command_id, command.key)
            # A whole GPU's device has no placement: its disable-mig command is found by GPU alone.
            slot = None if command.action == "disable-mig" else command.placement
            by_slot[(command.gpu_index, slot)] = command.command_id
        devices = [
            msgspec.structs.replace(d, partition_command=by_slot[(d.gpu_index, d.placement)])
            if (d.gpu_index, d.placement) in by_slot
            else d
            for d in decision.devices
        ]
        if adopt:
            self.fleet.adopt(
                Allocated(claim_uid=request.uid, node=decision.node, devices=devices, config=decision.config)
            )
            self.fleet.note_demand(claim_of(request), classes)
        elif by_slot:
            self.fleet.name_devices(request.uid, devices)
        self._join_domain(request.uid, decision.config)
        allocated = ClaimAllocated(
            key=request.key,
            event_id=numbered_id(request.uid, "allocated", attempt=request.attempt),
            producer=self.producer,
            namespace=request.namespace,
            name=request.name,
            uid=request.uid,
            node=decision.node,
            devices=devices,
            partitions=[c.command_id for c in commands],
            config=decision.config,
            positions=dict(self.positions),
            attempt=request.attempt,
        )
        # The partition commands go first: the cdi service waits on them once it sees the allocation.
        return [*commands, allocated]

    def _failed_inside(self, request: ClaimRequested, error: Exception) -> list[Event]:
        """The claim fails with what went wrong, and the ledger holds nothing for it."""
        self.fleet.release(request.uid, destroy_mig=False)
        self.fleet.uncount(request.uid)  # a failure inside is not demand, as a rebuild reads it
        self._drop_commands(request.uid)
        self.decided[request.uid] = "failed"
        return [
            ClaimFailed(
                key=request.key,
                event_id=derived_id(request.uid, "failed", "internal", request.attempt),
                producer=self.producer,
                namespace=request.namespace,
                name=request.name,
                uid=request.uid,
                reason=internal_failure(error),
                positions=dict(self.positions),
                attempt=request.attempt,
                cause="internal",
            )
        ]

    def _adopt(self, event: ClaimAllocated) -> None:
        self.decided[event.uid] = "allocated"
        self.attempts[event.uid] = max(self.attempts.get(event.uid, 0), event.attempt)
        self.claims[event.uid] = (event.namespace, event.name)
        for command_id in event.partitions:
            self._note_command(event.uid, command_id, subject_token(event.node))
        if event.uid not in self.released:
            self.fleet.adopt(
                Allocated(claim_uid=event.uid, node=event.node, devices=event.devices, config=event.config)
            )
            self._join_domain(event.uid, event.config)

    def _adopt_allocation(
        self, request: ClaimRequested, allocation: dict[str, Any], *, live: bool
    ) -> list[Event]:
        """A claim another writer (kube-scheduler) allocated: its devices are held from now on.

        When the allocator had decided the same claim differently (both wrote at once; the API
        server kept the other), its own decision is released first: its MIG creates are undone.
        The allocator's own allocation read back from the API server changes nothing.
        """
        uid = request.uid
        if uid in self.released or uid in self.outside:
            return []
        node, devices = _allocated_devices(allocation, self.fleet.driver)
        if node is None:
            return []
        ours = self.fleet.allocation(uid)
        outputs: list[Event] = []
        if self.decided.get(uid) == "allocated" and ours is not None:
            if ours.node == node and sorted(d.device for d in ours.devices) == sorted(d for _, d in devices):
                return []
            if live:
                outputs = self._release(uid)
            else:
                self.fleet.release_replayed(uid)
        for holder in self._holders(node, devices, besides=uid):
            # The API server holds theirs: a claim this allocator decided with the same device
            # (its allocation not written yet, or written over theirs) is decided again.
            outputs += self._fail_after_conflict(holder, request, live=live)
        self.decided.pop(uid, None)
        self.outside[uid] = node
        taken_twice = self.fleet.adopt_prepared(
            uid, node, devices, allocation_shares(allocation, uid, self.fleet.driver)
        )
        self.conflicts.extend(
            f"device {name} of node {node}: allocated to claim {request.namespace}/{request.name} "
            f"({uid}) by another writer while another claim holds it"
            for name in taken_twice
        )
        return outputs

    def _holders(self, node_name: str, devices: list[tuple[str, str]], *, besides: str) -> list[str]:
        """Claims this allocator decided that hold any of `devices` of the node."""
        node = self.fleet.node(node_name)
        if node is None:
            return []
        found: list[str] = []
        for _, name in devices:
            index = node.shape.index_by_name.get(name)
            holder = node.allocated.get(index) if index is not None else None
            if (
                holder is not None
                and holder != besides
                and holder not in found
                and holder not in self.outside
                and self.decided.get(holder) == "allocated"
            ):
                found.append(holder)
        return found

    def _fail_after_conflict(self, uid: str, other: ClaimRequested, *, live: bool) -> list[Event]:
        """Another writer allocated a device of this claim first: the claim is freed and failed, to
        be asked again (a later attempt) by the claim source."""
        self.decided[uid] = "failed"
        namespace, name = self.claims.get(uid, ("", ""))
        attempt = self.attempts.get(uid, 0)
        failed = ClaimFailed(
            key=uid,
            event_id=derived_id(uid, "failed-after-conflict", attempt),
            producer=self.producer,
            namespace=namespace,
            name=name,
            uid=uid,
            reason=(
                f"a device of this claim was allocated first to claim {other.namespace}/{other.name} "
                "by another writer; the claim is decided again"
            ),
            attempt=attempt,
        )
        self._leave_domain(uid)
        if not live:
            self.fleet.release_replayed(uid)
            return [failed]
        return [*self._release(uid), failed]

    def _adopt_prepared(self, event: ClaimPrepared) -> None:
        """A claim this allocator never decided was prepared: its devices are taken from now on."""
        if event.uid in self.decided or event.uid in self.outside:
            return
        self.outside[event.uid] = event.node
        self.claims[event.uid] = (event.namespace, event.name)
        taken_twice = self.fleet.adopt_prepared(
            event.uid, event.node, [(d.request, d.device) for d in event.devices if d.pool == event.node]
        )
        self.conflicts.extend(
            f"device {name} of node {event.node}: prepared for claim {event.namespace}/{event.name} "
            f"({event.uid}) while another claim holds it"
            for name in taken_twice
        )

    def _fail_after_partition(self, uid: str, failure: PartitionFailed) -> list[Event]:
        destroy = self._release(uid)
        self._leave_domain(uid)
        self.decided[uid] = "failed"
        namespace, name = self.claims.get(uid, ("", ""))
        attempt = self.attempts.get(uid, 0)
        return [
            *destroy,
            ClaimFailed(
                key=uid,
                event_id=numbered_id(uid, "failed-after-partition", attempt=attempt),
                producer=self.producer,
                namespace=namespace,
                name=name,
                uid=uid,
                reason=_partition_failure_reason(failure),
                attempt=attempt,
            ),
        ]


def _partition_failure_reason(failure: PartitionFailed) -> str:
    if failure.action == "disable-mig":
        return (
            f"GPU {failure.gpu_uuid} of node {failure.node} could not leave MIG mode for a whole-GPU "
            f"claim: {failure.reason}"
        )
    last = failure.placement.start + failure.placement.size - 1
    return (
        f"MIG instance {failure.profile} at slices {failure.placement.start}..{last} on GPU "
        f"{failure.gpu_uuid} of node {failure.node} could not be created: {failure.reason}"
    )


def _allocated_devices(allocation: dict[str, Any], driver: str) -> tuple[str | None, list[tuple[str, str]]]:
    """The node and the (request, device) of `driver` in a status.allocation (Tangram's pools are
    named after their nodes); no node when it holds none of the driver's devices."""
    devices = allocation.get("devices") if isinstance(allocation, dict) else None
    results = devices.get("results") if isinstance(devices, dict) else None
    node: str | None = None
    found: list[tuple[str, str]] = []
    for entry in results if isinstance(results, list) else []:
        if not isinstance(entry, dict) or entry.get("driver") != driver:
            continue
        pool, request, device = entry.get("pool"), entry.get("request"), entry.get("device")
        if not (isinstance(pool, str) and isinstance(request, str) and isinstance(device, str)):
            continue
        if node is None:
            node = pool
        if pool == node:
            found.append((request, device))
    return node, found
