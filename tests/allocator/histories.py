"""A live allocator driven through a random history, with the log its streams would hold: claims
asked, asked again and released, partition commands answered or refused, claims prepared outside it.

`run` records, at every step, what the allocator read and where each stream's log stood, so that
a test can cut the log anywhere, rebuild or restore a ledger there and go on with the same inputs.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import msgspec

from tangram.allocation import FleetState
from tangram.allocation.image import LedgerImage, restored_ledger
from tangram.allocation.ledger import Ledger
from tangram.eventlog.rebuild import fold_read
from tangram.events import (
    CLAIMS_STREAM,
    INVENTORY_STREAM,
    NODES_STREAM,
    ClaimAllocated,
    ClaimFailed,
    ClaimPreempting,
    ClaimPrepared,
    ClaimReleased,
    ClaimRequested,
    ClaimUnprepared,
    Event,
    GangMember,
    PartitionApplied,
    PartitionFailed,
    PartitionRequested,
    PreparedDevice,
)
from tangram.events.deletions import DeletedClaims

from .helpers import CLASSES, applied, gpus, inventory, mig, request

INVENTORIES = [
    inventory("hgx-h200", "n-hgx"),
    inventory("h100-nvl-4x2", "n-nvl"),
    inventory("l40s-8", "n-l40s"),
]
SPECS = [gpus(1), gpus(2), gpus(4), gpus(8), mig("1g.18gb"), mig("2g.35gb"), mig("3g.71gb"), mig("1g.12gb")]
SPEC_WEIGHTS = (6, 3, 2, 1, 8, 4, 3, 2)
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
# The claim source's clock moves a minute with each of its events, and a deleted claim is forgotten
# ten minutes after its release: long histories forget claims, and ask and release others between.
TICK = timedelta(minutes=1)
FORGET_AFTER = timedelta(minutes=10)


def untimed(events: list[Event]) -> list[Event]:
    """Events without their publication time, the one field that is not a decision."""
    return [msgspec.structs.replace(e, time=EPOCH) for e in events]


def fresh_fleet() -> FleetState:
    """A fleet with the inventory stream folded whole, as a rebuild folds it first."""
    fleet = FleetState()
    for event in INVENTORIES:
        fleet.apply_inventory(event.hardware)
    return fleet


def fresh_ledger() -> Ledger:
    book = Ledger(fleet=FleetState(), classes=CLASSES, deleted=DeletedClaims(FORGET_AFTER))
    for seq, event in enumerate(INVENTORIES, 1):
        book.folded(INVENTORY_STREAM, seq)
        book.apply(event, live=False)
    return book


def restored_from(image: LedgerImage) -> Ledger:
    """The ledger of the image over the inventories, forgetting deleted claims as fresh_ledger's."""
    return restored_ledger(image, fleet=fresh_fleet(), classes=CLASSES, forget_after=FORGET_AFTER)


def fold_in_order(
    book: Ledger, claims: list[Event], nodes: list[Event], *, starts: tuple[int, int] = (1, 1)
) -> None:
    """Fold stretches of the claims and nodes streams (their first events at `starts`) in the
    rebuild's order: each decision after the node results it was made having read, then the rest."""
    asyncio.run(fold_read(book, enumerate(claims, starts[0]), enumerate(nodes, starts[1])))


def replayed(claims: list[Event], nodes: list[Event]) -> Ledger:
    """The ledger a rebuild folds from the whole log: inventories, then claims and node results in
    the rebuild's order (`fold_in_order`)."""
    book = fresh_ledger()
    fold_in_order(book, claims, nodes)
    return book


@dataclass
class Run:
    """What the live allocator read, in order, as (stream, sequence in it, event); and after each
    input, how long each stream's log was (mark i: after i inputs)."""

    inputs: list[tuple[str, int, Event]] = field(default_factory=list)
    claims: list[Event] = field(default_factory=list)  # the claims stream's log
    nodes: list[Event] = field(default_factory=list)  # the results and prepares of the nodes stream
    marks: list[tuple[int, int]] = field(default_factory=lambda: [(0, 0)])
    outputs: list[list[Event]] = field(default_factory=list)  # what the allocator made of each input


