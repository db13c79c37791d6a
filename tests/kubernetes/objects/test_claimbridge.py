"""Which claims Tangram decides, the events they become, and the status.allocation written back."""

from __future__ import annotations

from typing import Any

from tangram.allocation import DeviceClass, FleetState
from tangram.allocation.ledger import Ledger
from tangram.allocation.resolutions import KEPT_SPEC_BYTES
from tangram.cdi.devices import ClaimRef
from tangram.events import ClaimAllocated, decode, encode
from tangram.kubelet.claimstatus import read_allocation
from tangram.kubernetes.objects.claimbridge import (
    allocation_status,
    claim_adopted,
    claim_requested,
    classify,
    may_ungate,
    pod_claims,
    same_allocation,
    ungate_patch,
    warning_event,
)
from tangram.kubernetes.objects.classes import is_tangram_class
from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tests.allocator.helpers import inventory
from tests.support.driver import DRIVER

SHIPPED = {m["metadata"]["name"]: m for m in load_shipped_device_classes()}
UID = "0a1b2c3d-0000-4000-8000-000000000001"


def device_class(name: str, *expressions: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "resourceVersion": "7", "uid": "x"},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]},
    }


def claim(*requests: dict[str, Any], **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": "c", "namespace": "ns", "uid": UID, "generation": 1, "resourceVersion": "10"},
        "spec": {"devices": {"requests": list(requests)}},
    }
    obj.update(extra)
    return obj


