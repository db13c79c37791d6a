"""Re-run the allocator's decisions over a log, offline, and compare them with what was recorded.

Pure: no I/O. The events are folded in the order they were stored (by time across the streams,
by sequence within one), through the same Ledger the allocator folds at start. Each claim request
is decided again; the recomputed decision is compared with the recorded one (status, node,
devices). When they differ, the recorded decision is adopted before going on, so that one
divergence is reported once instead of leaking into every later decision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import msgspec

from tangram import __version__
from tangram.allocation import DeviceClass, FleetState, Policy
from tangram.allocation.ledger import Ledger
from tangram.eventlog.records import LOG_STREAMS, EventLog, LogRecord
from tangram.events import (
    CLAIMS_STREAM,
    INVENTORY_STREAM,
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    ClaimRequested,
    Event,
    EventDecodeError,
    NodeInventory,
    PartitionFailed,
    PartitionRequested,
    admission,
    decode,
)
from tangram.events.positions import recorded_positions


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """A decision reduced to what replay compares."""

    status: str  # "allocated" | "failed" | "none" (no decision)
    node: str | None = None
    devices: list[str] = []
    reason: str | None = None

    @classmethod
    def of(cls, event: Event | None) -> Outcome:
        match event:
            case ClaimAllocated():
                return cls(status="allocated", node=event.node, devices=[d.device for d in event.devices])
            case ClaimFailed():
                return cls(status="failed", reason=event.reason)
            case _:
                return cls(status="none")


class Divergence(msgspec.Struct, frozen=True, kw_only=True):
    claim: str  # namespace/name
    uid: str
    request_seq: int  # sequence of the ClaimRequested in the claims stream
    recorded_seq: int | None  # sequence of the recorded decision, None when there is none
    differs: list[str]  # which of status, node, devices differ
    recorded: Outcome
    recomputed: Outcome


class ReplayReport(msgspec.Struct, kw_only=True):
    events: int
    undecodable: int  # bytes that decode to no event
    refused: int  # events their subject may not carry (as the live readers refuse them)
    claims_decided: int
    divergences: list[Divergence]
    recorded_version: str
    replayed_version: str = __version__

    @property
    def version_changed(self) -> bool:
        return self.recorded_version != self.replayed_version


@dataclass(frozen=True)
class Stored:
    record: LogRecord
    event: Event


@dataclass(frozen=True)
class OrderedLog:
    events: list[Stored]
    undecodable: list[LogRecord]
    refused: list[LogRecord]
    # Per claim uid and attempt, the first decision recorded (a later ClaimFailed is a failure
    # after it). A claim that failed is asked again with a later attempt once capacity frees.
    decisions: dict[tuple[str, int], Stored]

    def decision_of(self, uid: str, attempt: int = 0) -> Stored | None:
        return self.decisions.get((uid, attempt))


def ordered(log: EventLog) -> OrderedLog:
    """The log's events in the order they happened: stored time across streams, sequence within.

    The inventory stream keeps one value per node, stored whenever the node last changed: a node's
    first inventory in the log stands for its state from the beginning, later ones from their time.
    """
    rank = {name: position for position, name in enumerate(LOG_STREAMS)}
    decoded: list[Stored] = []
    undecodable: list[LogRecord] = []
    refused: list[LogRecord] = []
    for item in log.records:
        try:
            event = decode(item.body)
        except EventDecodeError:
            undecodable.append(item)
            continue
        # The allocator never believed an event its subject may not carry; neither does replay.
        if admission(item.subject, event) is None:
            decoded.append(Stored(item, event))
        else:
            refused.append(item)
    first_inventory: set[int] = set()
    seen_nodes: set[str] = set()
    for position, stored in enumerate(decoded):
        if isinstance(stored.event, NodeInventory) and stored.event.hardware.node not in seen_nodes:
            seen_nodes.add(stored.event.hardware.node)
            first_inventory.add(position)
    decoded_order = sorted(
        range(len(decoded)),
        key=lambda i: (
            i not in first_inventory,
            decoded[i].record.time,
            rank.get(decoded[i].record.stream, len(rank)),
            decoded[i].record.seq,
        ),
    )
    events = [decoded[i] for i in decoded_order]
    decisions: dict[tuple[str, int], Stored] = {}
    for stored in events:
        if isinstance(stored.event, ClaimAllocated | ClaimFailed):
            decisions.setdefault((stored.event.uid, stored.event.attempt), stored)
    return OrderedLog(events=events, undecodable=undecodable, refused=refused, decisions=decisions)


# Called with the ledger as it stood just before a claim request was decided again.
BeforeDecision = Callable[[Ledger, Stored], None]


def replay(
    log: EventLog,
    classes: Mapping[str, DeviceClass],
    policy: Policy = "tangram",
    *,
    before_decision: BeforeDecision | None = None,
) -> ReplayReport:
    events = ordered(log)
    ledger = Ledger(fleet=FleetState(), classes=classes, policy=policy, producer="replay")
    divergences: list[Divergence] = []
    decided = 0
    for stored in _fold(events, ledger):
        request = stored.event
        assert isinstance(request, ClaimRequested)
        if before_decision is not None:
            before_decision(ledger, stored)
        outputs = ledger.apply(request)
        recomputed = next((o for o in outputs if isinstance(o, ClaimAllocated | ClaimFailed)), None)
        if recomputed is None:
            continue  # decided before (a redelivered request): nothing new, as live
        decided += 1
        recorded = events.decision_of(request.uid, request.attempt)
        divergence = _compare(stored, recorded, recomputed)
        if divergence is None:
            continue
        divergences.append(divergence)
        _adopt_recorded(ledger, request.uid, recorded)
    return ReplayReport(
        events=len(events.events),
        undecodable=len(events.undecodable),
        refused=len(events.refused),
        claims_decided=decided,
        divergences=divergences,
        recorded_version=log.header.tangram_version,
    )


def _fold(events: OrderedLog, ledger: Ledger) -> Iterator[Stored]:
    """Folds every event the allocator folds; yields the claim requests for the caller to decide."""
    if any(recorded_positions(d.event) for d in events.decisions.values()):
        yield from _fold_by_positions(events, ledger)
        return
    for stored in events.events:
        event = stored.event
        if isinstance(event, ClaimRequested):
            yield stored
        elif not _is_recorded_decision(events, stored):
            # Partition commands and health are not the allocator's input; the Ledger ignores
            # them as the allocator's consumers never see them. Prepares are: they hold the
            # devices of claims kube-scheduler allocated, as live.
            ledger.apply(event, live=False)


def _fold_by_positions(events: OrderedLog, ledger: Ledger) -> Iterator[Stored]:
    """The claims stream in order; each other stream up to the position the allocator had read it
    to when it produced something: a decision, or the destroy commands of a release.

    The allocator reads inventories and partition results as they arrive, beside the claims, so
    their interleaving with claims is timing, and an inventory folded before or after a release
    leaves different instances marked as on their way out. What the allocator produced records
    how far it had read each stream; between two such records, what it folded commutes. When the
    log lacks part of the inventory stream's history (a plain export keeps only the last inventory
    per node), a node whose inventories all lie past every recorded position stands as its first
    one from the start.
    """
    lanes: dict[str, list[Stored]] = {}
    claims: list[Stored] = []
    # claim uid -> positions when its release was folded (recorded on its destroy commands)
    released_at: dict[str, dict[str, int]] = {}
    for stored in events.events:
        event = stored.event
        if stored.record.stream == CLAIMS_STREAM:
            claims.append(stored)
            continue
        lanes.setdefault(stored.record.stream, []).append(stored)
        if isinstance(event, PartitionRequested) and event.action == "destroy" and event.positions:
            at = released_at.setdefault(event.claim_uid, {})
            for stream, position in event.positions.items():
                at[stream] = max(at.get(stream, 0), position)
    for lane in lanes.values():
        lane.sort(key=lambda stored: stored.record.seq)
    claims.sort(key=lambda stored: stored.record.seq)
    recorded = [recorded_positions(d.event) for d in events.decisions.values()] + list(released_at.values())
    reached = {stream: max((p.get(stream, 0) for p in recorded), default=0) for stream in lanes}
    cursors = dict.fromkeys(lanes, 0)
    folded: set[tuple[str, int]] = set()

    def fold(stored: Stored) -> None:
        key = (stored.record.stream, stored.record.seq)
        if key in folded:
            return
        folded.add(key)
        event = stored.event
        if isinstance(event, PartitionFailed) and event.action != "destroy":
            # A failed create releases its claim, as a release does: same inventory before it.
            uid = ledger.commands.get(event.command_id)
            if uid is not None:
                advance(released_at.get(uid, {}), only=INVENTORY_STREAM)
        ledger.apply(event, live=False)

    def advance(positions: Mapping[str, int], *, only: str | None = None) -> None:
        for stream, position in positions.items():
            if stream not in lanes or (only is not None and stream != only):
                continue
            lane = lanes[stream]
            while cursors[stream] < len(lane) and lane[cursors[stream]].record.seq <= position:
                cursors[stream] += 1
                fold(lane[cursors[stream] - 1])

    inventories = lanes.get(INVENTORY_STREAM, [])
    if [stored.record.seq for stored in inventories] != list(range(1, len(inventories) + 1)):
        # Not the whole history of the inventory stream (a last-value stream keeps one per node)
        seen_nodes: set[str] = set()
        for stored in inventories:
            assert isinstance(stored.event, NodeInventory)
            node = stored.event.hardware.node
            if node not in seen_nodes:
                seen_nodes.add(node)
                if stored.record.seq > reached[INVENTORY_STREAM]:
                    fold(stored)
    for stored in claims:
        event = stored.event
        if isinstance(event, ClaimRequested):
            decision = events.decision_of(event.uid, event.attempt)
            advance(recorded_positions(decision.event) if decision else {})
            yield stored
        elif not _is_recorded_decision(events, stored):
            if isinstance(event, ClaimReleased):
                advance(released_at.get(event.uid, {}))
            ledger.apply(event, live=False)
    advance({stream: lane[-1].record.seq for stream, lane in lanes.items()})


def _is_recorded_decision(events: OrderedLog, stored: Stored) -> bool:
    """The recorded decision of a claim: compared (and adopted on divergence) at its request."""
    event = stored.event
    return (
        isinstance(event, ClaimAllocated | ClaimFailed)
        and events.decision_of(event.uid, event.attempt) is stored
    )


def _compare(request: Stored, recorded: Stored | None, recomputed: Event) -> Divergence | None:
    want = Outcome.of(recorded.event if recorded else None)
    got = Outcome.of(recomputed)
    differs = [
        name
        for name, a, b in (
            ("status", want.status, got.status),
            ("node", want.node, got.node),
            ("devices", want.devices, got.devices),
        )
        if a != b
    ]
    if not differs:
        return None
    event = request.event
    assert isinstance(event, ClaimRequested)
    return Divergence(
        claim=f"{event.namespace}/{event.name}",
        uid=event.uid,
        request_seq=request.record.seq,
        recorded_seq=recorded.record.seq if recorded else None,
        differs=differs,
        recorded=want,
        recomputed=got,
    )


def _adopt_recorded(ledger: Ledger, uid: str, recorded: Stored | None) -> None:
    """Undo the recomputed decision and take the recorded one, as a restarted allocator would."""
    ledger.fleet.release(uid, destroy_mig=False)
    ledger.decided.pop(uid, None)
    if recorded is not None:
        ledger.apply(recorded.event, live=False)
