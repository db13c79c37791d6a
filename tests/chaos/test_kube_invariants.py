"""The invariants of a chaos run on Kubernetes, judged from listings and the log (pure)."""

from __future__ import annotations

import random
from typing import Any

import msgspec

from tangram.chaos.kube.faults import KUBE_FAULT_KINDS, kube_fault_order
from tangram.chaos.kube.invariants import (
    allocated_by_uid,
    devices_held_twice,
    mig_devices_by_node,
    mig_instances_differ,
    reserved_nodes_taken,
)
from tangram.events import (
    ClaimAllocated,
    ClaimFailed,
    ClaimPreempting,
    ClaimReleased,
    ClaimRequested,
    GangMember,
    PreemptionVictim,
)

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
    assert mig_devices_by_node(claims) == {"n1": ["gpu-1-mig-1g-18gb-0"]}
    assert allocated_by_uid(claims) == {"uid-a": "n1"}


def test_a_claim_not_above_the_preemptor_allocated_on_its_reserved_node_is_a_violation() -> None:
    victim = PreemptionVictim(namespace="chaos", name="v", uid="uid-v", priority=100)
    preempting = ClaimPreempting(
        key="uid-p",
        namespace="chaos",
        name="p",
        uid="uid-p",
        node="n1",
        priority=500,
        victims=[victim],
        reason="full",
    )

    def asked(name: str, priority: int) -> ClaimRequested:
        return ClaimRequested(
            key=f"uid-{name}", namespace="chaos", name=name, uid=f"uid-{name}", spec={}, priority=priority
        )

    def allocated(name: str, node: str) -> ClaimAllocated:
        return ClaimAllocated(
            key=f"uid-{name}", namespace="chaos", name=name, uid=f"uid-{name}", node=node, devices=[]
        )

    def failed(reserved_node: str) -> ClaimFailed:
        return ClaimFailed(
            key="uid-p", namespace="chaos", name="p", uid="uid-p", reason="full", reserved_node=reserved_node
        )

    before = [asked("p", 500), asked("low", 100), asked("same", 500), asked("high", 1000), preempting]
    assert reserved_nodes_taken([*before, allocated("low", "n1")]) == [
        "claim chaos/low (priority 100) allocated on node n1, reserved for chaos/p (priority 500)"
    ]
    assert len(reserved_nodes_taken([*before, failed("n1"), allocated("same", "n1")])) == 1
    # above the preemptor, on another node, or the preemptor's own: none is a violation
    assert reserved_nodes_taken([*before, allocated("high", "n1"), allocated("low", "n2")]) == []
    assert reserved_nodes_taken([*before, allocated("p", "n1"), allocated("low", "n1")]) == []
    # the preemptor placed elsewhere first (capacity freed there) ends the reservation
    assert reserved_nodes_taken([*before, allocated("p", "n2"), allocated("low", "n1")]) == []
    # given up (a failure naming no reserved node), or moved by a failure naming another node
    assert reserved_nodes_taken([*before, failed(""), allocated("low", "n1")]) == []
    assert reserved_nodes_taken([*before, failed("n2"), allocated("low", "n1")]) == []
    assert len(reserved_nodes_taken([*before, failed("n2"), allocated("low", "n2")])) == 1
    released = ClaimReleased(key="uid-p", namespace="chaos", name="p", uid="uid-p")
    assert reserved_nodes_taken([*before, released, allocated("low", "n1")]) == []

    # a group preempts for all its claims: another claim of the preemptor's group may take the
    # node, a claim of another group of the same name elsewhere may not
    def in_group(name: str, group: str, namespace: str = "chaos") -> ClaimRequested:
        gang = GangMember(group=group, size=2, pod=f"pod-{name}")
        return msgspec.structs.replace(asked(name, 500), gang=gang, namespace=namespace)

    grouped = [in_group("p", "train"), in_group("mate", "train"), in_group("other", "train", "elsewhere")]
    assert reserved_nodes_taken([*grouped, preempting, allocated("mate", "n1")]) == []
    assert len(reserved_nodes_taken([*grouped, preempting, allocated("other", "n1")])) == 1


def test_every_fault_kind_comes_once_a_round_in_a_seeded_order() -> None:
    first = kube_fault_order(random.Random(3))
    again = kube_fault_order(random.Random(3))
    rounds = [next(first) for _ in range(3 * len(KUBE_FAULT_KINDS))]
    assert rounds == [next(again) for _ in range(len(rounds))]
    for start in range(0, len(rounds), len(KUBE_FAULT_KINDS)):
        assert sorted(rounds[start : start + len(KUBE_FAULT_KINDS)]) == sorted(KUBE_FAULT_KINDS)


def test_mig_instances_differ_names_each_instance_on_one_side_only() -> None:
    made = {"MIG-a": "gpu-0-mig-1g-18gb-0", "MIG-b": "gpu-0-mig-1g-18gb-1", "MIG-c": "gpu-1-mig-3g-71gb-4"}
    assert (
        mig_instances_differ(
            "n1", made, ["gpu-0-mig-1g-18gb-1", "gpu-1-mig-3g-71gb-4", "gpu-0-mig-1g-18gb-0"]
        )
        is None
    )
    assert mig_instances_differ("n1", made, ["gpu-0-mig-1g-18gb-1", "gpu-1-mig-3g-71gb-4"]) == (
        "node n1: 3 MIG instances made by Tangram, 2 allocated; "
        "made but held by no live claim: gpu-0-mig-1g-18gb-0 (MIG-a); held but not made: none"
    )
    assert mig_instances_differ("n1", {}, ["gpu-2-mig-1g-18gb-0"]) == (
        "node n1: 0 MIG instances made by Tangram, 1 allocated; "
        "made but held by no live claim: none; held but not made: gpu-2-mig-1g-18gb-0"
    )
