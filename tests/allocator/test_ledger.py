"""The allocator's fold over its log: decisions once, rebuilt state, releases, partition failures."""

from __future__ import annotations

from typing import Any

import msgspec
import pynvml
import pytest

from tangram.allocation import FleetState
from tangram.allocation.ledger import Ledger
from tangram.allocation.model import Allocated, Claim
from tangram.cdi import InvalidName, validate_claim_uid
from tangram.events import (
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    ClaimRequested,
    Event,
    MigPlacement,
    NodeInventory,
    PartitionApplied,
    PartitionFailed,
    PartitionRequested,
)
from tangram.nvml import SimNvml, parse_mig_minors, render_mig_minors
from tangram.nvml.inventory import read_node_hardware
from tangram.partitioning import MigExecutor

from .helpers import CLASSES, applied, gpus, hardware, inventory, mig, refused, request


def ledger() -> Ledger:
    return Ledger(fleet=FleetState(), classes=CLASSES)


def fold(target: Ledger, events: list[Event]) -> list[Event]:
    out: list[Event] = []
    for event in events:
        out.extend(target.apply(event))
    return out


def test_whole_gpu_claim_is_allocated_once_even_when_redelivered() -> None:
    book = ledger()
    book.apply(inventory("l40s-8", "n1"), live=False)
    claim = request(1, gpus(2))
    first = book.apply(claim)
    again = book.apply(claim)
    assert [type(e) for e in first] == [ClaimAllocated]
    allocated = first[0]
    assert isinstance(allocated, ClaimAllocated)
    assert allocated.node == "n1" and len(allocated.devices) == 2 and allocated.partitions == []
    assert again == []


def test_mig_claim_emits_the_partition_command_before_the_allocation() -> None:
    book = ledger()
    book.apply(inventory("dgx-h100", "n1"), live=False)
    out = book.apply(request(1, mig("3g.40gb")))
    assert [type(e) for e in out] == [PartitionRequested, ClaimAllocated]
    command, allocated = out
    assert isinstance(command, PartitionRequested) and isinstance(allocated, ClaimAllocated)
    assert command.action == "create" and command.profile == "3g.40gb" and command.profile_id == 9
    assert command.placement in (MigPlacement(start=0, size=4), MigPlacement(start=4, size=4))
    assert command.subject == "tangram.node.n1.partition.requested"
    assert allocated.partitions == [command.command_id]


def test_decisions_have_the_same_event_ids_in_two_independent_ledgers() -> None:
    events = [inventory("l40s-8", "n1"), request(1, gpus(1)), request(2, mig("1g.10gb"))]
    one, two = ledger(), ledger()
    assert [e.event_id for e in fold(one, events)] == [e.event_id for e in fold(two, events)]


def test_rebuilt_ledger_never_hands_out_the_same_gpus_again() -> None:
    live = ledger()
    log: list[Event] = [inventory("l40s-8", "n1")]
    live.apply(log[0], live=False)
    for n in range(8):
        claim = request(n, gpus(1))
        log.append(claim)
        log.extend(live.apply(claim))
    taken = {d.device for e in log if isinstance(e, ClaimAllocated) for d in e.devices}
    assert len(taken) == 8

    rebuilt = ledger()
    for event in log:
        rebuilt.apply(event, live=False)
    assert rebuilt.apply(request(3, gpus(1))) == []  # already decided in the log
    [failed] = rebuilt.apply(request(99, gpus(1)))
    assert isinstance(failed, ClaimFailed)
    assert "0/1 nodes fit" in failed.reason


def test_release_destroys_the_claims_mig_instance_once() -> None:
    book = ledger()
    book.apply(inventory("dgx-h100", "n1"), live=False)
    command, allocated = book.apply(request(1, mig("1g.10gb")))
    assert isinstance(command, PartitionRequested) and isinstance(allocated, ClaimAllocated)
    release = ClaimReleased(key=allocated.uid, namespace="team", name="claim-1", uid=allocated.uid)
    [destroy] = book.apply(release)
    assert isinstance(destroy, PartitionRequested)
    assert destroy.action == "destroy"
    assert (destroy.gpu_index, destroy.placement, destroy.profile) == (
        command.gpu_index,
        command.placement,
        "1g.10gb",
    )
    # Delivered again before any result: the same command (same Msg-Id), which the node runs once.
    [again] = book.apply(release)
    assert again.event_id == destroy.event_id and again.command_id == destroy.command_id
    book.apply(applied(destroy, destroy.mig_uuid))
    assert book.apply(release) == []


