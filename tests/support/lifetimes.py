"""A MIG claim's life on one node as the log tells it, on a clock of its own: what the services
that follow a node's claims fold, for the tests of what they forget."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from tangram.events import (
    AllocatedDevice,
    ClaimAllocated,
    ClaimReleased,
    Event,
    MigPlacement,
    PartitionApplied,
    PartitionFailed,
)

NODE = "node-a"
GPU = "GPU-0000"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def allocated(uid: str, start: int, when: datetime, *, gpu: str = GPU) -> ClaimAllocated:
    device = AllocatedDevice(
        request="r",
        driver="gpu.tangram.dev",
        pool=NODE,
        device="d",
        gpu_index=0,
        gpu_uuid=gpu,
        profile="1g.18gb",
        placement=MigPlacement(start=start, size=1),
        partition_command=f"{uid}-create",
    )
    return ClaimAllocated(
        key=uid,
        namespace="ns",
        name=uid,
        uid=uid,
        node=NODE,
        devices=[device],
        partitions=[f"{uid}-create"],
        time=when,
    )


def result(uid: str, action: str, when: datetime, *, node: str = NODE) -> PartitionApplied:
    return PartitionApplied(
        key=node,
        command_id=f"{uid}-{action}",
        node=node,
        action=action,  # type: ignore[arg-type]
        gpu_uuid=GPU,
        gpu_index=0,
        profile="1g.18gb",
        placement=MigPlacement(start=0, size=1),
        claim_uid=uid,
        mig_uuid="MIG-0",
        gpu_instance_id=7,
        compute_instance_id=0,
        time=when,
    )


def released(uid: str, when: datetime, *, deleted: bool = True) -> ClaimReleased:
    return ClaimReleased(key=uid, namespace="ns", name=uid, uid=uid, deleted=deleted, time=when)


def failed_create(uid: str, command_id: str, when: datetime, *, start: int = 0) -> PartitionFailed:
    return PartitionFailed(
        key=NODE,
        command_id=command_id,
        node=NODE,
        action="create",
        gpu_uuid=GPU,
        profile="1g.18gb",
        placement=MigPlacement(start=start, size=1),
        reason="no room",
        claim_uid=uid,
        time=when,
    )


def lifetime(
    fold: Callable[[Event], None], uid: str, minute: float, *, deleted: bool = True, retried: bool = False
) -> None:
    """A claim's whole life on the node, from a minute on: allocated, made (with `retried`, a second
    create of it failed), released (`deleted`, or only deallocated), unmade."""
    made = [result(uid, "create", at(minute))]
    if retried:
        made.append(failed_create(uid, f"{uid}-retry", at(minute)))
    for event in (
        allocated(uid, 0, at(minute)),
        *made,
        released(uid, at(minute + 0.5), deleted=deleted),
        result(uid, "destroy", at(minute + 0.5)),
    ):
        fold(event)
