"""Preemption in the allocator's fold: the cheapest victims of lower priority, the freed devices
reserved for the preemptor (across a rebuild too), never for equal priority or policy Never."""

from __future__ import annotations

import msgspec

from tangram.allocation import FleetState
from tangram.allocation.ledger import Ledger
from tangram.events import (
    ClaimAllocated,
    ClaimFailed,
    ClaimPreempting,
    ClaimReleased,
    ClaimRequested,
    Event,
    PartitionRequested,
)

from .helpers import CLASSES, applied, gpus, inventory, mig, request


def ledger() -> Ledger:
    return Ledger(fleet=FleetState(), classes=CLASSES)


def asked(n: int, spec: dict, priority: int, **fields: object) -> ClaimRequested:
    return msgspec.structs.replace(request(n, spec), priority=priority, **fields)


def released(n: int) -> ClaimReleased:
    uid = request(n, {}).uid
    return ClaimReleased(key=uid, namespace="team", name=f"claim-{n}", uid=uid)


def placed(book: Ledger, claim: ClaimRequested) -> ClaimAllocated:
    outputs = book.apply(claim)
    [allocated] = [o for o in outputs if isinstance(o, ClaimAllocated)]
    return allocated


def two_full_l40s_nodes(book: Ledger) -> list[Event]:
    """n1: claim 1 (priority 10, 4 GPUs), claim 2 (priority 0, 4 GPUs); n2: claim 3 (priority 5,
    4 GPUs), claims 4 and 5 (priority 5, 2 GPUs each). Returns the log so far."""
    log: list[Event] = [inventory("l40s-8", "n1"), inventory("l40s-8", "n2")]
    for event in log:
        book.apply(event, live=False)
    on: dict[int, str] = {}
    for n, count, priority in ((1, 4, 10), (2, 4, 0), (3, 4, 5), (4, 2, 5), (5, 2, 5)):
        claim = asked(n, gpus(count), priority)
        allocated = placed(book, claim)
        on[n] = allocated.node
        log += [claim, allocated]
    assert on[1] == on[2] != on[3] == on[4] == on[5], on
    return log


def test_the_cheapest_victim_is_preempted_and_its_devices_go_to_the_preemptor_alone() -> None:
    book = ledger()
    log = two_full_l40s_nodes(book)
    node = book.fleet.allocation(request(2, {}).uid).node  # claim 2, the only priority-0 claim

    high = asked(9, gpus(4), 100)
    outputs = book.apply(high)
    assert [type(o) for o in outputs] == [ClaimPreempting, ClaimFailed]
    preempting, failed = outputs
    assert isinstance(preempting, ClaimPreempting) and isinstance(failed, ClaimFailed)
    assert preempting.node == node and [v.name for v in preempting.victims] == ["claim-2"]
    assert preempting.victims[0].priority == 0 and preempting.priority == 100
    assert failed.cause == "capacity"
    assert f"preempting 1 claim of lower priority on node {node}: team/claim-2 (priority 0)" in failed.reason
    log += [high, *outputs]

    # the victim's devices are freed: a claim of lower priority asked first does not get them
    log.append(released(2))
    book.apply(log[-1])
    low = asked(10, gpus(4), 0)
    [refused] = book.apply(low)
    assert isinstance(refused, ClaimFailed) and book.fleet.allocation(low.uid) is None

    # a ledger rebuilt from the log keeps the reservation: the same claim is refused there too
    rebuilt = ledger()
    for event in log:
        rebuilt.apply(event, live=False)
    assert rebuilt.snapshot() == {**book.snapshot(), "decided": rebuilt.snapshot()["decided"]}
    [refused_again] = rebuilt.apply(low)
    assert isinstance(refused_again, ClaimFailed)

    # asked again, the preemptor gets the freed devices; the reservation ends with its allocation
    again = msgspec.structs.replace(high, attempt=1)
    allocated = placed(book, again)
    victim_devices = {
        d.device for e in log if isinstance(e, ClaimAllocated) and e.name == "claim-2" for d in e.devices
    }
    assert allocated.node == node and {d.device for d in allocated.devices} == victim_devices
    assert book.reservations == {}
    # and a ledger rebuilt from the whole log holds exactly what the live one holds
    rebuilt = ledger()
    for event in [*log, again, allocated]:
        rebuilt.apply(event, live=False)
    assert rebuilt.fleet.snapshot() == book.fleet.snapshot() and rebuilt.reservations == {}