def uid_of(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


class Driver:
    """Chooses each next input from what the live allocator has done so far."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.live = fresh_ledger()
        self.run = Run()
        self.asked: dict[str, ClaimRequested] = {}  # uid -> its last request
        self.released: list[str] = []
        self.pending: dict[str, PartitionRequested] = {}  # command id -> command not answered
        self.outside: list[ClaimPrepared] = []
        self.next = 0
        self.instances = 0
        self.clock = EPOCH

    def step(self) -> None:
        rng = self.rng
        choice = rng.choices(
            ["ask", "release", "answer", "again", "redeliver", "gang", "prepared", "unprepared"],
            weights=(10, 5, 7, 2, 1, 1, 1, 1),
        )[0]
        if choice == "release" and self.asked:
            uid = rng.choice(sorted(self.asked))
            ask = self.asked.pop(uid)
            self.released.append(uid)
            self.read(CLAIMS_STREAM, ClaimReleased(
                key=uid, namespace=ask.namespace, name=ask.name, uid=uid, deleted=_deleted(uid)
            ))  # fmt: skip
        elif choice == "answer" and self.pending:
            command = self.pending.pop(rng.choice(sorted(self.pending)))
            self.read(NODES_STREAM, self.answer(command))
        elif choice == "again" and self.asked:
            # asked again with a later attempt (capacity was freed), or a failed claim's redelivery
            ask = self.asked[rng.choice(sorted(self.asked))]
            later = msgspec.structs.replace(ask, attempt=ask.attempt + rng.randint(0, 1))
            self.asked[ask.uid] = later
            self.read(CLAIMS_STREAM, later)
        elif choice == "redeliver" and self.released:
            uid = rng.choice(self.released)
            self.read(CLAIMS_STREAM, ClaimReleased(
                key=uid, namespace="team", name=f"claim-{uid[-4:]}", uid=uid, deleted=_deleted(uid)
            ))  # fmt: skip
        elif choice == "gang":
            self.gang()
        elif choice == "prepared":
            self.prepared()
        elif choice == "unprepared" and self.outside:
            # its pod gone, the node unprepares the claim; the claim is deallocated after (a release
            # of a prepared claim before its unprepare is not something Kubernetes does)
            prepared = self.outside.pop(rng.randrange(len(self.outside)))
            self.read(NODES_STREAM, ClaimUnprepared(
                key=prepared.key, node=prepared.node, namespace=prepared.namespace,
                name=prepared.name, uid=prepared.uid,
            ))  # fmt: skip
            if rng.random() < 0.5:
                self.read(CLAIMS_STREAM, ClaimReleased(
                    key=prepared.uid, namespace=prepared.namespace, name=prepared.name, uid=prepared.uid
                ))  # fmt: skip
        else:
            self.ask()

    def ask(self) -> None:
        n = self.take()
        ask = request(n, self.rng.choices(SPECS, weights=SPEC_WEIGHTS)[0])
        priority = self.rng.choices([0, 1, 2], weights=(8, 1, 1))[0]
        ask = msgspec.structs.replace(ask, priority=priority)
        self.asked[ask.uid] = ask
        self.read(CLAIMS_STREAM, ask)

    def gang(self) -> None:
        group = f"group-{self.next}"
        size = self.rng.randint(2, 3)
        count = self.rng.choice([1, 2, 4])
        for _ in range(size):
            n = self.take()
            gang = GangMember(group=group, size=size, pod=f"{group}-pod-{n}")
            ask = msgspec.structs.replace(request(n, gpus(count)), gang=gang)
            self.asked[ask.uid] = ask
            self.read(CLAIMS_STREAM, ask)

    def prepared(self) -> None:
        """A claim kube-scheduler allocated, learned when its node prepared it (its device may be
        one the allocator holds: two deciders at once)."""
        n = self.take()
        node = self.rng.choice(INVENTORIES).hardware.node
        device = f"gpu-{self.rng.randrange(4)}"
        uid = uid_of(n)
        prepared = ClaimPrepared(
            key=node, node=node, namespace="outside", name=f"claim-{n}", uid=uid,
            devices=[PreparedDevice(request="gpus", pool=node, device=device, cdi_device_ids=[])],
        )  # fmt: skip
        self.outside.append(prepared)
        self.read(NODES_STREAM, prepared)

    def answer(self, command: PartitionRequested) -> PartitionApplied | PartitionFailed:
        if self.rng.random() < 0.2:
            return PartitionFailed(
                key=command.key, command_id=command.command_id, node=command.node, action=command.action,
                gpu_uuid=command.gpu_uuid, profile=command.profile, placement=command.placement,
                claim_uid=command.claim_uid, reason="refused",
            )  # fmt: skip
        if command.action == "create":
            self.instances += 1
            return applied(command, f"MIG-{self.instances:08d}")
        return applied(command, command.mig_uuid)

    def take(self) -> int:
        self.next += 1
        return self.next

    def read(self, stream: str, event: Event) -> None:
        run = self.run
        if isinstance(event, ClaimRequested | ClaimReleased):
            self.clock += TICK
            event = msgspec.structs.replace(event, time=self.clock)
        log = run.claims if stream == CLAIMS_STREAM else run.nodes
        log.append(event)
        run.inputs.append((stream, len(log), event))
        self.live.folded(stream, len(log))
        outputs = self.live.apply(event)
        run.outputs.append(outputs)
        for output in outputs:
            if isinstance(output, PartitionRequested):
                self.pending[output.command_id] = output
            elif isinstance(output, ClaimAllocated | ClaimFailed | ClaimPreempting):
                run.claims.append(output)
        run.marks.append((len(run.claims), len(run.nodes)))


def _deleted(uid: str) -> bool:
    """Every other claim is deleted when released (the rest only deallocated), chosen without the
    random stream so that a seed's history stays the one it was."""
    return int(uid[-1]) % 2 == 0


def commands_and_decisions(outputs: list[Event]) -> tuple[list[tuple[str, str, str]], list[Event]]:
    """The commands by what makes them one command (their id, stored and run once), and the rest
    as they are. A destroy sent again for an instance the claim found on its node, made by no
    create, names no instance after a rebuild: the inventory read then may show another there."""
    commands = [(c.command_id, c.action, c.node) for c in outputs if isinstance(c, PartitionRequested)]
    return commands, untimed([e for e in outputs if not isinstance(e, PartitionRequested)])
