"""Which ResourceClaims Tangram decides, and what it writes back. Pure: no I/O.

The allocator reads claims, DeviceClasses and pods as the API server serves them (JSON) and turns
them into events; its decisions come back as `status.allocation` and as the removal of the
scheduling gate from the pods waiting for them.

Which classes and claims are Tangram's is the rule of `tangram.kubernetes.objects.classes` (shared with
admission); a claim naming a class the cluster does not have is left to kube-scheduler.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from tangram import DRIVER_NAME
from tangram.allocation.model import Allocated
from tangram.dra.names import SHARED_SUFFIX
from tangram.events import ClaimAllocated, ClaimReleased, ClaimRequested, GangMember, PreemptionPolicy
from tangram.events.ids import derived_id
from tangram.kubernetes.objects.classes import is_tangram_claim, is_tangram_class, requested_class_names
from tangram.kubernetes.objects.gates import holds_gate, remove_gate_patch
from tangram.quantity import binary_quantity

ClaimKind = Literal["tangram", "foreign", "allocated", "deleting"]


def class_names(claim: Mapping[str, Any]) -> list[str] | None:
    """Every class the claim's requests name, once each, in order; None when a request names none."""
    names = requested_class_names(claim.get("spec") or {})
    return list(dict.fromkeys(names)) if names else None


def is_tangrams(
    claim: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]], driver: str = DRIVER_NAME
) -> bool:
    """Every request names a class the cluster has, and every such class is the driver's."""
    return is_tangram_claim(
        claim.get("spec") or {}, lambda name: name in classes and is_tangram_class(classes[name], driver)
    )


def _metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def allocation_of(claim: Mapping[str, Any]) -> dict[str, Any] | None:
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, dict) else None
    return allocation if isinstance(allocation, dict) and allocation else None


def classify(
    claim: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]], driver: str = DRIVER_NAME
) -> ClaimKind:
    """What the allocator does with a claim: being deleted and allocated come before whose it is.

    A claim deleted while a pod still uses it (allocated, `status.reservedFor` not empty) is held
    until that pod is gone: the API server keeps it (its delete-protection finalizer), and the
    node keeps its devices prepared; releasing it early would hand them to another claim."""
    if _metadata(claim).get("deletionTimestamp") and not (
        allocation_of(claim) is not None and (claim.get("status") or {}).get("reservedFor")
    ):
        return "deleting"
    if allocation_of(claim) is not None:
        return "allocated"
    return "tangram" if is_tangrams(claim, classes, driver) else "foreign"


def holds_driver(allocation: Mapping[str, Any], driver: str = DRIVER_NAME) -> bool:
    devices = allocation.get("devices") or {}
    results = devices.get("results") or [] if isinstance(devices, dict) else []
    return any(isinstance(r, dict) and r.get("driver") == driver for r in results)


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


def claim_ref(claim: Mapping[str, Any]) -> ClaimRef:
    metadata = _metadata(claim)
    return ClaimRef(
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        uid=str(metadata.get("uid", "")),
    )


def request_id(claim: Mapping[str, Any], attempt: int = 0) -> str:
    """The de-duplication key of a claim's request: uid and generation (and the retry attempt)."""
    metadata = _metadata(claim)
    parts: list[object] = [metadata.get("uid", ""), metadata.get("generation", 0)]
    if attempt:
        parts.append(attempt)
    return derived_id("claim-requested", *parts)


def claim_requested(
    claim: Mapping[str, Any],
    classes: Mapping[str, Mapping[str, Any]],
    *,
    producer: str,
    attempt: int = 0,
    priority: int = 0,
    preemption_policy: PreemptionPolicy = "PreemptLowerPriority",
    protected: list[str] | None = None,
    gang: GangMember | None = None,
) -> ClaimRequested:
    """The request to decide a claim, carrying the classes it names as the cluster holds them, its
    pods' priority and preemption policy, and the group of pods it is placed with."""
    ref = claim_ref(claim)
    names = class_names(claim) or []
    return ClaimRequested(
        key=ref.uid,
        event_id=request_id(claim, attempt),
        producer=producer,
        namespace=ref.namespace,
        name=ref.name,
        uid=ref.uid,
        spec=dict(claim.get("spec") or {}),
        classes={n: _class_manifest(classes[n]) for n in names if n in classes},
        attempt=attempt,
        priority=priority,
        preemption_policy=preemption_policy,
        protected=list(protected or []),
        gang=gang,
    )


