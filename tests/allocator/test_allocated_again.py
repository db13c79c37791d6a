"""A claim decided again (asked with a later attempt after its create failed, or after a release)
gets an allocation, partition commands and a failure of its own: JetStream drops a publish whose
Msg-Id it has seen within its window, so reused ids would leave the second decision out of the log,
out of every node's view and out of the next rebuild. And a rebuild, which folds the claims stream
before the nodes' results, must not fail the second allocation with the first one's create failure."""

from __future__ import annotations

import msgspec

from tangram.allocation.ledger import Ledger
from tangram.bus import Bus
from tangram.events import (
    NODES_STREAM,
    ClaimAllocated,
    ClaimFailed,
    Event,
    PartitionRequested,
)
from tangram.events.ids import partition_command_id
from tangram.kubelet.allocations import InMemoryAllocationSource
from tangram.local.natsserver import NatsServer

from .helpers import (
    again,
    allocator,
    applied,
    decisions,
    inventory,
    ledger_on,
    log,
    log_until,
    mig,
    of,
    refused,
    released,
    request,
)


def ledger() -> Ledger:
    return ledger_on("dgx-h100")


def test_a_claim_allocated_again_after_its_create_failed_has_ids_of_its_own() -> None:
    book = ledger()
    asked = request(1, mig("7g.80gb"))
    out = book.apply(asked)
    [first_create], [first] = of(PartitionRequested, out), of(ClaimAllocated, out)
    [first_failure] = of(ClaimFailed, book.apply(refused(first_create)))
    out = book.apply(again(asked, 1))
    [second_create], [second] = of(PartitionRequested, out), of(ClaimAllocated, out)
    # the slot the failed create left free is taken again: the same command for the same slot
    # would be the same id, had the attempt not been part of it
    assert (second_create.gpu_uuid, second_create.placement) == (
        first_create.gpu_uuid,
        first_create.placement,
    )
    assert second.event_id != first.event_id
    assert second_create.command_id != first_create.command_id
    assert second_create.event_id != first_create.event_id
    assert second.partitions == [second_create.command_id]
    [second_failure] = of(ClaimFailed, book.apply(refused(second_create)))
    assert second_failure.event_id != first_failure.event_id
    assert (first_failure.attempt, second_failure.attempt) == (0, 1)
    # a decision made again for the same attempt (after a crash) keeps its ids: JetStream drops it
    after_a_crash = ledger()
    out = after_a_crash.apply(asked)
    assert [e.event_id for e in out] == [first_create.event_id, first.event_id]


def test_a_claim_released_and_allocated_again_destroys_its_second_instance_by_a_command_of_its_own() -> None:
    book = ledger()
    asked = request(1, mig("7g.80gb"))
    out = book.apply(asked)
    [create], [allocated] = of(PartitionRequested, out), of(ClaimAllocated, out)
    book.apply(applied(create, "MIG-first"))
    [destroy] = of(PartitionRequested, book.apply(released(allocated)))
    book.apply(applied(destroy, "MIG-first"))
    out = book.apply(again(asked, 1))
    [create_again], [allocated_again] = of(PartitionRequested, out), of(ClaimAllocated, out)
    assert (create_again.gpu_uuid, create_again.placement) == (create.gpu_uuid, create.placement)
    book.apply(applied(create_again, "MIG-second"))
    [destroy_again] = of(PartitionRequested, book.apply(released(allocated_again)))
    assert destroy_again.action == "destroy"
    assert destroy_again.command_id != destroy.command_id
    assert destroy_again.mig_uuid == "MIG-second"


