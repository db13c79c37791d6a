"""A failed claim asked again once capacity frees; claims another writer allocated, held as taken."""

from __future__ import annotations

from typing import Any

import msgspec

from tangram.allocation import FleetState
from tangram.allocation.ledger import Ledger
from tangram.eventlog.records import EventLog, LogHeader, LogRecord, extents, record
from tangram.eventlog.replay import replay
from tangram.events import (
    ClaimAllocated,
    ClaimFailed,
    ClaimRequested,
    Event,
    PartitionRequested,
    encode,
)

from .helpers import CLASSES, again, gpus, inventory, ledger_on, mig, refused, released, request


def ledger() -> Ledger:
    return ledger_on("l40s-8")


def test_a_failed_claim_is_decided_again_only_when_asked_with_a_later_attempt() -> None:
    book = ledger()
    holder, waiting = request(1, gpus(8)), request(2, gpus(1))
    assert [type(e) for e in book.apply(holder)] == [ClaimAllocated]
    [failed] = book.apply(waiting)
    assert isinstance(failed, ClaimFailed) and failed.attempt == 0
    assert book.apply(waiting) == []  # redelivered: decided once
    [still] = book.apply(again(waiting, 1))  # asked again before capacity frees: fails again
    assert isinstance(still, ClaimFailed) and still.attempt == 1 and still.event_id != failed.event_id
    assert book.apply(again(waiting, 1)) == []
    book.apply(released(holder))
    [allocated] = book.apply(again(waiting, 2))
    assert isinstance(allocated, ClaimAllocated) and allocated.attempt == 2
    assert book.apply(again(waiting, 3)) == []  # allocated: never decided again


def test_only_a_release_of_a_claim_that_holds_devices_of_the_fleet_frees_capacity() -> None:
    """What the Kubernetes bridge asks before it asks every claim waiting for capacity again."""
    book = ledger()
    holder, waiting = request(1, gpus(7)), request(2, gpus(2))
    elsewhere, unknown = request(3, gpus(1)), request(4, gpus(1))
    assert [type(e) for e in book.apply(holder)] == [ClaimAllocated]
    assert [type(e) for e in book.apply(waiting)] == [ClaimFailed]
    book.apply(adopted(elsewhere, allocation("gpu-0", node="gone-node")))  # a node not of this fleet
    book.apply(adopted(unknown, allocation("gpu-7")))
    assert book.frees_capacity(holder.uid)
    assert book.frees_capacity(unknown.uid)  # the eighth GPU of n1, taken by another writer
    assert not book.frees_capacity(waiting.uid)
    assert not book.frees_capacity(elsewhere.uid)
    assert not book.frees_capacity("never-asked")
    book.apply(released(holder))
    assert not book.frees_capacity(holder.uid)  # released already


def _log(events: list[Event]) -> EventLog:
    records: list[LogRecord] = []
    sequences: dict[str, int] = {}
    for event in events:
        sequences[event.stream] = sequences.get(event.stream, 0) + 1
        records.append(
            record(event.stream, sequences[event.stream], event.subject, event.time, encode(event))
        )
    header = LogHeader(tangram_version="test", exported_at=events[0].time, streams=extents(records))
    return EventLog(header=header, records=records)


def test_a_replay_decides_the_retries_as_live() -> None:
    book = ledger()
    holder, waiting = request(1, gpus(8)), request(2, gpus(1))
    log: list[Event] = [inventory("l40s-8", "n1")]
    for event in (holder, waiting, released(holder), again(waiting, 1)):
        log.append(event)
        log.extend(book.apply(event))
    assert isinstance(log[-1], ClaimAllocated) and log[-1].attempt == 1
    report = replay(_log(log), CLASSES)
    assert report.claims_decided == 3 and report.divergences == []


def allocation(*devices: str, node: str = "n1") -> dict[str, Any]:
    return {
        "devices": {
            "results": [
                {"request": "gpus", "driver": "gpu.tangram.dev", "pool": node, "device": d} for d in devices
            ]
        }
    }


def adopted(event: ClaimRequested, value: dict[str, Any]) -> ClaimRequested:
    return msgspec.structs.replace(event, allocation=value, event_id=f"{event.event_id}-adopted")


def test_a_claim_another_writer_allocated_is_held_and_freed_on_release() -> None:
    book = ledger()
    other = request(1, gpus(1))
    assert book.apply(adopted(other, allocation("gpu-0", "gpu-1"))) == []
    assert book.fleet.allocation(other.uid) is not None
    # the allocator never gives those GPUs again: 6 are left
    assert isinstance(book.apply(request(2, gpus(7)))[0], ClaimFailed)
    assert book.apply(released(other)) == []  # the node destroys what it made itself
    assert book.fleet.allocation(other.uid) is None
    assert isinstance(book.apply(request(3, gpus(8)))[0], ClaimAllocated)


