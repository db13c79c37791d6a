"""Allocations made outside the allocator (kube-scheduler), learned from the node's prepare events."""

from __future__ import annotations

from typing import Any

from tangram.allocation import FleetState
from tangram.allocation.ledger import Ledger
from tangram.events import (
    ClaimAllocated,
    ClaimFailed,
    ClaimPrepared,
    ClaimUnprepared,
    Event,
    MigPlacement,
    PartitionApplied,
    PartitionFailed,
    PreparedDevice,
    subject_token,
)

from .helpers import CLASSES, inventory, released, request

NODE = "n1"
KUBE_UID = "7a1c0000-0000-4000-8000-00000000beef"


def gpu_between(low: int, high: int) -> dict[str, Any]:
    index = 'device.attributes["gpu.tangram.dev"].index'
    return {
        "devices": {
            "requests": [
                {
                    "name": "gpus",
                    "exactly": {
                        "deviceClassName": "gpu.tangram.dev",
                        "selectors": [{"cel": {"expression": f"{index} >= {low} && {index} <= {high}"}}],
                    },
                }
            ]
        }
    }


def prepared(device: str, *, uid: str = KUBE_UID, node: str = NODE, key: str | None = None) -> ClaimPrepared:
    return ClaimPrepared(
        key=key or subject_token(node),
        node=node,
        namespace="ml",
        name="scheduled-by-kube",
        uid=uid,
        devices=[
            PreparedDevice(request="gpu", pool=node, device=device, cdi_device_ids=[f"x/claim={device}"])
        ],
    )


def unprepared(*, uid: str = KUBE_UID) -> ClaimUnprepared:
    return ClaimUnprepared(
        key=subject_token(NODE), node=NODE, namespace="ml", name="scheduled-by-kube", uid=uid
    )


def ledger(*history: Event) -> Ledger:
    book = Ledger(fleet=FleetState(), classes=CLASSES)
    book.apply(inventory("hgx-h200", NODE), live=False)
    for event in history:
        book.apply(event, live=False)
    return book


def devices_of(outputs: list[Event]) -> list[str]:
    [allocated] = [e for e in outputs if isinstance(e, ClaimAllocated)]
    return [d.device for d in allocated.devices]


def test_a_gpu_kube_scheduler_allocated_is_not_given_to_a_bus_claim() -> None:
    book = ledger()
    book.apply(prepared("gpu-3"))
    assert devices_of(book.apply(request(1, gpu_between(3, 4)))) == ["gpu-4"]
    failed = book.apply(request(2, gpu_between(3, 3)))
    assert [type(e) for e in failed] == [ClaimFailed]
    # Unprepared: the GPU is free again.
    book.apply(unprepared())
    assert devices_of(book.apply(request(3, gpu_between(3, 3)))) == ["gpu-3"]


def test_a_mig_placement_kube_scheduler_allocated_holds_its_gpu() -> None:
    book = ledger()
    book.apply(prepared("gpu-5-mig-7g-141gb-0"))
    [failed] = book.apply(request(1, gpu_between(5, 5)))
    assert isinstance(failed, ClaimFailed)
    assert devices_of(book.apply(request(2, gpu_between(5, 6)))) == ["gpu-6"]


def test_a_rebuild_from_the_log_holds_the_same_devices() -> None:
    book = ledger(prepared("gpu-3"))
    assert devices_of(book.apply(request(1, gpu_between(3, 4)))) == ["gpu-4"]
    after_unprepare = ledger(prepared("gpu-3"), unprepared())
    assert devices_of(after_unprepare.apply(request(1, gpu_between(3, 4)))) == ["gpu-3"]


def test_the_prepare_of_a_claim_the_allocator_decided_changes_nothing() -> None:
    book = ledger()
    claim = request(1, gpu_between(3, 3))
    assert devices_of(book.apply(claim)) == ["gpu-3"]
    before = book.fleet.snapshot()
    book.apply(prepared("gpu-3", uid=claim.uid))
    book.apply(unprepared(uid=claim.uid))  # its release comes from the claim log, not the node
    assert book.fleet.snapshot() == before
    assert book.outside == {}