def test_the_allocator_numbers_a_claims_commands_as_its_node_does() -> None:
    """In Kubernetes the node sends the claim's commands too when kubelet prepares and unprepares
    it: the allocator's and the node's must be one command, stored once and run once."""
    book, node = ledger(), InMemoryAllocationSource("n1")
    node.observe(inventory("dgx-h100", "n1"))
    fillers = [of(ClaimAllocated, book.apply(request(n, mig("7g.80gb"))))[0] for n in range(2, 10)]
    asked = request(1, mig("7g.80gb"))
    assert of(ClaimFailed, book.apply(asked))  # no room yet: decided again later, at attempt 1
    [freeing] = of(PartitionRequested, book.apply(released(fillers[0])))
    book.apply(applied(freeing, ""))

    def answered(event: Event) -> None:
        node.observe(event)
        book.apply(event)

    for attempt in (1, 2, 3):
        out = book.apply(again(asked, attempt))
        [create], [allocated] = of(PartitionRequested, out), of(ClaimAllocated, out)
        node_says = node.attempt(asked.uid, create.gpu_uuid, create.placement.start)
        assert create.command_id == partition_command_id(
            asked.uid, "create", gpu_index=create.gpu_index, profile_id=create.profile_id,
            start=create.placement.start, attempt=node_says,
        )  # fmt: skip
        assert node_says == attempt - 1  # each earlier attempt here was closed by its node
        if attempt == 1:
            answered(refused(create))  # the create fails: the claim is failed, then asked again
            continue
        answered(applied(create, f"MIG-{attempt}"))
        [destroy] = of(PartitionRequested, book.apply(released(allocated)))
        node_says = node.attempt(asked.uid, destroy.gpu_uuid, destroy.placement.start)
        assert destroy.command_id == partition_command_id(
            asked.uid, "destroy", gpu_index=destroy.gpu_index, profile_id=destroy.profile_id,
            start=destroy.placement.start, attempt=node_says,
        )  # fmt: skip
        answered(applied(destroy, f"MIG-{attempt}"))


def test_a_rebuild_keeps_a_claim_allocated_again_after_its_create_failed() -> None:
    live = ledger()
    asked = request(1, mig("7g.80gb"))
    claims_stream: list[Event] = [asked]
    out = live.apply(asked)
    [create] = of(PartitionRequested, out)
    claims_stream += of(ClaimAllocated, out)
    failure = refused(create)
    claims_stream += of(ClaimFailed, live.apply(failure))
    asked_again = again(asked, 1)
    claims_stream += [asked_again, *of(ClaimAllocated, live.apply(asked_again))]
    assert live.decided[asked.uid] == "allocated"
    rebuilt = ledger()
    for event in [*claims_stream, failure]:  # the claims stream, then the node's results
        rebuilt.apply(event, live=False)
    assert rebuilt.decided[asked.uid] == "allocated"
    held = rebuilt.fleet.allocation(asked.uid)
    assert held is not None and held.node == "n1"
    assert rebuilt.snapshot() == live.snapshot()
    # the GPU the claim holds is not handed out again: seven more whole-GPU instances fit, not eight
    for n in range(2, 10):
        request_n = request(n, mig("7g.80gb"))
        assert [type(e) for e in rebuilt.apply(request_n) if not isinstance(e, PartitionRequested)] == [
            type(e) for e in live.apply(request_n) if not isinstance(e, PartitionRequested)
        ]
    assert sum(1 for state in live.decided.values() if state == "allocated") == 8


def test_a_create_failure_the_allocator_died_before_acting_on_is_acted_on_when_delivered_again() -> None:
    live = ledger()
    asked = request(1, mig("7g.80gb"))
    out = live.apply(asked)
    [create], [allocated] = of(PartitionRequested, out), of(ClaimAllocated, out)
    failure = refused(create)  # stored on the nodes stream; the allocator died before its answer
    rebuilt = ledger()
    for event in [asked, allocated, failure]:
        rebuilt.apply(event, live=False)
    assert rebuilt.decided[asked.uid] == "allocated"
    # the result was never acknowledged, so the new leader's consumer delivers it again
    [failed] = of(ClaimFailed, rebuilt.apply(failure))
    assert failed.uid == asked.uid and "could not be created" in failed.reason
    assert rebuilt.fleet.allocation(asked.uid) is None


def test_a_late_failure_of_an_earlier_create_fails_nothing_live() -> None:
    book = ledger()
    asked = request(1, mig("7g.80gb"))
    [create] = of(PartitionRequested, book.apply(asked))
    failure = refused(create)
    book.apply(failure)
    book.apply(again(asked, 1))
    assert book.apply(failure) == []
    assert book.decided[asked.uid] == "allocated"
    assert book.fleet.allocation(asked.uid) is not None


