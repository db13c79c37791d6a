"""The invariants of a chaos run on Kubernetes, judged from listings and the log (pure)."""

from __future__ import annotations

import random
from typing import Any

from tangram.chaos.kube.faults import KUBE_FAULT_KINDS, kube_fault_order
from tangram.chaos.kube.invariants import (
    allocated_by_uid,
    devices_held_twice,
    mig_devices_by_node,
    preemptors_placed_elsewhere,
)
from tangram.events import ClaimAllocated, ClaimPreempting, ClaimReleased, PreemptionVictim

DRIVER = "gpu.tangram.dev"


def claim(name: str, *devices: str, deleting: bool = False, reserved: bool = True) -> dict[str, Any]:
    results = [{"request": "gpus", "driver": DRIVER, "pool": "n1", "device": d} for d in devices]
    return {
        "metadata": {"name": name, "namespace": "chaos", "uid": f"uid-{name}"}
        | ({"deletionTimestamp": "2026-12-05T00:00:00Z"} if deleting else {}),
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": name, "uid": "p"}] if reserved else [],
        },
    }


def test_a_device_in_two_live_claims_is_a_violation_and_one_held_by_a_claim_no_pod_uses_is_not() -> None:
    assert devices_held_twice([claim("a", "gpu-1", "gpu-2"), claim("b", "gpu-2")]) == [
        "device n1/gpu-2 allocated to chaos/a and chaos/b"
    ]
    # deleted and unreserved: its node unprepared it, Tangram released it, its devices are free
    assert devices_held_twice([claim("a", "gpu-2", deleting=True, reserved=False), claim("b", "gpu-2")]) == []
    # deleted while its pod still runs: it still holds them
    assert devices_held_twice([claim("a", "gpu-2", deleting=True), claim("b", "gpu-2")]) != []
    assert devices_held_twice([claim("a", "gpu-2", deleting=True), claim("b", "gpu-2")], {"p"}) != []
    # reserved for a pod already gone (the claim controller behind): its node unprepared it
    assert devices_held_twice([claim("a", "gpu-2", deleting=True), claim("b", "gpu-2")], {"other"}) == []


def test_mig_devices_and_allocations_are_counted_for_live_claims_only() -> None:
    claims = [
        claim("a", "gpu-1-mig-1g-18gb-0", "gpu-2"),
        claim("b", "gpu-3-mig-1g-18gb-6", deleting=True, reserved=False),
        {"metadata": {"name": "c", "uid": "uid-c"}, "status": {}},
    ]
    assert mig_devices_by_node(claims) == {"n1": 1}
    assert allocated_by_uid(claims) == {"uid-a": "n1"}


def test_a_preemptor_allocated_off_its_reserved_node_is_a_violation() -> None:
    victim = PreemptionVictim(namespace="chaos", name="v", uid="uid-v", priority=100)
    preempting = ClaimPreempting(
        key="uid-p",
        namespace="chaos",
        name="p",
        uid="uid-p",
        node="n1",
        priority=1000,
        victims=[victim],
        reason="full",
    )

    def allocated(node: str) -> ClaimAllocated:
        return ClaimAllocated(key="uid-p", namespace="chaos", name="p", uid="uid-p", node=node, devices=[])

    assert preemptors_placed_elsewhere([preempting, allocated("n1")]) == []
    assert preemptors_placed_elsewhere([preempting, allocated("n2")]) == [
        "claim chaos/p preempted on node n1, allocated on n2"
    ]
    released = ClaimReleased(key="uid-p", namespace="chaos", name="p", uid="uid-p")
    assert preemptors_placed_elsewhere([preempting, released, allocated("n2")]) == []


def test_every_fault_kind_comes_once_a_round_in_a_seeded_order() -> None:
    first = kube_fault_order(random.Random(3))
    again = kube_fault_order(random.Random(3))
    rounds = [next(first) for _ in range(3 * len(KUBE_FAULT_KINDS))]
    assert rounds == [next(again) for _ in range(len(rounds))]
    for start in range(0, len(rounds), len(KUBE_FAULT_KINDS)):
        assert sorted(rounds[start : start + len(KUBE_FAULT_KINDS)]) == sorted(KUBE_FAULT_KINDS)
