"""The ledger's partition commands (pure): the creates, disable-migs and destroys a claim's
decision and release send to its node, numbered as the node numbers them, and which node results
answer them.

`Ledger` folds them in with the rest of its state; they live here so that the fold reads as one
thing, and what commands add to it as another (as `reserving` does for preemption).
"""

from __future__ import annotations

import msgspec

from tangram.allocation.fleet import FleetState
from tangram.allocation.model import Allocated, PartitionPlan, Release
from tangram.events import (
    Event,
    InvalidKey,
    PartitionApplied,
    PartitionFailed,
    PartitionRequested,
    subject_token,
)
from tangram.events.attempts import SlotAttempts
from tangram.events.ids import command_event_id, partition_command_id


class Commanding:
    """What the ledger's partition commands read and keep; `Ledger` holds each of these as a field."""

    fleet: FleetState
    producer: str
    positions: dict[str, int]
    decided: dict[str, str]
    released: set[str]
    commands: dict[str, str]  # create command id -> claim uid
    command_nodes: dict[str, str]  # create command id -> the node (subject token) it was sent to
    created: dict[str, str]  # create command id -> MIG device UUID
    unanswered_destroys: dict[str, dict[str, PartitionRequested]]  # uid -> command id -> destroy
    _destroy_claims: dict[str, str]  # destroy command id -> claim uid
    _destroys_at: dict[tuple[str, str, int], set[str]]  # (node, GPU uuid, start) -> destroys there
    slot_attempts: SlotAttempts
    _commands_of: dict[str, list[str]]  # claim uid -> its create commands

    def _note_command(self, uid: str, command_id: str, node: str) -> None:
        """The claim's create (or disable-mig) command, sent to `node` (its subject token)."""
        if self.commands.get(command_id) != uid:
            self.commands[command_id] = uid
            self._commands_of.setdefault(uid, []).append(command_id)
        self.command_nodes[command_id] = node

    def _drop_commands(self, uid: str) -> None:
        """Forget the claim's create commands: no result of one changes anything any more."""
        for command_id in self._commands_of.pop(uid, ()):
            self.commands.pop(command_id, None)
            self.command_nodes.pop(command_id, None)
            self.created.pop(command_id, None)

    def unanswered(self, result: PartitionApplied | PartitionFailed) -> str | None:
        """Why a create or disable-mig result is not to be believed; None when it may be.

        Only results of commands this allocator sent to that node change a claim: a node cannot
        fail, or name the instance of, another node's claim by quoting its command id or claim uid.
        A node also commands its own partitioner, for claims kube-scheduler allocated: the results
        of those name a claim this allocator never decided and change nothing here. Destroy
        results speak of the node's own instances only (the subject names the node), so any the
        node sends is taken.
        """
        if result.action == "destroy" or self._answers(result):
            return None
        sent_to = self.command_nodes.get(result.command_id)
        if sent_to is None:
            if result.claim_uid not in self.decided:
                return None  # the node's own command, for a claim decided outside the allocator
            held = self.fleet.allocation(result.claim_uid)
            if result.action == "disable-mig" and held is not None and held.node == result.node:
                # The node prepares what the allocator wrote to the claim, and takes a whole GPU
                # out of MIG mode whether or not the allocator's inventory showed it in: harmless.
                return None
            return f"{result.action} result for command {result.command_id!r}, which was never sent"
        return (
            f"{result.action} result from node {result.node!r} for command {result.command_id!r}, "
            f"which was sent to node {sent_to!r}"
        )

    def _answers(self, result: PartitionApplied | PartitionFailed) -> bool:
        """The result answers a command this allocator sent to the node that ran it."""
        sent_to = self.command_nodes.get(result.command_id)
        return sent_to is not None and sent_to == token_or_none(result.node)

    def _command(
        self, uid: str, node: str, plan: PartitionPlan, action: str, attempt: int
    ) -> PartitionRequested:
        command_id = partition_command_id(
            uid,
            action,
            gpu_index=plan.gpu_index,
            profile_id=plan.profile_id,
            start=plan.placement.start,
            attempt=attempt,
        )
        return PartitionRequested(
            key=subject_token(node),
            event_id=command_event_id(command_id),
            producer=self.producer,
            command_id=command_id,
            node=node,
            action="create"
            if action == "create"
            else "disable-mig"
            if action == "disable-mig"
            else "destroy",
            gpu_uuid=plan.gpu_uuid,
            gpu_index=plan.gpu_index,
            profile=plan.profile,
            profile_id=plan.profile_id,
            placement=plan.placement,
            claim_uid=uid,
            mig_uuid=plan.mig_uuid,
            positions=dict(self.positions),
        )

    def _release(self, uid: str, *, replayed: bool = False) -> list[Event]:
        """Free the claim's devices; the destroys of its instances, remembered until answered (read
        back from the log, the ones its release sent then)."""
        held = self.fleet.allocation(uid)
        release = self.fleet.release_replayed(uid) if replayed else self.fleet.release(uid)
        return list(self._expect_destroys(uid, held, release))

    def _expect_destroys(
        self, uid: str, held: Allocated | None, release: Release
    ) -> list[PartitionRequested]:
        """The release's destroy commands, remembered until a result answers each."""
        if release.node is None or not release.destroy:
            return []
        creates = {
            (d.gpu_index, d.placement.start): d.partition_command
            for d in (held.devices if held is not None else ())
            if d.placement is not None and d.partition_command
        }
        commands = []
        for plan in release.destroy:
            create = creates.get((plan.gpu_index, plan.placement.start), "")
            # The attempt the instance's create was made with (the node numbers the destroy so too):
            # a rebuild may read a release before the results that moved the count on since.
            attempt = self.slot_attempts.of_create(
                uid,
                create,
                gpu_index=plan.gpu_index,
                gpu_uuid=plan.gpu_uuid,
                profile_id=plan.profile_id,
                start=plan.placement.start,
            )
            commands.append(
                self._command(uid, release.node, self._instance_of(plan, create), "destroy", attempt)
            )
        pending = self.unanswered_destroys.setdefault(uid, {})
        for command in commands:
            pending[command.command_id] = command
            self._destroy_claims[command.command_id] = uid
            self._destroys_at.setdefault(
                (command.node, command.gpu_uuid, command.placement.start), set()
            ).add(command.command_id)
        return commands

    def _destroy_answered(self, command_id: str, slot: tuple[str, str, int]) -> bool:
        """Forget the answered destroy; whether no other destroy is still to come at its placement."""
        uid = self._destroy_claims.pop(command_id, None)
        if uid is not None:
            pending = self.unanswered_destroys.get(uid, {})
            pending.pop(command_id, None)
            if not pending:
                self.unanswered_destroys.pop(uid, None)
        waiting = self._destroys_at.get(slot)
        if waiting is None:
            return True
        waiting.discard(command_id)
        if waiting:
            return False
        del self._destroys_at[slot]
        return True

    def _instance_of(self, plan: PartitionPlan, create: str) -> PartitionPlan:
        """Name the instance the claim's own create produced, never one seen at that placement before.

        A placement is reused as claims come and go, so an inventory read may still show the
        previous instance there. Without a create result yet, the UUID is left empty and the
        partitioner destroys the instance it created for this claim at that placement.
        """
        if create in self.commands:
            return msgspec.structs.replace(plan, mig_uuid=self.created.get(create, ""))
        return plan

    def _count_closed(self, result: PartitionApplied | PartitionFailed) -> None:
        """Count an attempt the node closed, as the node counts it: only of its own GPUs."""
        node = self.fleet.node(result.node)
        if node is not None and result.gpu_uuid in node.gpu_uuid.values():
            self.slot_attempts.observe(result)

    def _waits_on(self, uid: str, command_id: str) -> bool:
        """The claim's allocation standing now waits on this command. A rebuild may fold the nodes'
        results after later claim events (up to the next decision's recorded positions), so the
        failure of a create made for an earlier allocation of the claim can come after the
        allocation decided once that failure was known."""
        if self.decided.get(uid) != "allocated" or uid in self.released:
            return False
        held = self.fleet.allocation(uid)
        return held is not None and any(d.partition_command == command_id for d in held.devices)


def token_or_none(node: str) -> str | None:
    try:
        return subject_token(node)
    except InvalidKey:
        return None