def test_a_release_folded_at_rebuild_but_never_acted_on_sends_its_destroys_when_delivered() -> None:
    """An allocator killed after the release reached the log, before it sent the destroys: its
    successor folds the release while rebuilding, and the consumer delivers the release again."""
    live = ledger()
    live.apply(inventory("dgx-h100", "n1"), live=False)
    events: list[Event] = [inventory("dgx-h100", "n1"), request(1, mig("1g.10gb"))]
    create, allocated = live.apply(events[1])
    assert isinstance(create, PartitionRequested) and isinstance(allocated, ClaimAllocated)
    made = PartitionApplied(
        key="n1", command_id=create.command_id, node="n1", action="create", gpu_uuid=create.gpu_uuid,
        gpu_index=create.gpu_index, profile=create.profile, placement=create.placement,
        claim_uid=allocated.uid, mig_uuid="MIG-made-for-claim-1",
    )  # fmt: skip
    release = ClaimReleased(key=allocated.uid, namespace="team", name="claim-1", uid=allocated.uid)
    log: list[Event] = [*events, create, allocated, made, release]

    successor = ledger()
    for event in log:
        successor.apply(event, live=False)
    [destroy] = successor.apply(release)
    assert isinstance(destroy, PartitionRequested) and destroy.action == "destroy"
    assert (destroy.node, destroy.gpu_uuid, destroy.placement) == ("n1", create.gpu_uuid, create.placement)
    assert destroy.mig_uuid == "MIG-made-for-claim-1"  # the claim's own instance, named by its create

    # Once the log holds the destroy's result, a rebuild has nothing left to send for it.
    rebuilt = ledger()
    for event in [*log, applied(destroy, destroy.mig_uuid)]:
        rebuilt.apply(event, live=False)
    assert rebuilt.apply(release) == []
    assert rebuilt.unanswered_destroys == {}


def test_failed_partition_fails_the_claim_and_frees_its_placement() -> None:
    book = ledger()
    book.apply(inventory("dgx-h100", "n1"), live=False)
    command, allocated = book.apply(request(1, mig("7g.80gb")))
    assert isinstance(command, PartitionRequested) and isinstance(allocated, ClaimAllocated)
    failure = refused(command)
    out = book.apply(failure)
    assert [type(e) for e in out] == [PartitionRequested, ClaimFailed]
    assert isinstance(out[1], ClaimFailed)
    assert "could not be created: slices in use" in out[1].reason
    assert book.fleet.allocation(allocated.uid) is None


def test_a_claim_failed_after_a_partition_is_read_back_waiting_for_the_destroys_sent_live() -> None:
    # Two MIG instances: the first is made, the second refused. Live, the failure destroys the
    # first; a rebuild before the destroy's result waits for the same destroy, and both free its
    # slot when the result comes.
    two = {
        "devices": {
            "requests": [{**mig("2g.20gb")["devices"]["requests"][0], "name": name} for name in ("a", "b")]
        }
    }
    book = ledger()
    book.apply(inventory("dgx-h100", "n1"), live=False)
    ask = request(1, two)
    first, second, allocated = book.apply(ask)
    assert isinstance(allocated, ClaimAllocated) and first.action == second.action == "create"
    made = applied(first, "MIG-made-for-claim-1")
    assert book.apply(made) == []
    *destroys, failed = book.apply(refused(second))
    assert isinstance(failed, ClaimFailed) and destroys
    assert {(d.action, d.gpu_uuid) for d in destroys} >= {("destroy", first.gpu_uuid)}

    rebuilt = ledger()
    rebuilt.apply(inventory("dgx-h100", "n1"), live=False)
    for event in [ask, allocated, failed, made, refused(second)]:
        rebuilt.apply(event, live=False)
    assert {u: sorted(c) for u, c in rebuilt.unanswered_destroys.items()} == {
        u: sorted(c) for u, c in book.unanswered_destroys.items()
    }
    assert rebuilt.fleet.snapshot() == book.fleet.snapshot()

    for each in (book, rebuilt):
        for destroy in destroys:
            each.apply(applied(destroy, destroy.mig_uuid))
        assert each.unanswered_destroys == {}
    assert rebuilt.fleet.node("n1").destroying == book.fleet.node("n1").destroying == set()
    again = request(2, two)
    assert [msgspec.structs.replace(e, time=ask.time) for e in book.apply(again)] == [
        msgspec.structs.replace(e, time=ask.time) for e in rebuilt.apply(again)
    ]