def exactly(name: str, class_name: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": class_name, **more}}


def first_available(name: str, *class_names: str) -> dict[str, Any]:
    return {
        "name": name,
        "firstAvailable": [{"name": f"s{i}", "deviceClassName": c} for i, c in enumerate(class_names)],
    }


def test_the_shipped_classes_are_tangrams_and_a_class_without_selectors_is_not() -> None:
    # the rule itself is tangram.kubernetes.objects.classes' (its own tests), shared with admission
    assert all(is_tangram_class(m) for m in SHIPPED.values())
    assert not is_tangram_class({"metadata": {"name": "any"}, "spec": {}})


def test_a_claim_is_tangrams_when_every_class_it_names_is() -> None:
    custom = device_class("big.example", f'device.driver == "{DRIVER}"', "device.capacity['x'].memory > 1")
    nic = device_class("nic.example", 'device.driver == "nic.example.com"')
    classes = {**SHIPPED, "big.example": custom, "nic.example": nic}
    assert classify(claim(exactly("a", "gpu.tangram.dev")), classes) == "tangram"
    assert classify(claim(first_available("a", "mig.gpu.tangram.dev", "big.example")), classes) == "tangram"
    # a class created in the cluster counts like a shipped one
    assert classify(claim(exactly("a", "big.example")), classes) == "tangram"
    mixed = claim(exactly("a", "gpu.tangram.dev"), exactly("b", "nic.example"))
    assert classify(mixed, classes) == "foreign"
    assert classify(claim(first_available("a", "gpu.tangram.dev", "nic.example")), classes) == "foreign"
    assert classify(claim(exactly("a", "missing")), classes) == "foreign"
    assert classify(claim(), classes) == "foreign"


def test_deleting_and_allocated_come_before_whose_the_claim_is() -> None:
    tangram = claim(exactly("a", "gpu.tangram.dev"))
    allocated = {**tangram, "status": {"allocation": {"devices": {"results": []}}}}
    deleting = {**allocated, "metadata": {**tangram["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert classify(allocated, SHIPPED) == "allocated"
    assert classify(deleting, SHIPPED) == "deleting"
    assert classify({**tangram, "status": {"allocation": None}}, SHIPPED) == "tangram"


def test_a_claim_deleted_while_its_pod_still_uses_it_is_held_until_the_pod_is_gone() -> None:
    tangram = claim(exactly("a", "gpu.tangram.dev"))
    in_use = {
        **tangram,
        "metadata": {**tangram["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "status": {
            "allocation": {"devices": {"results": []}},
            "reservedFor": [{"resource": "pods", "name": "trainer", "uid": "p-1"}],
        },
    }
    assert classify(in_use, SHIPPED) == "allocated"
    unreserved = {**in_use, "status": {**in_use["status"], "reservedFor": []}}
    assert classify(unreserved, SHIPPED) == "deleting"


def test_the_request_carries_the_classes_and_is_keyed_by_uid_and_generation() -> None:
    obj = claim(exactly("a", "gpu.tangram.dev"))
    requested = claim_requested(obj, SHIPPED, producer="allocator")
    assert requested.uid == requested.key == UID and (requested.namespace, requested.name) == ("ns", "c")
    assert requested.spec == obj["spec"]
    assert requested.classes == {
        "gpu.tangram.dev": {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.tangram.dev"},
            "spec": SHIPPED["gpu.tangram.dev"]["spec"],
        }
    }
    assert claim_requested(obj, SHIPPED, producer="other").event_id == requested.event_id
    later = {**obj, "metadata": {**obj["metadata"], "generation": 2}}
    assert claim_requested(later, SHIPPED, producer="allocator").event_id != requested.event_id
    retry = claim_requested(obj, SHIPPED, producer="allocator", attempt=1)
    assert retry.attempt == 1 and retry.event_id != requested.event_id
    assert decode(encode(requested)) == requested


def test_the_ledger_decides_with_the_classes_the_request_carries() -> None:
    # the ledger's own classes know nothing of "narrow"; the request carries it
    narrow = device_class(
        "narrow", f'device.driver == "{DRIVER}"', 'device.attributes["gpu.tangram.dev"].index == 5'
    )
    book = Ledger(fleet=FleetState(), classes={})
    book.apply(inventory("hgx-h200", "n1"), live=False)
    request = claim_requested(claim(exactly("a", "narrow")), {"narrow": narrow}, producer="allocator")
    *_, allocated = book.apply(request)  # after the command taking GPU 5 out of MIG mode
    assert isinstance(allocated, ClaimAllocated)
    assert [d.gpu_index for d in allocated.devices] == [5]


def test_a_class_changed_in_the_cluster_decides_the_next_claim_with_the_same_spec() -> None:
    # Resolutions are kept per spec and per class: the same spec under a changed "narrow" class
    # must not be decided with the class as it was.
    book = Ledger(fleet=FleetState(), classes={})
    book.apply(inventory("hgx-h200", "n1"), live=False)
    decided: list[list[int]] = []
    for number, index in enumerate((5, 6, 5), start=1):
        narrow = device_class(
            "narrow",
            f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"',
            f'device.attributes["{DRIVER}"].index == {index}',
        )
        obj = claim(exactly("a", "narrow"))
        obj["metadata"] = {**obj["metadata"], "uid": UID[:-1] + str(number), "name": f"c{number}"}
        *_, outcome = book.apply(claim_requested(obj, {"narrow": narrow}, producer="allocator"))
        decided.append([d.gpu_index for d in outcome.devices] if isinstance(outcome, ClaimAllocated) else [])
    # the third asks for the whole GPU 5 again, which the first holds
    assert decided == [[5], [6], []]


def test_a_carried_class_too_long_to_keep_still_decides() -> None:
    narrow = device_class(
        "narrow",
        f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"',
        f'device.attributes["{DRIVER}"].index == 3',
    )
    narrow["metadata"]["annotations"] = {"note": "x" * KEPT_SPEC_BYTES}
    book = Ledger(fleet=FleetState(), classes={})
    book.apply(inventory("hgx-h200", "n1"), live=False)
    requested = claim_requested(claim(exactly("a", "narrow")), {"narrow": narrow}, producer="allocator")
    *_, allocated = book.apply(requested)
    assert isinstance(allocated, ClaimAllocated)
    assert [d.gpu_index for d in allocated.devices] == [3]


def _allocated(admin: bool = False) -> ClaimAllocated:
    book = Ledger(
        fleet=FleetState(),
        classes={c.name: c for c in (DeviceClass.from_manifest(m) for m in SHIPPED.values())},
    )
    book.apply(inventory("hgx-h200", "n1"), live=False)
    spec_claim = claim(
        exactly("gpu", "gpu.tangram.dev", count=2, **({"adminAccess": True} if admin else {})),
    )
    spec_claim["spec"]["devices"]["config"] = [
        {
            "requests": ["gpu"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "gpu.tangram.dev/v1alpha1",
                    "kind": "TopologyConfig",
                    "interconnect": "NVLink",
                },
            },
        }
    ]
    *_, allocated = book.apply(claim_requested(spec_claim, SHIPPED, producer="allocator"))
    assert isinstance(allocated, ClaimAllocated)
    return allocated


def test_the_allocation_is_what_the_node_reads_back() -> None:
    allocated = _allocated()
    status = allocation_status(allocated)
    assert status["nodeSelector"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
    }
    assert status["devices"]["config"] == [
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "gpu.tangram.dev/v1alpha1",
                    "kind": "TopologyConfig",
                    "interconnect": "NVLink",
                },
            },
        }
    ]
    assert all("adminAccess" not in r for r in status["devices"]["results"])
    obj = {"metadata": {"uid": UID, "name": "c", "namespace": "ns"}, "status": {"allocation": status}}
    read = read_allocation(obj, ClaimRef(namespace="ns", name="c", uid=UID), driver=DRIVER, pool="n1")
    assert [(r.request, r.pool, r.device) for r in read.results] == [
        (d.request, d.pool, d.device) for d in allocated.devices
    ]
    [rule] = read.topology
    assert rule.requests == frozenset({"gpu"}) and rule.config.interconnect == "NVLink"
    assert same_allocation(status, {"devices": {"results": list(reversed(status["devices"]["results"]))}})


def test_the_allocation_carries_the_time_it_was_made_when_given() -> None:
    # kube-scheduler (1.36+) refuses to bind a pod whose claim's allocation has no timestamp
    assert "allocationTimestamp" not in allocation_status(_allocated())
    stamped = allocation_status(_allocated(), allocated_at="2026-12-04T14:30:00Z")
    assert stamped["allocationTimestamp"] == "2026-12-04T14:30:00Z"
    assert same_allocation(stamped, allocation_status(_allocated()))


def test_admin_access_is_written_when_set() -> None:
    status = allocation_status(_allocated(admin=True))
    assert [r["adminAccess"] for r in status["devices"]["results"]] == [True, True]
    obj = {"metadata": {"uid": UID, "name": "c", "namespace": "ns"}, "status": {"allocation": status}}
    read = read_allocation(obj, ClaimRef(namespace="ns", name="c", uid=UID), driver=DRIVER, pool="n1")
    assert all(r.admin_access for r in read.results)


def test_an_adopted_claim_carries_the_other_writers_allocation() -> None:
    allocation = {
        "devices": {"results": [{"request": "a", "driver": DRIVER, "pool": "n1", "device": "gpu-3"}]}
    }
    obj = claim(exactly("a", "gpu.tangram.dev"), status={"allocation": allocation})
    adopted = claim_adopted(obj, SHIPPED, producer="allocator")
    assert adopted.allocation == allocation
    assert adopted.event_id != claim_requested(obj, SHIPPED, producer="allocator").event_id


def pod(
    *entries: dict[str, Any], statuses: list[dict[str, Any]] | None = None, gates: bool = True
) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "42"},
        "spec": {
            "schedulingGates": [{"name": "other/gate"}, {"name": SCHEDULING_GATE}] if gates else [],
            "resourceClaims": list(entries),
        },
        "status": {"resourceClaimStatuses": statuses} if statuses is not None else {},
    }