def test_a_prepare_said_on_another_nodes_subject_is_ignored() -> None:
    book = ledger()
    book.apply(prepared("gpu-3", key=subject_token("n2")))
    assert book.outside == {}
    assert devices_of(book.apply(request(1, gpu_between(3, 3)))) == ["gpu-3"]


def test_a_device_both_deciders_gave_out_is_reported_and_counted_once() -> None:
    book = ledger()
    assert devices_of(book.apply(request(1, gpu_between(3, 3)))) == ["gpu-3"]
    book.apply(prepared("gpu-3"))
    assert len(book.conflicts) == 1 and "device gpu-3 of node n1" in book.conflicts[0]
    assert book.fleet.snapshot()["nodes"][NODE]["allocated"]["gpu-3"] == request(1, {}).uid


def _own_create_result(uid: str, *, command_id: str, node: str = NODE, failed: bool = False) -> Event:
    fields: dict[str, Any] = {
        "key": subject_token(node),
        "command_id": command_id,
        "node": node,
        "action": "create",
        "gpu_uuid": "GPU-5",
        "profile": "7g.141gb",
        "placement": MigPlacement(start=0, size=8),
        "claim_uid": uid,
    }
    if failed:
        return PartitionFailed(**fields, reason="no room")
    return PartitionApplied(**fields, gpu_index=5, mig_uuid="MIG-1")


def test_the_results_of_a_nodes_own_commands_are_believed_to_change_nothing() -> None:
    """The node makes the MIG instances of the claims kube-scheduler allocated: their results
    name a claim the allocator never decided, are not dead-lettered, and change no decision."""
    book = ledger()
    claim = request(1, gpu_between(3, 3))
    assert devices_of(book.apply(claim)) == ["gpu-3"]
    for result in (
        _own_create_result(KUBE_UID, command_id="node-own"),
        _own_create_result(KUBE_UID, command_id="node-own-2", failed=True),
    ):
        assert isinstance(result, PartitionApplied | PartitionFailed)
        assert book.unanswered(result) is None
        assert book.apply(result) == []
    assert book.created == {} and book.decided == {claim.uid: "allocated"}


def test_a_made_up_result_for_a_claim_the_allocator_decided_is_still_refused() -> None:
    book = ledger()
    claim = request(1, gpu_between(3, 3))
    assert devices_of(book.apply(claim)) == ["gpu-3"]
    forged = _own_create_result(claim.uid, command_id="made-up", failed=True)
    assert isinstance(forged, PartitionFailed)
    assert book.unanswered(forged) == "create result for command 'made-up', which was never sent"
    assert book.apply(forged) == []
    assert book.decided[claim.uid] == "allocated"


def test_a_device_both_deciders_gave_out_goes_to_the_other_claim_when_the_first_is_released() -> None:
    """The pods of the claim kube-scheduler allocated still run on the GPU once the allocator's
    claim is released: the GPU is theirs until their node unprepares it, never given out again."""
    book = ledger()
    ours = request(1, gpu_between(3, 3))
    assert devices_of(book.apply(ours)) == ["gpu-3"]
    book.apply(prepared("gpu-3"))
    book.apply(released(ours))
    assert book.fleet.snapshot()["nodes"][NODE]["allocated"] == {"gpu-3": KUBE_UID}
    [failed] = book.apply(request(2, gpu_between(3, 3)))
    assert isinstance(failed, ClaimFailed)
    book.apply(unprepared())
    assert devices_of(book.apply(request(3, gpu_between(3, 3)))) == ["gpu-3"]


def test_a_contested_device_is_held_alike_whichever_of_prepare_and_release_is_folded_first() -> None:
    """Where the prepare falls against the release is timing: live, a rebuild and a replay fold
    them in either order, and each must hold the GPU for the claim whose pods run on it."""
    ours = request(1, gpu_between(3, 3))
    first = ledger()
    first.apply(ours)
    second = ledger()
    second.apply(ours)
    first.apply(prepared("gpu-3"), live=False)
    first.apply(released(ours), live=False)
    second.apply(released(ours), live=False)
    second.apply(prepared("gpu-3"), live=False)
    assert first.fleet.snapshot() == second.fleet.snapshot()
    assert first.fleet.snapshot()["nodes"][NODE]["allocated"] == {"gpu-3": KUBE_UID}