def _release(n: int) -> ClaimReleased:
    uid = f"00000000-0000-4000-8000-{n:012d}"
    return ClaimReleased(key=uid, namespace="team", name=f"claim-{n}", uid=uid)


def test_ledger_rebuilt_from_its_log_makes_the_same_next_decisions() -> None:
    live = ledger()
    inventories: list[Event] = [
        inventory("dgx-h100", "n1"),
        inventory("l40s-8", "n2"),
        inventory("dgx-h100", "n3"),
    ]
    claims: list[Event] = []
    results: list[Event] = []  # partition results, replayed after the claims as the service does
    for event in inventories:
        live.apply(event, live=False)
    specs = [gpus(2), mig("1g.10gb"), mig("3g.40gb"), gpus(1), mig("2g.20gb"), gpus(4), mig("1g.10gb")]
    for n, spec in enumerate(specs * 3):
        claims.append(request(n, spec))
        for out in live.apply(claims[-1]):
            if isinstance(out, PartitionRequested):
                continue
            claims.append(out)
        if n % 3 == 2:
            claims.append(_release(n - 1))
            claims.extend(e for e in live.apply(claims[-1]) if not isinstance(e, PartitionRequested))
    # One MIG claim fails after its allocation: its instance could not be created.
    [command, allocated] = live.apply(request(100, mig("4g.40gb")))
    assert isinstance(command, PartitionRequested) and isinstance(allocated, ClaimAllocated)
    claims.extend([request(100, mig("4g.40gb")), allocated])
    results.append(refused(command))
    claims.extend(e for e in live.apply(results[-1]) if isinstance(e, ClaimFailed))

    rebuilt = ledger()
    for event in [*inventories, *claims, *results]:
        assert rebuilt.apply(event, live=False) == []
    assert rebuilt.fleet.snapshot() == live.fleet.snapshot()
    assert rebuilt.fleet.allocation(allocated.uid) is None
    assert rebuilt.decided == live.decided

    follow_up = [gpus(1), mig("1g.10gb"), mig("7g.80gb"), gpus(2), mig("4g.40gb"), gpus(3), mig("3g.40gb")]
    for n, spec in enumerate(follow_up, start=200):
        assert _content(rebuilt.apply(request(n, spec))) == _content(live.apply(request(n, spec)))
    assert _content(rebuilt.apply(_release(201))) == _content(live.apply(_release(201)))
    next_mig = request(300, mig("1g.10gb"))
    assert _content(rebuilt.apply(next_mig)) == _content(live.apply(next_mig))


def _content(events: list[Event]) -> list[dict[str, Any]]:
    """The events without their creation time, the one field two ledgers may not share."""
    assert events
    return [
        {"type": type(e).__name__, **{k: v for k, v in msgspec.to_builtins(e).items() if k != "time"}}
        for e in events
    ]


def test_replaying_a_release_emits_nothing_and_frees_the_devices() -> None:
    book = ledger()
    book.apply(inventory("l40s-8", "n1"), live=False)
    [allocated] = book.apply(request(1, gpus(8)))
    assert isinstance(allocated, ClaimAllocated)
    assert book.apply(_release(1), live=False) == []
    assert book.fleet.allocation(allocated.uid) is None
    [again] = book.apply(request(2, gpus(8)))
    assert isinstance(again, ClaimAllocated)
    assert sorted(d.device for d in again.devices) == [f"gpu-{i}" for i in range(8)]


def hgx_with_gpu0_in_mig_mode_and_empty() -> NodeInventory:
    node = inventory("hgx-h200", "n1")
    emptied = [msgspec.structs.replace(g, mig_instances=[]) for g in node.hardware.gpus]
    return msgspec.structs.replace(node, hardware=msgspec.structs.replace(node.hardware, gpus=emptied))