def claim_adopted(
    claim: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]], *, producer: str, priority: int = 0
) -> ClaimRequested:
    """A claim another writer allocated: its allocation, for the allocator to hold as taken (and,
    with its pods' priority, to preempt for a claim of higher priority)."""
    ref = claim_ref(claim)
    allocation = allocation_of(claim) or {}
    base = claim_requested(claim, classes, producer=producer)
    return ClaimRequested(
        key=base.key,
        event_id=derived_id("claim-adopted", ref.uid, _metadata(claim).get("generation", 0)),
        producer=producer,
        namespace=base.namespace,
        name=base.name,
        uid=base.uid,
        spec=base.spec,
        classes=base.classes,
        allocation=allocation,
        priority=priority,
    )


def claim_released(ref: ClaimRef, *, producer: str, attempt: int = 0, deleted: bool = False) -> ClaimReleased:
    """The release of the claim as decided at `attempt` (a claim deallocated and used again is
    asked, and released, again with a later attempt); `deleted` when the claim itself is gone, an
    event of its own (a claim deallocated, then deleted, is released twice)."""
    return ClaimReleased(
        key=ref.uid,
        event_id=derived_id("claim-deleted" if deleted else "claim-released", ref.uid, attempt),
        producer=producer,
        namespace=ref.namespace,
        name=ref.name,
        uid=ref.uid,
        deleted=deleted,
    )


def _class_manifest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """What of a DeviceClass decides: its name and spec (not its server-side metadata)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": _metadata(manifest).get("name", "")},
        "spec": dict(manifest.get("spec") or {}),
    }


def allocation_status(
    allocated: ClaimAllocated | Allocated, *, allocated_at: str | None = None
) -> dict[str, Any]:
    """`status.allocation` (resource.k8s.io/v1) for a decision: its devices, the configs from the
    class and the claim, a node selector naming the node, and when it was made, as kube-scheduler
    writes it.

    `allocated_at` (a Kubernetes Time) is what the allocation is stamped with. From 1.36, where
    device binding conditions are on, kube-scheduler stamps an allocation that has no timestamp
    when it reserves the claim for the pod, and the API server refuses that as a change to an
    allocation already set: the pod would never be bound. So every allocation Tangram writes
    carries one (the allocator's claim writer stamps what it writes)."""
    results: list[dict[str, Any]] = []
    for device in allocated.devices:
        result: dict[str, Any] = {
            "request": device.request,
            "driver": device.driver,
            "pool": device.pool,
            "device": device.device,
        }
        if device.admin_access:
            result["adminAccess"] = True
        if device.share is not None:
            # Where the API server serves consumable capacity, kube-scheduler counts the share as
            # Tangram does; elsewhere the server drops both fields and the node reads the share
            # from the claim's SharingConfig.
            result["shareID"] = device.share.id
            result["consumedCapacity"] = {"memory": binary_quantity(device.share.memory_bytes)}
        results.append(result)
    devices: dict[str, Any] = {"results": results}
    if allocated.config:
        devices["config"] = [dict(entry) for entry in allocated.config]
    status: dict[str, Any] = {
        "devices": devices,
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [allocated.node]}]}
            ]
        },
    }
    if allocated_at is not None:
        status["allocationTimestamp"] = allocated_at
    return status