async def test_through_jetstream_the_second_allocation_is_logged_and_survives_a_restart(
    bus: Bus, nats_server: NatsServer
) -> None:
    await bus.publish(inventory("dgx-h100", "node-1"))
    asked = request(1, mig("7g.80gb"))
    async with allocator(bus, nats_server.url):
        await bus.publish(asked)
        [first] = decisions(await log_until(bus, lambda e: len(decisions(e)) == 1))
        [create] = [c for c in await log(bus, NODES_STREAM) if isinstance(c, PartitionRequested)]
        await bus.publish(refused(create))  # as node-1 answers it
        await log_until(bus, lambda e: len(decisions(e)) == 2)
        await bus.publish(again(asked, 1))
        events = await log_until(bus, lambda e: len(of(ClaimAllocated, e)) == 2)
    assert isinstance(first, ClaimAllocated)
    [second] = [e for e in of(ClaimAllocated, events) if e.attempt == 1]
    creates = [
        c for c in await log(bus, NODES_STREAM) if isinstance(c, PartitionRequested) and c.action == "create"
    ]
    assert [c.command_id for c in creates] == [*first.partitions, *second.partitions]
    # a new leader folds the node's failure after the second allocation: the claim keeps its GPU
    async with allocator(bus, nats_server.url):
        for n in range(2, 10):
            await bus.publish(request(n, mig("7g.80gb")))
        events = await log_until(bus, lambda e: len(decisions(e)) == 11)
    later = [e for e in decisions(events) if e.uid != asked.uid]
    assert [type(e).__name__ for e in later].count("ClaimAllocated") == 7
    held = {e.devices[0].gpu_uuid for e in of(ClaimAllocated, events) if e.uid != asked.uid}
    assert second.devices[0].gpu_uuid not in held


def test_a_rebuild_expects_the_destroys_a_claim_placed_again_on_its_slot_was_sent() -> None:
    """The rebuild reads the releases before the results that moved the slot's count on: the
    destroys it expects must still be the ones sent, or their answers would match nothing and
    the slot would stay on its way out for ever."""
    live = ledger()
    asked = request(1, mig("7g.80gb"))
    claims_stream: list[Event] = []
    results: list[Event] = []
    sent: list[PartitionRequested] = []
    for attempt in (0, 1, 2):
        asked_again = again(asked, attempt)
        out = live.apply(asked_again)
        [create], [allocated] = of(PartitionRequested, out), of(ClaimAllocated, out)
        claims_stream += [asked_again, allocated]
        results.append(applied(create, f"MIG-{attempt}"))
        live.apply(results[-1])
        claims_stream.append(released(allocated))
        [destroy] = of(PartitionRequested, live.apply(claims_stream[-1]))
        sent.append(destroy)
        if attempt < 2:  # the last destroy is not answered yet
            results.append(applied(destroy, f"MIG-{attempt}"))
            live.apply(results[-1])
    assert len({d.command_id for d in sent}) == 3
    assert len({(d.gpu_uuid, d.placement) for d in sent}) == 1  # one slot, used three times
    rebuilt = ledger()
    for event in [*claims_stream, *results]:
        rebuilt.apply(event, live=False)
    # the same command (by its id: the rebuild names no instance; the partitioner finds the claim's own)
    expected = {uid: list(pending) for uid, pending in rebuilt.unanswered_destroys.items()}
    assert (
        expected
        == {asked.uid: [sent[2].command_id]}
        == {uid: list(pending) for uid, pending in live.unanswered_destroys.items()}
    )
    assert rebuilt.snapshot() == live.snapshot()
    answer = applied(sent[2], "MIG-2")
    live.apply(answer)
    rebuilt.apply(answer)
    assert rebuilt.unanswered_destroys == {}
    # every slot is free again, in both: eight whole-GPU instances fit
    for n in range(2, 10):
        claim = request(n, mig("7g.80gb"))
        assert of(ClaimAllocated, rebuilt.apply(claim)) and of(ClaimAllocated, live.apply(claim))


def test_a_node_cannot_move_the_count_of_another_nodes_slot() -> None:
    """A result counts only for the GPUs of the node that sends it (its subject names it): another
    node quoting this node's GPU would otherwise make the allocator number the claim's next command
    differently from its own node, which then refuses the node's prepare."""
    book = ledger()
    book.apply(inventory("l40s-8", "n2"), live=False)  # GPUs of its own: the simulator names GPUs by machine
    asked = request(1, mig("7g.80gb"))
    [create] = of(PartitionRequested, book.apply(asked))
    assert create.node == "n1"
    forged = msgspec.structs.replace(refused(create), key="n2", node="n2")
    assert book.apply(forged) == []
    assert book.slot_attempts.current(asked.uid, create.gpu_uuid, create.placement.start) == 0
    assert book.decided[asked.uid] == "allocated"
    book.apply(refused(create))
    assert book.slot_attempts.current(asked.uid, create.gpu_uuid, create.placement.start) == 1