def test_whole_gpu_in_mig_mode_gets_a_disable_mig_command_that_the_allocation_names() -> None:
    book = ledger()
    book.apply(hgx_with_gpu0_in_mig_mode_and_empty(), live=False)
    command, allocated = book.apply(request(1, gpus(8)))
    assert isinstance(command, PartitionRequested) and isinstance(allocated, ClaimAllocated)
    assert (command.action, command.gpu_index, command.placement) == (
        "disable-mig",
        0,
        MigPlacement(start=0, size=8),
    )
    by_gpu = {d.gpu_index: d.partition_command for d in allocated.devices}
    assert by_gpu[0] == command.command_id
    assert [by_gpu[i] for i in range(1, 8)] == [""] * 7
    assert allocated.partitions == [command.command_id]


def test_whole_gpu_claim_fails_with_a_reason_when_mig_mode_cannot_be_left() -> None:
    book = ledger()
    book.apply(hgx_with_gpu0_in_mig_mode_and_empty(), live=False)
    command, _ = book.apply(request(1, gpus(8)))
    assert isinstance(command, PartitionRequested)
    failure = PartitionFailed(
        key="n1",
        command_id=command.command_id,
        node="n1",
        action="disable-mig",
        gpu_uuid=command.gpu_uuid,
        profile="",
        placement=command.placement,
        claim_uid=command.claim_uid,
        nvml_error="NVML_ERROR_IN_USE",
        reason="processes are running",
    )
    [failed] = book.apply(failure)
    assert isinstance(failed, ClaimFailed)
    assert failed.reason == (
        f"GPU {command.gpu_uuid} of node n1 could not leave MIG mode for a whole-GPU claim: "
        "processes are running"
    )


def test_a_refused_destroy_keeps_the_instances_slices_out_of_later_decisions() -> None:
    """A destroy the node refused leaves the instance on the GPU: handing its slices out again
    would make the next create there fail after its claim was allocated."""
    book = ledger()
    book.apply(inventory("dgx-h100", "n1"), live=False)
    create, allocated = book.apply(request(1, mig("7g.80gb")))
    assert isinstance(create, PartitionRequested) and isinstance(allocated, ClaimAllocated)
    nvml = SimNvml.from_machine("dgx-h100")
    nvml.nvmlInit()
    MigExecutor(nvml, minors=parse_mig_minors(render_mig_minors())).create(
        create.gpu_index, create.profile_id, create.placement
    )
    book.apply(NodeInventory(key="n1", hardware=read_node_hardware(nvml, "n1")), live=False)
    [destroy] = book.apply(
        ClaimReleased(key=allocated.uid, namespace="team", name="claim-1", uid=allocated.uid)
    )
    assert isinstance(destroy, PartitionRequested) and destroy.action == "destroy"
    refused = PartitionFailed(
        key="n1", command_id=destroy.command_id, node="n1", action="destroy", gpu_uuid=destroy.gpu_uuid,
        profile=destroy.profile, placement=destroy.placement, claim_uid=allocated.uid,
        nvml_error="NVML_ERROR_IN_USE", reason="compute processes run on it",
    )  # fmt: skip
    assert book.apply(refused) == []
    # Eight claims for a 4g instance, one per GPU: the GPU still holding the 7g cannot take one.
    decided = [book.apply(request(10 + n, mig("4g.40gb")))[-1] for n in range(8)]
    placed = [d for d in decided if isinstance(d, ClaimAllocated)]
    assert len(placed) == 7 and isinstance(decided[-1], ClaimFailed)
    assert create.gpu_index not in {d.devices[0].gpu_index for d in placed}


