"""Priorities and preemption apply to whole groups of pods: a claim of a group is preempted only
with the rest of its group, and a group that does not fit preempts claims of lower priority on
several nodes at once, has those nodes kept for it, and is placed there once they are freed."""

from __future__ import annotations

import msgspec

from tangram.allocation import FleetState
from tangram.allocation.ledger import Ledger
from tangram.events import ClaimAllocated, ClaimFailed, ClaimPreempting, ClaimReleased, ClaimRequested, Event

from .helpers import CLASSES, gpus, inventory, member, of, request


def ledger() -> Ledger:
    return Ledger(fleet=FleetState(), classes=CLASSES)


def asked(n: int, count: int, priority: int) -> ClaimRequested:
    return msgspec.structs.replace(request(n, gpus(count)), priority=priority)


def in_group(n: int, group: str, size: int, count: int, priority: int, **fields: object) -> ClaimRequested:
    return msgspec.structs.replace(member(n, group, size, count), priority=priority, **fields)


def released(n: int) -> ClaimReleased:
    uid = request(n, {}).uid
    return ClaimReleased(key=uid, namespace="team", name=f"claim-{n}", uid=uid)


def fleet(book: Ledger, *nodes: str) -> list[Event]:
    log: list[Event] = [inventory("l40s-8", node) for node in nodes]
    for event in log:
        book.apply(event, live=False)
    return log


def test_preempting_a_claim_of_a_group_preempts_the_whole_group_on_every_node() -> None:
    book = ledger()
    fleet(book, "n1", "n2")
    book.apply(in_group(1, "low", 2, 8, 0))
    placed = of(ClaimAllocated, book.apply(in_group(2, "low", 2, 8, 0)))
    assert sorted(a.node for a in placed) == ["n1", "n2"]

    outputs = book.apply(asked(9, 4, 100))
    [preempting] = of(ClaimPreempting, outputs)
    # 4 GPUs of one node would do, but the group's other pod would be useless: both go
    assert sorted(v.name for v in preempting.victims) == ["claim-1", "claim-2"]
    [failed] = of(ClaimFailed, outputs)
    assert "preempting 2 claims of lower priority" in failed.reason


def test_a_group_is_no_victim_while_any_of_its_claims_may_not_be_preempted() -> None:
    """claim 2 of the group is protected (a disruption budget): the group stays, and the claim alone
    of priority 0 on the other node is preempted though it is the costlier on its node."""
    book = ledger()
    fleet(book, "n1", "n2")
    book.apply(in_group(1, "low", 2, 4, 0))
    assert len(of(ClaimAllocated, book.apply(in_group(2, "low", 2, 4, 0)))) == 2
    for n in (3, 4):
        assert of(ClaimAllocated, book.apply(asked(n, 4, 0)))  # the fleet is full
    high = msgspec.structs.replace(asked(9, 4, 100), protected=[request(2, {}).uid])
    [preempting] = of(ClaimPreempting, book.apply(high))
    assert {v.name for v in preempting.victims}.isdisjoint({"claim-1", "claim-2"})


def three_nodes_with_claims(book: Ledger) -> dict[int, str]:
    """n1-n3 (8 GPUs each): claims 1 and 2 of priority 0 and claim 3 of priority 50, 6 GPUs each,
    one per node. Returns claim -> node."""
    fleet(book, "n1", "n2", "n3")
    on = {
        n: of(ClaimAllocated, book.apply(asked(n, 6, prio)))[0].node for n, prio in ((1, 0), (2, 0), (3, 50))
    }
    assert sorted(on.values()) == ["n1", "n2", "n3"]
    return on


def test_a_group_that_does_not_fit_preempts_the_cheapest_claims_on_several_nodes_and_gets_them() -> None:
    book = ledger()
    on = three_nodes_with_claims(book)
    book.apply(in_group(11, "train", 2, 8, 100))
    outputs = book.apply(in_group(12, "train", 2, 8, 100))
    preempting = of(ClaimPreempting, outputs)
    assert sorted(p.node for p in preempting) == sorted([on[1], on[2]])
    assert sorted(v.name for p in preempting for v in p.victims) == ["claim-1", "claim-2"]
    assert {p.name for p in preempting} == {"claim-11", "claim-12"}  # each node reserved for a member
    failed = of(ClaimFailed, outputs)
    assert sorted(f.name for f in failed) == ["claim-11", "claim-12"] and not of(ClaimAllocated, outputs)
    assert all(f.held_for_group == sorted([on[1], on[2]]) for f in failed)
    assert all(f.reserved_node in (on[1], on[2]) for f in failed)
    assert "preempting 2 claims of lower priority on nodes" in failed[0].reason

    # the kept nodes are no one else's meanwhile: a claim of lower priority gets only n3's 2 GPUs
    assert of(ClaimAllocated, book.apply(asked(20, 2, 0)))[0].node == on[3]
    assert of(ClaimFailed, book.apply(asked(21, 2, 0)))
    # asked again while the victims still hold their devices: no second preemption
    again = book.apply(in_group(11, "train", 2, 8, 100, attempt=1))
    assert not of(ClaimPreempting, again)
    assert "waits for their devices" in of(ClaimFailed, again)[0].reason

    book.apply(released(1))
    book.apply(released(2))
    placed = of(ClaimAllocated, book.apply(in_group(12, "train", 2, 8, 100, attempt=2)))
    assert sorted(a.node for a in placed) == sorted([on[1], on[2]])
    assert book.reservations == {} and book.gang_holds == {}


def test_a_rebuilt_ledger_keeps_a_groups_preemption_and_its_nodes() -> None:
    book = ledger()
    log: list[Event] = fleet(book, "n1", "n2", "n3")
    for n, prio in ((1, 0), (2, 0), (3, 50)):
        claim = asked(n, 6, prio)
        log += [claim, *book.apply(claim)]
    for n in (11, 12):
        claim = in_group(n, "train", 2, 8, 100)
        log += [claim, *book.apply(claim)]
    assert book.snapshot()["reservations"] and book.snapshot()["gang_holds"]
    rebuilt = ledger()
    for event in log:
        rebuilt.apply(event, live=False)
    assert rebuilt.snapshot() == book.snapshot()


def test_a_group_preempts_no_claim_of_its_own_priority_nor_under_policy_never() -> None:
    book = ledger()
    three_nodes_with_claims(book)
    book.apply(in_group(11, "same", 2, 8, 0))
    outputs = book.apply(in_group(12, "same", 2, 8, 0))
    assert not of(ClaimPreempting, outputs) and {f.cause for f in of(ClaimFailed, outputs)} == {"capacity"}

    book.apply(in_group(21, "polite", 2, 8, 100, preemption_policy="Never"))
    outputs = book.apply(in_group(22, "polite", 2, 8, 100, preemption_policy="Never"))
    assert not of(ClaimPreempting, outputs) and not of(ClaimAllocated, outputs)