def same_allocation(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Two allocations give the same devices (the API server may add defaults to what was written)."""

    def devices(allocation: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
        results = (allocation.get("devices") or {}).get("results") or []
        return sorted(
            (str(r.get("request")), str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
            for r in results
            if isinstance(r, dict)
        )

    return devices(a) == devices(b)


# --- pods -------------------------------------------------------------------------------------


def gated(pod: Mapping[str, Any]) -> bool:
    return holds_gate(pod)


def pod_claims(pod: Mapping[str, Any]) -> list[str] | None:
    """The names of the ResourceClaims the pod uses (in its namespace); None while a claim from a
    template is not made yet (the resourceclaim controller records it in the pod's status)."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    made = {
        s.get("name"): s.get("resourceClaimName")
        for s in status.get("resourceClaimStatuses") or []
        if isinstance(s, dict)
    }
    names: list[str] = []
    for entry in spec.get("resourceClaims") or []:
        if not isinstance(entry, dict):
            continue
        if entry.get("resourceClaimName"):
            names.append(str(entry["resourceClaimName"]))
        elif entry.get("resourceClaimTemplateName"):
            if entry.get("name") not in made:
                return None
            if made[entry.get("name")]:  # null: the controller decided the pod needs no claim
                names.append(str(made[entry.get("name")]))
    return names


def uses_claim(pod: Mapping[str, Any], claim: ClaimRef) -> bool:
    if _metadata(pod).get("namespace") != claim.namespace:
        return False
    return claim.name in (pod_claims(pod) or [])


def may_ungate(
    pod: Mapping[str, Any],
    claims: Mapping[tuple[str, str], Mapping[str, Any]],
    classes: Mapping[str, Mapping[str, Any]],
    driver: str = DRIVER_NAME,
) -> bool:
    """The gate may go once every claim of the pod exists and is allocated or is not Tangram's.

    `claims` is (namespace, name) -> the claim as last read. A pod with no Tangram claim at all
    is kube-scheduler's: its gate goes at once.
    """
    names = pod_claims(pod)
    if names is None:
        return False
    namespace = str(_metadata(pod).get("namespace", ""))
    for name in names:
        claim = claims.get((namespace, name))
        if claim is None:
            return False
        if classify(claim, classes, driver) in ("tangram", "deleting"):
            return False
    return True


def ungate_patch(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch lifting Tangram's gate (every other gate kept), valid only against the pod as
    read: its resourceVersion is tested first."""
    test = {"op": "test", "path": "/metadata/resourceVersion", "value": _metadata(pod).get("resourceVersion")}
    return [test, *(remove_gate_patch(pod) or [])]


# --- events -----------------------------------------------------------------------------------

UNSCHEDULABLE_REASON = "TangramUnschedulable"


KINDS = {"ResourceClaim": "resource.k8s.io/v1", "Pod": "v1"}


def warning_event(
    involved: Mapping[str, Any],
    kind: str,
    *,
    reason: str,
    message: str,
    now: str,
    component: str,
    suffix: str,
    event_type: str = "Warning",
) -> dict[str, Any]:
    """A core/v1 Event about `involved` (a claim or a pod as read; list items carry no kind, so it
    is given): a Warning unless `event_type` says Normal."""
    metadata = _metadata(involved)
    name = str(metadata.get("name", ""))
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{suffix}", "namespace": metadata.get("namespace", "")},
        "involvedObject": {
            "apiVersion": KINDS[kind],
            "kind": kind,
            "namespace": metadata.get("namespace", ""),
            "name": name,
            "uid": metadata.get("uid", ""),
            "resourceVersion": metadata.get("resourceVersion", ""),
        },
        "type": event_type,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


Claim = TypeVar("Claim", bound=Mapping[str, Any])


DeviceKey = tuple[Any, Any, Any]  # (driver, pool, device)


def held_devices(allocation: Mapping[str, Any]) -> set[DeviceKey]:
    """The devices an allocation holds for itself: an adminAccess result holds none, and a share
    host is held by several claims at once (its room is the allocator's to count)."""
    return {
        (r.get("driver"), r.get("pool"), r.get("device"))
        for r in (allocation.get("devices") or {}).get("results") or []
        if not r.get("adminAccess") and not str(r.get("device", "")).endswith(SHARED_SUFFIX)
    }


def taken_by_others(uid: str, allocation: Mapping[str, Any], claims: Iterable[Claim]) -> dict[str, Claim]:
    """device -> the claim (allocated by someone else, as last read) that holds a device of
    `allocation`, the one meant for claim `uid`."""
    wanted = held_devices(allocation)
    taken: dict[str, Claim] = {}
    for other in claims:
        theirs = allocation_of(other)
        if theirs is None or str(_metadata(other).get("uid", "")) == uid:
            continue
        for key in held_devices(theirs) & wanted:
            taken[str(key[2])] = other
    return taken