def _made_and_released(book: Ledger) -> tuple[SimNvml, NodeInventory, NodeInventory, PartitionRequested]:
    """A 7g instance created for claim 1 and released: its destroy is sent, not yet applied.
    Returns the simulated GPUs, inventories read before and after the create, and the destroy."""
    nvml = SimNvml.from_machine("dgx-h100")
    nvml.nvmlInit()
    before = NodeInventory(key="n1", hardware=read_node_hardware(nvml, "n1"))
    book.apply(before, live=False)
    create, allocated = book.apply(request(1, mig("7g.80gb")))
    assert isinstance(create, PartitionRequested) and isinstance(allocated, ClaimAllocated)
    MigExecutor(nvml, minors=parse_mig_minors(render_mig_minors())).create(
        create.gpu_index, create.profile_id, create.placement
    )
    after = NodeInventory(key="n1", hardware=read_node_hardware(nvml, "n1"))
    book.apply(after, live=False)
    [made] = [m for g in after.hardware.gpus if g.index == create.gpu_index for m in g.mig_instances]
    applied = PartitionApplied(
        key="n1", command_id=create.command_id, node="n1", action="create", gpu_uuid=create.gpu_uuid,
        gpu_index=create.gpu_index, profile=create.profile, placement=create.placement,
        claim_uid=allocated.uid, mig_uuid=made.uuid,
    )  # fmt: skip
    assert book.apply(applied) == []
    [destroy] = book.apply(
        ClaimReleased(key=allocated.uid, namespace="team", name="claim-1", uid=allocated.uid)
    )
    assert isinstance(destroy, PartitionRequested) and destroy.action == "destroy" and destroy.mig_uuid
    return nvml, before, after, destroy


def test_an_instance_being_destroyed_is_never_handed_to_another_claim() -> None:
    """An inventory read before the create (discovery's, late) says nothing about the destroy:
    the instance stays on its way out until the destroy's result, so a claim for the same profile
    gets an instance of its own, created after the destroy, never the one about to go."""
    book = ledger()
    _, before, after, _ = _made_and_released(book)
    book.apply(before, live=False)
    book.apply(after, live=False)
    outputs = book.apply(request(2, mig("7g.80gb")))
    creates = [e for e in outputs if isinstance(e, PartitionRequested) and e.action == "create"]
    allocated = outputs[-1]
    assert isinstance(allocated, ClaimAllocated) and len(creates) == 1
    assert allocated.devices[0].partition_command == creates[0].command_id


def test_an_instance_whose_destroy_was_applied_is_gone_even_from_a_late_inventory() -> None:
    book = ledger()
    _, before, after, destroy = _made_and_released(book)
    applied = PartitionApplied(
        key="n1", command_id=destroy.command_id, node="n1", action="destroy", gpu_uuid=destroy.gpu_uuid,
        gpu_index=destroy.gpu_index, profile=destroy.profile, placement=destroy.placement,
        claim_uid=destroy.claim_uid, mig_uuid=destroy.mig_uuid,
    )  # fmt: skip
    assert book.apply(applied) == []
    book.apply(before, live=False)  # the partitioner's read after the destroy: the instance is gone
    book.apply(after, live=False)  # discovery's, read before the destroy and arriving last, lists it
    outputs = book.apply(request(2, mig("7g.80gb")))
    allocated = outputs[-1]
    assert isinstance(allocated, ClaimAllocated)
    [create] = [e for e in outputs if isinstance(e, PartitionRequested) and e.action == "create"]
    assert allocated.devices[0].partition_command == create.command_id


def test_a_partition_failure_from_another_node_fails_nothing() -> None:
    book = ledger()
    book.apply(inventory("dgx-h100", "n1"), live=False)
    book.apply(inventory("dgx-h100", "n2"), live=False)
    command, allocated = book.apply(request(1, mig("7g.80gb")))
    assert isinstance(command, PartitionRequested) and isinstance(allocated, ClaimAllocated)
    other = "n2" if command.node == "n1" else "n1"
    forged = msgspec.structs.replace(refused(command), key=other, node=other)
    assert book.unanswered(forged) == (
        f"create result from node {other!r} for command {command.command_id!r}, "
        f"which was sent to node {command.node!r}"
    )
    assert book.apply(forged) == []
    assert book.fleet.allocation(allocated.uid) is not None
    assert book.decided[allocated.uid] == "allocated"


def test_a_partition_failure_for_a_command_never_sent_fails_nothing() -> None:
    book = ledger()
    book.apply(inventory("dgx-h100", "n1"), live=False)
    command, allocated = book.apply(request(1, mig("7g.80gb")))
    assert isinstance(command, PartitionRequested) and isinstance(allocated, ClaimAllocated)
    # The claim uid is right, the command id is made up: the uid alone proves nothing.
    forged = msgspec.structs.replace(refused(command), command_id="made-up")
    assert book.unanswered(forged) == "create result for command 'made-up', which was never sent"
    assert book.apply(forged) == []
    assert book.fleet.allocation(allocated.uid) is not None