def test_a_claim_waits_while_its_victims_hold_their_devices_and_is_not_preempting_twice() -> None:
    book = ledger()
    two_full_l40s_nodes(book)
    high = asked(9, gpus(4), 100)
    book.apply(high)
    [waiting] = book.apply(msgspec.structs.replace(high, attempt=1))  # asked again, victim not freed
    assert isinstance(waiting, ClaimFailed)
    assert "team/claim-2): waits for their devices" in waiting.reason
    assert list(book.reservations) == [high.uid]


def test_fewest_victims_among_equals_and_protected_claims_are_never_victims() -> None:
    book = ledger()
    two_full_l40s_nodes(book)
    # claim 2 protected (a budget forbids evicting its pod): the node of claims 3-5 instead, where
    # one 4-GPU claim is preempted rather than the two 2-GPU ones of the same priority
    outputs = book.apply(asked(9, gpus(4), 100, protected=[request(2, {}).uid]))
    preempting = outputs[0]
    assert isinstance(preempting, ClaimPreempting)
    assert [v.name for v in preempting.victims] == ["claim-3"]


def test_equal_priority_and_policy_never_preempt_nothing() -> None:
    book = ledger()
    two_full_l40s_nodes(book)
    [equal] = book.apply(asked(9, gpus(4), 0))
    assert isinstance(equal, ClaimFailed) and "preempting" not in equal.reason
    [never] = book.apply(asked(10, gpus(4), 100, preemption_policy="Never"))
    assert isinstance(never, ClaimFailed) and "preempting" not in never.reason
    assert book.reservations == {}


def test_an_eviction_refused_plans_the_preemption_again_without_that_victim() -> None:
    book = ledger()
    two_full_l40s_nodes(book)
    high = asked(9, gpus(4), 100)
    first = book.apply(high)[0]
    assert isinstance(first, ClaimPreempting) and [v.name for v in first.victims] == ["claim-2"]
    refused = msgspec.structs.replace(high, attempt=1, protected=[request(2, {}).uid])
    second = book.apply(refused)[0]
    assert isinstance(second, ClaimPreempting) and [v.name for v in second.victims] == ["claim-3"]
    assert book.reservations[high.uid].victims == (request(3, {}).uid,)


def test_a_reservation_given_up_live_is_given_up_by_a_rebuilt_ledger_too() -> None:
    book = ledger()
    log = two_full_l40s_nodes(book)
    high = asked(9, gpus(4), 100)
    first = book.apply(high)
    assert isinstance(first[-1], ClaimFailed) and first[-1].reserved_node == first[0].node
    # every lower claim's eviction refused: no victim left, the reservation is given up
    every_lower = [request(n, {}).uid for n in (1, 2, 3, 4, 5)]
    refused = msgspec.structs.replace(high, attempt=1, protected=every_lower)
    [given_up] = book.apply(refused)
    assert isinstance(given_up, ClaimFailed) and given_up.reserved_node == ""
    assert book.reservations == {}
    rebuilt = ledger()
    for event in [*log, high, *first, refused, given_up]:
        rebuilt.apply(event, live=False)
    assert rebuilt.reservations == {}
    # so a claim of lower priority may have the node once its victim-to-be is freed, live and rebuilt
    for each in (book, rebuilt):
        each.apply(released(2))
        assert isinstance(each.apply(asked(10, gpus(4), 0))[0], ClaimAllocated)


def test_a_whole_gpu_preempts_the_mig_claims_of_one_gpu_and_gets_it_once_they_are_destroyed() -> None:
    book = ledger()
    book.apply(inventory("dgx-h100", "n1"), live=False)
    commands: dict[int, PartitionRequested] = {}
    for n in range(56):  # seven 1g.10gb instances on each of the 8 GPUs
        outputs = book.apply(asked(n, mig("1g.10gb"), n % 3))
        [command] = [o for o in outputs if isinstance(o, PartitionRequested)]
        commands[n] = command
        book.apply(applied(command, f"MIG-{n}"))
    outputs = book.apply(asked(100, gpus(1), 5))
    preempting = outputs[0]
    assert isinstance(preempting, ClaimPreempting)
    gpus_held = {commands[int(v.name.split("-")[1])].gpu_index for v in preempting.victims}
    assert len(preempting.victims) == 7 and len(gpus_held) == 1
    for victim in preempting.victims:
        for destroy in book.apply(released(int(victim.name.split("-")[1]))):
            assert isinstance(destroy, PartitionRequested) and destroy.action == "destroy"
            book.apply(applied(destroy, destroy.mig_uuid))
    allocated = placed(book, asked(100, gpus(1), 5, attempt=1))
    assert [d.gpu_index for d in allocated.devices] == list(gpus_held)