def test_a_pods_claims_are_named_directly_or_through_its_status() -> None:
    direct = {"name": "x", "resourceClaimName": "shared"}
    from_template = {"name": "y", "resourceClaimTemplateName": "t"}
    assert pod_claims(pod(direct)) == ["shared"]
    assert pod_claims(pod(direct, from_template)) is None  # the claim is not made yet
    made = [{"name": "y", "resourceClaimName": "p-y-abcde"}]
    assert pod_claims(pod(direct, from_template, statuses=made)) == ["shared", "p-y-abcde"]
    assert pod_claims(pod(from_template, statuses=[{"name": "y"}])) == []


def test_the_gate_goes_once_every_tangram_claim_is_allocated() -> None:
    tangram = claim(exactly("a", "gpu.tangram.dev"))
    tangram["metadata"]["name"] = "shared"
    nic = device_class("nic.example", 'device.driver == "nic.example.com"')
    foreign = claim(exactly("a", "nic.example"))
    foreign["metadata"]["name"] = "nic"
    classes = {**SHIPPED, "nic.example": nic}
    waiting = pod({"name": "x", "resourceClaimName": "shared"}, {"name": "z", "resourceClaimName": "nic"})
    assert not may_ungate(waiting, {("ns", "nic"): foreign}, classes)  # a claim not seen yet
    assert not may_ungate(waiting, {("ns", "shared"): tangram, ("ns", "nic"): foreign}, classes)
    allocated = {**tangram, "status": {"allocation": {"devices": {"results": []}}}}
    assert may_ungate(waiting, {("ns", "shared"): allocated, ("ns", "nic"): foreign}, classes)
    # only other drivers' claims: kube-scheduler's pod at once
    assert may_ungate(pod({"name": "z", "resourceClaimName": "nic"}), {("ns", "nic"): foreign}, classes)


def test_the_gate_patch_keeps_other_gates_and_holds_only_against_the_pod_read() -> None:
    assert ungate_patch(pod()) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "test", "path": "/spec/schedulingGates/1/name", "value": SCHEDULING_GATE},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
    ]


def test_a_failure_event_names_the_object_and_the_reason() -> None:
    obj = claim(exactly("a", "gpu.tangram.dev"))
    event = warning_event(
        obj,
        "ResourceClaim",
        reason="TangramUnschedulable",
        message="node n1: no free GPU",
        now="t",
        component="c",
        suffix="s",
    )
    assert event["type"] == "Warning" and event["reason"] == "TangramUnschedulable"
    assert event["involvedObject"] == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "namespace": "ns",
        "name": "c",
        "uid": UID,
        "resourceVersion": "10",
    }
    assert event["message"] == "node n1: no free GPU" and event["metadata"]["namespace"] == "ns"