def test_a_rebuilt_ledger_still_knows_which_node_each_command_went_to() -> None:
    live = ledger()
    live.apply(inventory("dgx-h100", "n1"), live=False)
    live.apply(inventory("dgx-h100", "n2"), live=False)
    command, allocated = live.apply(request(1, mig("7g.80gb")))
    assert isinstance(command, PartitionRequested) and isinstance(allocated, ClaimAllocated)
    rebuilt = ledger()
    fold(rebuilt, [inventory("dgx-h100", "n1"), inventory("dgx-h100", "n2"), allocated])
    other = "n2" if command.node == "n1" else "n1"
    forged = msgspec.structs.replace(refused(command), key=other, node=other)
    assert rebuilt.apply(forged, live=False) == []
    assert rebuilt.fleet.allocation(allocated.uid) is not None
    genuine = refused(command)
    assert rebuilt.unanswered(genuine) is None


@pytest.mark.parametrize(
    "uid",
    ["../../../etc/cron.d/x", "a" * 300, "claim\n", "Claim-1", "a/b", "..", "x\x00y"],
    ids=["path", "300-chars", "newline", "upper-case", "slash", "dot-dot", "nul"],
)
def test_a_claim_uid_the_node_would_refuse_fails_and_holds_no_device(uid: str) -> None:
    book = ledger()
    book.apply(inventory("l40s-8", "n1"), live=False)
    bad = ClaimRequested(key="bad-claim", namespace="team", name="bad", uid=uid, spec=gpus(8))
    [failed] = book.apply(bad)
    assert isinstance(failed, ClaimFailed) and failed.uid == uid
    assert "neither an RFC 4122 UUID nor a DNS label" in failed.reason
    assert "no node can prepare it" in failed.reason
    assert book.fleet.metrics().free_gpus == 8
    # The node applies the same rule: what the allocator refuses, the kubelet plugin refuses too.
    with pytest.raises(InvalidName):
        validate_claim_uid(uid)
    [allocated] = book.apply(request(2, gpus(8)))
    assert isinstance(allocated, ClaimAllocated) and len(allocated.devices) == 8


def test_a_node_read_again_just_before_a_claim_of_a_new_kind_changes_nothing() -> None:
    """Decisions must not depend on whether an unchanged inventory arrived since the last one: a
    live allocator reads inventories as they come, a rebuild or a replay at other moments. The
    demand-weighted loss of each placement (the supply of every kind included) must be the same."""

    def decide(read_again: bool) -> tuple[str, list[str], Any]:
        fleet = FleetState()
        fleet.apply_inventory(hardware("hgx-h200", "hgx-1"))
        fleet.apply_inventory(hardware("l40s-8", "l40s-1"))
        fleet.allocate(Claim(namespace="team", name="one", uid=uid(1), spec=gpus(1)), CLASSES)
        if read_again:
            fleet.apply_inventory(hardware("hgx-h200", "hgx-1"))
            fleet.apply_inventory(hardware("l40s-8", "l40s-1"))
        claim = Claim(namespace="team", name="two", uid=uid(2), spec=mig("2g.35gb"))
        decision = fleet.allocate(claim, CLASSES, explain=True)
        assert isinstance(decision, Allocated)
        return decision.node, [d.device for d in decision.devices], decision.why

    settled, read_again = decide(False), decide(True)
    assert settled[0] == "hgx-1"
    assert read_again == settled


def uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def test_a_gpu_instance_without_its_compute_instance_is_never_handed_out() -> None:
    """An inventory read between a GPU instance's create and its compute instance's shows it
    without a UUID: its slices are taken, but it is no MIG device a claim could be given."""
    nvml = SimNvml.from_machine("dgx-h100")
    nvml.nvmlInit()
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceSetMigMode(gpu, 1)
    profile = nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE)
    nvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, profile.id, MigPlacement(start=0, size=8))
    hardware = read_node_hardware(nvml, "n1")
    [half_made] = [m for g in hardware.gpus if g.index == 0 for m in g.mig_instances]
    assert half_made.uuid == ""
    book = ledger()
    book.apply(NodeInventory(key="n1", hardware=hardware), live=False)
    outputs = book.apply(request(1, mig("7g.80gb")))
    allocated = outputs[-1]
    assert isinstance(allocated, ClaimAllocated)
    [device] = allocated.devices
    assert device.gpu_index != 0 and device.partition_command


