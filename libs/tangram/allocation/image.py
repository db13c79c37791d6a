"""The ledger's state as explicit data, a ledger image: pure, no I/O.

A rebuild folds the allocator's whole log. With an image of the ledger taken at a point of the log,
a rebuild restores the image and folds only what came after it, and must end where the whole fold
ends: so the image holds everything the ledger's later decisions read, not only what its snapshot
shows. Nothing is pickled: the state holds compiled CEL programs that cannot be, and a pickle read
back would run code. What cannot be data is stored as what derives it again: a claim kind of the
demand mix as its request (its selectors compiled again), a device class not at all (the ledger
is restored with its classes, as a rebuild is built with them).

What is derived from these (node availability, buckets, the demand index's supply and caches,
share hosts) is rebuilt by the fleet from the holds, as a replay rebuilds it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Annotated

import msgspec

from tangram.allocation.demand import ClaimKind, DemandSaved, alternative_kind
from tangram.allocation.fleet import FleetState
from tangram.allocation.ledger import Ledger
from tangram.allocation.model import Allocated, Policy
from tangram.allocation.requests import Alternative
from tangram.allocation.reserving import GangHold, Reservation
from tangram.allocation.spec import DeviceClass, DeviceToleration
from tangram.cel import CelError, compile_selector
from tangram.dra.imex import ImexChannel
from tangram.events import ClaimRequested, PartitionRequested
from tangram.events.attempts import SlotAttempts
from tangram.events.deletions import FORGET_DELETED_AFTER, DeletedClaims


class ImageError(ValueError):
    """A ledger image that cannot be made, read or restored; the message says why."""


class _Image(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class TolerationImage(_Image, frozen=True, kw_only=True, forbid_unknown_fields=True):
    key: str
    operator: str
    value: str
    effect: str
    toleration_seconds: int | None


class KindImage(_Image, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A claim kind of the demand mix: the request it stands for, and its decayed count."""

    result_name: str
    request: str
    class_name: str
    selectors: list[tuple[str, str]]  # (where it comes from, CEL expression), class first
    all_mode: bool
    count: int
    admin: bool
    tolerations: list[TolerationImage]
    capacity: list[tuple[str, int]]
    node_scoped: bool
    nvlink: bool
    min_bandwidth_gbps: float
    # The kind's order (the repr of its key): the kind derived again must be the same kind, or the
    # sums over kinds would run in another order and the weights would differ.
    order: str
    value: float | None  # scaled, as Demand keeps it; None: never noted


class DemandImage(_Image, frozen=True, kw_only=True, forbid_unknown_fields=True):
    growth: float
    ticks: int
    kinds: list[KindImage]  # the kinds claims brought, in the order they came (the prior is code)


class HeldImage(_Image, frozen=True, kw_only=True, forbid_unknown_fields=True):
    decision: Allocated
    devices: list[str]  # the device names the claim takes on its node


class FleetImage(_Image, frozen=True, kw_only=True, forbid_unknown_fields=True):
    held: list[HeldImage]  # in the order the claims were held
    made: list[tuple[str, int, int, int]]  # MIG instances Tangram created: (node, GPU, profile id, start)
    noted: list[str]  # claims counted in the demand mix
    destroyed: dict[str, list[str]]  # node -> MIG instances destroyed, oldest first
    destroying: dict[str, list[tuple[int, int, int]]]  # node -> (GPU, profile id, start) on their way out
    # claim uid -> (request, device) it was prepared on while another claim held them (Holdings)
    contested: dict[str, list[tuple[str, str]]]
    demand: DemandImage


class ReservationImage(_Image, frozen=True, kw_only=True, forbid_unknown_fields=True):
    node: str
    priority: int
    victims: list[str]


class GangImage(_Image, frozen=True, kw_only=True, forbid_unknown_fields=True):
    namespace: str
    group: str
    members: dict[str, ClaimRequested]


class GangHoldImage(_Image, frozen=True, kw_only=True, forbid_unknown_fields=True):
    namespace: str
    group: str
    nodes: list[str]
    priority: int


class ChannelImage(_Image, frozen=True, kw_only=True, forbid_unknown_fields=True):
    domain: str
    clique: str
    channel: int
    nodes: list[str]


class DestroysAtImage(_Image, frozen=True, kw_only=True, forbid_unknown_fields=True):
    node: str
    gpu_uuid: str
    start: int
    commands: list[str]