def test_the_allocators_own_allocation_read_back_changes_nothing() -> None:
    book = ledger()
    claim = request(1, gpus(2))
    [allocated] = book.apply(claim)
    assert isinstance(allocated, ClaimAllocated)
    written = allocation(*(d.device for d in allocated.devices))
    assert book.apply(adopted(claim, written)) == []
    assert book.decided[claim.uid] == "allocated" and claim.uid not in book.outside


def test_when_another_writer_won_the_allocators_decision_is_undone_and_theirs_held() -> None:
    book = Ledger(fleet=FleetState(), classes=CLASSES)
    book.apply(inventory("dgx-h100", "n1"), live=False)
    claim = request(1, mig("1g.10gb"))
    ours = book.apply(claim)
    create = next(e for e in ours if isinstance(e, PartitionRequested))
    allocated = next(e for e in ours if isinstance(e, ClaimAllocated))
    [mine] = allocated.devices
    theirs = book.fleet.node("n1")
    assert theirs is not None
    other_device = next(d.name for d in theirs.devices if d.profile == "1g.10gb" and d.name != mine.device)
    outputs = book.apply(adopted(claim, allocation(other_device)))
    [destroy] = outputs
    assert isinstance(destroy, PartitionRequested) and destroy.action == "destroy"
    assert destroy.placement == create.placement and destroy.claim_uid == claim.uid
    held = book.fleet.allocation(claim.uid)
    assert held is not None and [d.device for d in held.devices] == [other_device]
    assert book.outside[claim.uid] == "n1"


def test_a_released_claim_asked_again_with_a_later_attempt_is_decided_again_and_rebuilt_so() -> None:
    book = ledger()
    claim = request(1, gpus(8))
    log: list[Event] = [inventory("l40s-8", "n1")]
    for event in (claim, released(claim)):
        log.append(event)
        log.extend(book.apply(event))
    assert book.apply(claim) == []  # the same attempt after its release: nothing
    reused = again(claim, 1)
    log.append(reused)
    [allocated] = book.apply(reused)
    log.append(allocated)
    assert isinstance(allocated, ClaimAllocated) and allocated.attempt == 1
    rebuilt = Ledger(fleet=FleetState(), classes=CLASSES)
    for event in log:
        rebuilt.apply(event, live=False)
    assert rebuilt.snapshot() == book.snapshot()
    assert isinstance(rebuilt.apply(request(2, gpus(1)))[0], ClaimFailed)  # all 8 held again
    assert replay(_log(log), CLASSES).divergences == []


def test_a_claim_failed_after_its_allocation_was_written_is_held_again_when_adopted() -> None:
    book = Ledger(fleet=FleetState(), classes=CLASSES)
    book.apply(inventory("dgx-h100", "n1"), live=False)
    claim = request(1, mig("7g.80gb"))
    command, allocated = book.apply(claim)
    assert isinstance(command, PartitionRequested) and isinstance(allocated, ClaimAllocated)
    failure = refused(command)
    outputs = book.apply(failure)
    assert any(isinstance(o, ClaimFailed) for o in outputs)
    assert book.fleet.allocation(claim.uid) is None
    # the allocation stands in the API server: the bridge hands it back to the ledger
    written = allocation(*(d.device for d in allocated.devices))
    assert book.apply(adopted(claim, written)) == []
    held = book.fleet.allocation(claim.uid)
    assert held is not None and [d.device for d in held.devices] == [d.device for d in allocated.devices]
    *_, second = book.apply(request(2, mig("7g.80gb")))
    assert isinstance(second, ClaimAllocated)
    assert {d.gpu_index for d in second.devices}.isdisjoint({d.gpu_index for d in allocated.devices})


def test_a_device_another_writer_gave_first_sends_the_allocators_claim_to_be_decided_again() -> None:
    book = ledger()
    mine = request(1, gpus(1))
    [allocated] = book.apply(mine)
    assert isinstance(allocated, ClaimAllocated)
    [device] = [d.device for d in allocated.devices]
    theirs = request(2, gpus(1))
    [failed] = book.apply(adopted(theirs, allocation(device)))
    assert isinstance(failed, ClaimFailed) and failed.uid == mine.uid and "another writer" in failed.reason
    held = book.fleet.allocation(theirs.uid)
    assert held is not None and [d.device for d in held.devices] == [device]
    [again_allocated] = book.apply(again(mine, 1))
    assert isinstance(again_allocated, ClaimAllocated)
    assert [d.device for d in again_allocated.devices] != [device]
    assert book.conflicts == []