def test_a_rebuild_never_takes_an_older_destroy_for_the_destroy_of_a_later_instance() -> None:
    """Two claims used one placement in turn; the second's destroy is still to come. A rebuild folds
    both releases before any result: the first destroy's result must leave the placement on its
    way out, or the second claim's instance is handed to a new claim while the node destroys it."""
    nvml = SimNvml.from_machine("dgx-h100")
    nvml.nvmlInit()
    executor = MigExecutor(nvml, minors=parse_mig_minors(render_mig_minors()))
    live = ledger()
    inventories: list[NodeInventory] = [NodeInventory(key="n1", hardware=read_node_hardware(nvml, "n1"))]
    claims_log: list[Event] = []
    nodes_log: list[Event] = []
    live.apply(inventories[-1], live=False)
    commands: list[PartitionRequested] = []
    for n in (1, 2):
        claims_log.append(request(n, mig("7g.80gb")))
        create, allocated = live.apply(claims_log[-1])
        assert isinstance(create, PartitionRequested) and isinstance(allocated, ClaimAllocated)
        claims_log.append(allocated)
        made = executor.create(create.gpu_index, create.profile_id, create.placement)
        inventories.append(NodeInventory(key="n1", hardware=read_node_hardware(nvml, "n1")))
        live.apply(inventories[-1], live=False)
        nodes_log += [create, applied(create, made.mig_uuid)]
        live.apply(nodes_log[-1])
        claims_log.append(_release(n))
        [destroy] = live.apply(claims_log[-1])
        assert isinstance(destroy, PartitionRequested) and destroy.mig_uuid == made.mig_uuid
        nodes_log.append(destroy)
        commands.append(create)
        if n == 1:  # the first claim's instance is destroyed; the second's destroy is still to come
            executor.destroy(create.gpu_uuid, placement=create.placement)
            nodes_log.append(applied(destroy, made.mig_uuid))
            live.apply(nodes_log[-1])
    first, second = commands
    assert (first.gpu_uuid, first.placement) == (second.gpu_uuid, second.placement), "one placement, in turn"

    rebuilt = ledger()
    for event in [inventories[-1], *claims_log, *nodes_log]:  # the allocator's rebuild order
        rebuilt.apply(event, live=False)
    [*_, allocated] = rebuilt.apply(request(3, mig("7g.80gb")))
    assert isinstance(allocated, ClaimAllocated)
    [device] = allocated.devices
    assert device.gpu_uuid != second.gpu_uuid or device.partition_command, (
        "the second claim's instance, being destroyed, was handed out as it stands"
    )


def test_a_claim_that_fails_inside_the_ledger_fails_alone_and_holds_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever breaks while one claim's decision is turned into events, that claim is failed
    with the reason, the ledger holds nothing for it, and the next claim is decided."""
    book = ledger()
    book.apply(inventory("dgx-h100", "n1"), live=False)
    real = Ledger._command

    def command(self: Ledger, uid: str, *args: Any) -> PartitionRequested:
        if uid == request(1, {}).uid:
            raise KeyError(("placement", 0))
        return real(self, uid, *args)

    monkeypatch.setattr(Ledger, "_command", command)
    [failed] = book.apply(request(1, mig("1g.10gb")))
    assert isinstance(failed, ClaimFailed) and failed.cause == "internal"
    assert "internal error: KeyError" in failed.reason and "nothing was allocated" in failed.reason
    assert book.decided[failed.uid] == "failed"
    assert book.fleet.allocation(failed.uid) is None
    assert failed.uid not in book.commands.values()
    after = book.apply(request(2, mig("1g.10gb")))
    # exactly what a ledger that never saw the failed claim decides: nothing of it is left behind
    baseline = ledger()
    baseline.apply(inventory("dgx-h100", "n1"), live=False)
    expected = baseline.apply(request(2, mig("1g.10gb")))

    def untimed(events: list[Event]) -> list[dict[str, Any]]:
        return [{k: v for k, v in msgspec.to_builtins(e).items() if k != "time"} for e in events]

    assert untimed(after) == untimed(expected)
    assert isinstance(after[-1], ClaimAllocated)
    assert book.snapshot()["held"] == baseline.snapshot()["held"]