class SlotAttemptsImage(_Image, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The attempts the nodes closed for a claim on one MIG slot: the attempt its next create,
    disable-mig or destroy there is numbered by (events.attempts)."""

    claim_uid: str
    gpu_uuid: str
    start: int
    closed: Annotated[int, msgspec.Meta(ge=1)]


class LogMark(_Image, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where an image stands in one stream: everything up to `sequence` is folded into it. The
    stream's creation time tells a stream deleted and made again (its sequences start over)."""

    sequence: Annotated[int, msgspec.Meta(ge=0)]
    created: str


class LedgerImage(_Image, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every field of `Ledger` that a fold changes, and the fleet's history (`FleetImage`)."""

    schema: str  # IMAGE_SCHEMA of the Tangram that wrote it
    log: dict[str, LogMark]  # stream -> how far the image has folded it (empty: not said)
    decided: dict[str, str]
    released: list[str]
    claims: dict[str, tuple[str, str]]
    commands: dict[str, str]
    command_nodes: dict[str, str]
    created: dict[str, str]
    positions: dict[str, int]
    outside: dict[str, str]
    conflicts: list[str]
    attempts: dict[str, int]
    unanswered_destroys: dict[str, dict[str, PartitionRequested]]
    destroy_claims: dict[str, str]
    destroys_at: list[DestroysAtImage]
    undecided: dict[str, ClaimRequested]
    priorities: dict[str, int]
    reservations: dict[str, ReservationImage]
    gangs: list[GangImage]
    domains: dict[str, ChannelImage]
    gang_holds: list[GangHoldImage]
    domain_members: dict[str, list[str]]
    slot_attempts: list[SlotAttemptsImage]  # in the order the slots were first closed
    forgetting: list[tuple[datetime, str]]  # deleted claims to forget: (release time, uid), in order
    fleet: FleetImage


# The digest of the image's shape: an image written by a Tangram whose image differs in any field,
# its own or an event's, is refused rather than read as something it is not.
IMAGE_SCHEMA = hashlib.sha256(
    msgspec.json.encode(msgspec.json.schema(LedgerImage), order="sorted")
).hexdigest()


class _Header(msgspec.Struct):
    schema: str


_encoder = msgspec.json.Encoder()  # dicts in their order: the ledger iterates some of them
_header = msgspec.json.Decoder(_Header)
_decoder = msgspec.json.Decoder(LedgerImage)


def encode_image(image: LedgerImage) -> bytes:
    try:
        return _encoder.encode(image)
    except (TypeError, ValueError, OverflowError) as error:
        raise ImageError(f"the ledger image cannot be written: {error}") from None


def decode_image(data: bytes) -> LedgerImage:
    """The image written by encode_image; ImageError (a ValueError) naming what is wrong otherwise."""
    try:
        header = _header.decode(data)
    except msgspec.DecodeError as error:
        raise ImageError(f"not a ledger image: {error}") from None
    if header.schema != IMAGE_SCHEMA:
        raise ImageError(
            f"a ledger image of schema {header.schema[:12]!r}, this allocator reads {IMAGE_SCHEMA[:12]!r}"
        )
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as error:
        raise ImageError(f"an invalid ledger image: {error}") from None


# --- taking the image ------------------------------------------------------------------------------


def image_of(ledger: Ledger, log: Mapping[str, LogMark] | None = None) -> LedgerImage:
    """The ledger's state as data, folded as far as `log` says; ImageError where some of it cannot
    be written as data."""
    return LedgerImage(
        schema=IMAGE_SCHEMA,
        log=dict(log or {}),
        decided=dict(ledger.decided),
        released=sorted(ledger.released),
        claims=dict(ledger.claims),
        commands=dict(ledger.commands),
        command_nodes=dict(ledger.command_nodes),
        created=dict(ledger.created),
        positions=dict(ledger.positions),
        outside=dict(ledger.outside),
        conflicts=list(ledger.conflicts),
        attempts=dict(ledger.attempts),
        unanswered_destroys={uid: dict(pending) for uid, pending in ledger.unanswered_destroys.items()},
        destroy_claims=dict(ledger._destroy_claims),
        destroys_at=[
            DestroysAtImage(node=node, gpu_uuid=gpu_uuid, start=start, commands=sorted(commands))
            for (node, gpu_uuid, start), commands in ledger._destroys_at.items()
        ],
        undecided=dict(ledger._undecided),
        priorities=dict(ledger.priorities),
        reservations={
            uid: ReservationImage(node=r.node, priority=r.priority, victims=list(r.victims))
            for uid, r in ledger.reservations.items()
        },
        gangs=[
            GangImage(namespace=namespace, group=group, members=dict(members))
            for (namespace, group), members in ledger.gangs.items()
        ],
        domains={
            domain: ChannelImage(domain=c.domain, clique=c.clique, channel=c.channel, nodes=list(c.nodes))
            for domain, c in ledger.domains.items()
        },
        gang_holds=[
            GangHoldImage(namespace=namespace, group=group, nodes=sorted(h.nodes), priority=h.priority)
            for (namespace, group), h in ledger.gang_holds.items()
        ],
        domain_members={domain: sorted(members) for domain, members in ledger._domain_members.items()},
        slot_attempts=[
            SlotAttemptsImage(claim_uid=uid, gpu_uuid=gpu_uuid, start=start, closed=closed)
            for (uid, gpu_uuid, start), closed in ledger.slot_attempts.saved()
        ],
        forgetting=ledger.deleted.saved(),
        fleet=_fleet_image(ledger.fleet),
    )


def _fleet_image(fleet: FleetState) -> FleetImage:
    # The fleet's history is private to it: read here, where it is written out, and nowhere else.
    # Its last decision's undo (FleetState.uncount) is left out: it is only taken back within the
    # fold of the event that made it, never across events, and an image is taken between events.
    held: list[HeldImage] = []
    for uid, hold in fleet._holdings.held.items():
        if hold.node != hold.decision.node or uid != hold.decision.claim_uid:
            raise ImageError(f"claim {uid} is held as another claim's decision: the fleet is inconsistent")
        held.append(HeldImage(decision=hold.decision, devices=list(hold.devices)))
    destroying = {
        name: sorted(node.destroying)
        for name in fleet.node_names
        if (node := fleet.node(name)) is not None and node.destroying
    }
    return FleetImage(
        held=held,
        made=sorted(fleet._holdings.made),
        noted=sorted(fleet._noted),
        destroyed={name: list(uuids) for name, uuids in fleet._destroyed.items()},
        destroying=destroying,
        contested={uid: list(devices) for uid, devices in fleet._holdings.contested.items()},
        demand=_demand_image(fleet._index.demand.saved()),
    )


def _demand_image(saved: DemandSaved) -> DemandImage:
    kinds: list[KindImage] = []
    numbers = [saved.growth, *saved.value.values()]
    if not all(math.isfinite(n) for n in numbers):
        raise ImageError("the demand mix holds a weight that is not a finite number")
    for key, kind in saved.kinds.items():
        if key[0] == "prior":
            continue  # the prior is the code's, never history
        if kind.alt is None:
            raise ImageError(f"demand kind {kind.label!r} names no request: it cannot be derived again")
        kinds.append(_kind_image(kind, kind.alt, saved.value.get(key)))
    unknown = set(saved.value) - {k for k, kind in saved.kinds.items() if kind.alt is not None}
    if unknown:
        raise ImageError(f"the demand mix counts {len(unknown)} kinds it does not know")
    return DemandImage(growth=saved.growth, ticks=saved.ticks, kinds=kinds)


def _kind_image(kind: ClaimKind, alt: Alternative, value: float | None) -> KindImage:
    return KindImage(
        result_name=alt.result_name,
        request=alt.request,
        class_name=alt.class_name,
        selectors=[(where, selector.expression) for where, selector in alt.selectors],
        all_mode=alt.all_mode,
        count=alt.count,
        admin=alt.admin,
        tolerations=[
            TolerationImage(
                key=t.key,
                operator=t.operator,
                value=t.value,
                effect=t.effect,
                toleration_seconds=t.tolerationSeconds,
            )
            for t in alt.tolerations
        ],
        capacity=list(alt.capacity),
        node_scoped=alt.node_scoped,
        nvlink=kind.nvlink,
        min_bandwidth_gbps=kind.min_bandwidth_gbps,
        order=kind.order,
        value=value,
    )


# --- restoring it ----------------------------------------------------------------------------------


def restored_ledger(
    image: LedgerImage,
    *,
    fleet: FleetState,
    classes: Mapping[str, DeviceClass],
    policy: Policy = "tangram",
    producer: str = "allocator",
    forget_after: timedelta = FORGET_DELETED_AFTER,
) -> Ledger:
    """The ledger the image was taken of, over `fleet`: a fleet holding nothing yet, with the
    nodes' current inventories applied (the rebuild folds the inventory stream whole first)."""
    if image.schema != IMAGE_SCHEMA:
        raise ImageError(f"a ledger image of schema {image.schema[:12]!r}, not {IMAGE_SCHEMA[:12]!r}")
    if fleet._holdings.held or fleet._noted:
        raise ImageError("an image is restored onto a fleet of inventories alone, and this one holds claims")
    try:
        domains = {
            domain: ImexChannel(domain=c.domain, clique=c.clique, channel=c.channel, nodes=tuple(c.nodes))
            for domain, c in image.domains.items()
        }
        _restore_fleet(fleet, image.fleet)
    except ImageError:
        raise
    except (ValueError, CelError) as error:
        raise ImageError(f"the ledger image cannot be restored: {error}") from None
    commands_of: dict[str, list[str]] = {}
    for command_id, uid in image.commands.items():
        commands_of.setdefault(uid, []).append(command_id)
    return Ledger(
        fleet=fleet,
        classes=classes,
        policy=policy,
        producer=producer,
        deleted=DeletedClaims(forget_after, image.forgetting),
        _commands_of=commands_of,
        decided=dict(image.decided),
        released=set(image.released),
        claims=dict(image.claims),
        commands=dict(image.commands),
        command_nodes=dict(image.command_nodes),
        created=dict(image.created),
        positions=dict(image.positions),
        outside=dict(image.outside),
        conflicts=list(image.conflicts),
        attempts=dict(image.attempts),
        unanswered_destroys={uid: dict(pending) for uid, pending in image.unanswered_destroys.items()},
        _destroy_claims=dict(image.destroy_claims),
        _destroys_at={(d.node, d.gpu_uuid, d.start): set(d.commands) for d in image.destroys_at},
        _undecided=dict(image.undecided),
        priorities=dict(image.priorities),
        reservations={
            uid: Reservation(node=r.node, priority=r.priority, victims=tuple(r.victims))
            for uid, r in image.reservations.items()
        },
        gangs={(g.namespace, g.group): dict(g.members) for g in image.gangs},
        domains=domains,
        gang_holds={
            (h.namespace, h.group): GangHold(nodes=frozenset(h.nodes), priority=h.priority)
            for h in image.gang_holds
        },
        _domain_members={domain: set(members) for domain, members in image.domain_members.items()},
        slot_attempts=SlotAttempts.restore(
            [((a.claim_uid, a.gpu_uuid, a.start), a.closed) for a in image.slot_attempts]
        ),
    )


def _restore_fleet(fleet: FleetState, image: FleetImage) -> None:
    for name, uuids in image.destroyed.items():
        fleet._destroyed[name] = dict.fromkeys(uuids)
    for name in fleet.node_names:
        node = fleet.node(name)
        gone = set(image.destroyed.get(name, ()))
        if node is None or not gone:
            continue
        # The instances its destroys' results removed, removed as the fold of them removed them:
        # from what the node holds, its inventory as read (which trials start from) left as it is.
        for gpu in node.hw.gpus:
            for instance in gpu.mig_instances:
                if instance.uuid in gone:
                    node.destroyed(gpu.uuid, instance.placement.start, instance.uuid, slot_freed=False)
        fleet._nodes.changed(name)
    for name, entries in image.destroying.items():
        node = fleet.node(name)
        if node is not None:
            node.set_destroying(set(entries))
            fleet._nodes.changed(name)
    for held in image.held:
        decision, devices = held.decision, tuple(held.devices)
        fleet._holdings.hold(decision, devices)
        node = fleet.node(decision.node)
        if node is not None:
            node.take_held(decision.claim_uid, decision.devices, devices)
            fleet._nodes.changed(node.name)
    fleet._holdings.made = set(image.made)
    fleet._holdings.contested = {uid: list(devices) for uid, devices in image.contested.items()}
    fleet._noted = set(image.noted)
    demand = fleet._index.demand
    kinds: dict[tuple[object, ...], ClaimKind] = dict(demand.kinds)
    value: dict[tuple[object, ...], float] = {}
    for entry in image.demand.kinds:
        kind = _kind(entry)
        if kind.key in kinds:
            raise ImageError(f"demand kind {kind.label!r} is in the image twice")
        kinds[kind.key] = kind
        if entry.value is not None:
            value[kind.key] = entry.value
    fleet._index.restore(DemandSaved(value, image.demand.growth, image.demand.ticks, kinds))


def _kind(entry: KindImage) -> ClaimKind:
    alt = Alternative(
        result_name=entry.result_name,
        request=entry.request,
        class_name=entry.class_name,
        selectors=tuple((where, compile_selector(expression)) for where, expression in entry.selectors),
        all_mode=entry.all_mode,
        count=entry.count,
        admin=entry.admin,
        tolerations=tuple(
            DeviceToleration.model_validate(
                {
                    "key": t.key,
                    "operator": t.operator,
                    "value": t.value,
                    "effect": t.effect,
                    "tolerationSeconds": t.toleration_seconds,
                }
            )
            for t in entry.tolerations
        ),
        capacity=tuple(entry.capacity),
        node_scoped=entry.node_scoped,
    )
    kind = alternative_kind(alt, entry.nvlink, entry.min_bandwidth_gbps)
    if kind.order != entry.order:
        raise ImageError(f"demand kind {kind.label!r} derives as {kind.order}, the image says {entry.order}")
    return kind
