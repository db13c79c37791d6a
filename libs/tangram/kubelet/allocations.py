"""Where the plugin learns what a claim was allocated: one interface, fed here from events."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import NamedTuple, Protocol, TypeVar

import msgspec

from tangram import DRIVER_NAME
from tangram.cdi.devices import ClaimRef, ResolvedAllocation, ResolvedDevice, imex_grant
from tangram.dra.imex import imex_of
from tangram.events import (
    AllocatedDevice,
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    Event,
    GpuInfo,
    MigPlacement,
    NodeHardware,
    NodeInventory,
    PartitionApplied,
    PartitionFailed,
)
from tangram.events.attempts import SlotAttempts
from tangram.events.deletions import DeletedClaims

log = logging.getLogger("tangram.kubelet.allocations")
T = TypeVar("T")


class AllocationUnavailable(Exception):
    """The claim cannot be prepared now; the message says why and goes back to kubelet."""


class AllocationSource(Protocol):
    async def resolve(self, claim: ClaimRef, *, timeout_s: float) -> ResolvedAllocation:
        """The claim's allocation on this node, waiting at most `timeout_s` for a MIG instance.

        Raises AllocationUnavailable when it fails or does not become ready in time.
        """
        ...

    async def release(self, allocation: ResolvedAllocation) -> None:
        """The claim was unprepared: give back what preparing it made on the node (durably sent)."""
        ...


class Pending(Exception):
    """Not ready yet: the message says what is awaited (raised by what `wait_for` retries)."""


class InMemoryAllocationSource:
    """Folds inventory, allocation and partition events of one node; resolves claims from them.

    Claims decided by Tangram's allocator are resolved from its allocation events; devices
    allocated elsewhere (the API server) are resolved against the same inventory and partition
    results with `resolve_devices`.
    """

    def __init__(self, node: str, *, driver: str = DRIVER_NAME) -> None:
        self.node = node
        self.driver = driver
        self.hardware: NodeHardware | None = None
        self._gpus_by_index: dict[int, GpuInfo] = {}
        self._gpus_by_uuid: dict[str, GpuInfo] = {}
        self._allocations: dict[str, ClaimAllocated] = {}
        self._claim_failures: dict[str, str] = {}
        self._created: dict[str, PartitionApplied] = {}  # create results by command id
        self._partition_failures: dict[str, PartitionFailed] = {}  # by command id
        # each failed command or destroyed create of a claim's slot closes one attempt, so that a
        # later prepare of the same claim sends a new command, not the old id
        self._attempts = SlotAttempts()
        # A deleted claim is never prepared again: an hour past its deletion, by the releases'
        # times, what was kept of it goes (its slots' attempts, its commands' results).
        self.deleted = DeletedClaims()
        self._changed = asyncio.Event()

    def observe(self, event: Event) -> None:
        match event:
            case NodeInventory(hardware=hardware) if hardware.node == self.node:
                self.hardware = hardware
                self._gpus_by_index = {gpu.index: gpu for gpu in hardware.gpus}
                self._gpus_by_uuid = {gpu.uuid: gpu for gpu in hardware.gpus}
                partial = [
                    f"GPU {gpu.index} {m.profile}@{m.placement.start} uuid={m.uuid!r} "
                    f"minors={m.gi_cap_minor},{m.ci_cap_minor} ci={m.compute_instance_id}"
                    for gpu in hardware.gpus
                    for m in gpu.mig_instances
                    if not m.uuid or m.gi_cap_minor < 0 or m.ci_cap_minor < 0
                ]
                if partial:
                    log.warning(
                        "inventory reports MIG instances without UUID or capability minors",
                        extra={
                            "producer": event.producer,
                            "generation": event.generation,
                            "instances": partial,
                        },
                    )
            case ClaimAllocated(node=node, uid=uid) if node == self.node and uid not in self.deleted:
                # (a decision read after the claim's deletion was made before the allocator read
                # it, and holds nothing: `PartitionLedger.observe`)
                self._allocations[uid] = event
                self._claim_failures.pop(uid, None)
                for command_id in [c for c, f in self._partition_failures.items() if f.claim_uid == uid]:
                    if command_id not in event.partitions:
                        del self._partition_failures[command_id]
            case ClaimFailed(uid=uid, reason=reason):
                self._allocations.pop(uid, None)
                self._claim_failures[uid] = reason
            case ClaimReleased(uid=uid):
                released = self._allocations.pop(uid, None)
                self._claim_failures.pop(uid, None)
                for command_id in released.partitions if released is not None else []:
                    self._created.pop(command_id, None)
                self.deleted.note(event)
                self._forget_deleted(event.time)
            case PartitionApplied(node=node, action="create" | "disable-mig") if node == self.node:
                self._created[event.command_id] = event
            case PartitionApplied(node=node, action="destroy") if node == self.node:
                self._attempts.observe(event)
            case PartitionFailed(node=node) if node == self.node and event.action != "destroy":
                self._partition_failures[event.command_id] = event
                self._attempts.observe(event)
            case _:
                return
        self._changed.set()
        self._changed = asyncio.Event()

    def _forget_deleted(self, now: datetime) -> None:
        for uid in self.deleted.due(now):
            if uid in self._allocations:
                continue  # held: never a deleted uid (its release dropped it; a later decision is stale)
            self._attempts.forget(uid)
            for results in (self._created, self._partition_failures):
                for command_id in [c for c, result in results.items() if result.claim_uid == uid]:
                    del results[command_id]

    def sizes(self) -> dict[str, int]:
        """How many entries each of the per-claim and per-command maps holds."""
        return {
            "allocations": len(self._allocations),
            "claim_failures": len(self._claim_failures),
            "created": len(self._created),
            "partition_failures": len(self._partition_failures),
            "slot_attempts": len(self._attempts.saved()),
            "deleted": len(self.deleted.saved()),
        }

    async def resolve(self, claim: ClaimRef, *, timeout_s: float) -> ResolvedAllocation:
        return await self.wait_for(lambda: self._resolve_now(claim), timeout_s)

    async def release(self, allocation: ResolvedAllocation) -> None:
        """Nothing to do here: the allocator destroys the claim's instances when it is released."""

    def attempt(self, claim_uid: str, gpu_uuid: str, start: int) -> int:
        """Which command of this claim for this slot is current: one more after each failed create
        or disable-mig and each destroy, so a retry or a prepare after an unprepare acts anew."""
        return self._attempts.current(claim_uid, gpu_uuid, start)

    def held_by_others(self, device: str, claim_uid: str) -> bool:
        """Another live allocation on this node, as the allocator decided it, holds the device (a
        share host several claims share)."""
        return any(
            uid != claim_uid and any(d.device == device for d in allocation.devices)
            for uid, allocation in self._allocations.items()
        )

    def gpu(self, index: int) -> GpuInfo | None:
        return self._gpus_by_index.get(index)

    async def resolve_devices(
        self, claim: ClaimRef, devices: list[AllocatedDevice], *, timeout_s: float
    ) -> ResolvedAllocation:
        """Devices allocated outside the bus, each waiting for its partition command's result."""
        commands = {d.partition_command for d in devices if d.partition_command}

        def now() -> ResolvedAllocation:
            self._raise_partition_failure(commands, "")
            return ResolvedAllocation(claim=claim, devices=[self._resolve_device(d) for d in devices])

        return await self.wait_for(now, timeout_s)

    async def wait_for(self, attempt: Callable[[], T], timeout_s: float) -> T:
        """`attempt()` once it stops raising Pending, retried whenever an event was folded."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            changed = self._changed
            try:
                return attempt()
            except Pending as pending:
                waiting_for = str(pending)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AllocationUnavailable(f"timed out after {timeout_s:g} s {waiting_for}")
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                continue

    def _resolve_now(self, claim: ClaimRef) -> ResolvedAllocation:
        if claim.uid in self._claim_failures:
            raise AllocationUnavailable(f"claim allocation failed: {self._claim_failures[claim.uid]}")
        allocation = self._allocations.get(claim.uid)
        if allocation is None:
            raise Pending(f"waiting for the allocation of claim {claim.uid} on node {self.node}")
        self._raise_partition_failure(set(allocation.partitions), claim.uid)
        try:
            channel = imex_of(allocation.config, self.driver)
        except ValueError as error:
            raise AllocationUnavailable(
                f"claim {claim.uid}: its IMEX channel is unreadable: {error}"
            ) from None
        return ResolvedAllocation(
            claim=claim,
            devices=[self._resolve_device(device) for device in allocation.devices],
            imex=imex_grant(channel),
        )

    def _raise_partition_failure(self, commands: set[str], claim_uid: str) -> None:
        for failure in self._partition_failures.values():
            if failure.command_id in commands or (claim_uid and failure.claim_uid == claim_uid):
                detail = f" ({failure.nvml_error})" if failure.nvml_error else ""
                what = (
                    f"GPU {failure.gpu_uuid} could not leave MIG mode"
                    if failure.action == "disable-mig"
                    else f"MIG instance {failure.profile} at slices {failure.placement.start}"
                    f"+{failure.placement.size} of GPU {failure.gpu_uuid} could not be created"
                )
                raise AllocationUnavailable(f"{what}: {failure.reason}{detail}")

    def _instance_for(self, device: AllocatedDevice, gpu: GpuInfo) -> _Instance:
        """The claim's own create result; an instance found in the inventory only when none was made.

        Placements are reused as claims come and go, so an instance seen at the same slices before
        may be a previous claim's: only the result of this allocation's own command counts.
        """
        placement = device.placement
        assert placement is not None
        existing: _Instance | None
        if device.partition_command:
            result = self._created.get(device.partition_command)
            existing = (
                _Instance.of_result(result) if result is not None and result.gpu_uuid == gpu.uuid else None
            )
        else:
            existing = _existing_instance(gpu, placement)
            if existing is not None and not existing.complete:
                # An inventory read while the layout was changing can miss a MIG device's UUID;
                # the next read will have it, so wait for it rather than fail the claim.
                raise Pending(
                    f"waiting for the inventory to report the UUID and capability minors of MIG "
                    f"instance {device.profile} at slices {placement.start}+{placement.size} "
                    f"of GPU {gpu.uuid}"
                )
        if existing is None:
            raise Pending(
                f"waiting for MIG instance {device.profile} at slices {placement.start}+{placement.size} "
                f"of GPU {gpu.uuid}"
            )
        return existing

    def _resolve_device(self, device: AllocatedDevice) -> ResolvedDevice:
        gpu = self._gpus_by_uuid.get(device.gpu_uuid) or self._gpus_by_index.get(device.gpu_index)
        if gpu is None or gpu.uuid != device.gpu_uuid:
            raise Pending(f"waiting for GPU {device.gpu_uuid} in the inventory of node {self.node}")
        whole_gpu = ResolvedDevice(
            request=device.request,
            pool=device.pool,
            device=device.device,
            gpu_index=gpu.index,
            gpu_uuid=gpu.uuid,
            gpu_minor=gpu.minor,
            share=device.share,
        )
        if device.placement is None:
            if device.partition_command and device.partition_command not in self._created:
                raise Pending(f"waiting for GPU {gpu.uuid} to leave MIG mode for a whole-GPU claim")
            return whole_gpu
        instance = self._instance_for(device, gpu)
        if not instance.complete:
            raise AllocationUnavailable(
                f"MIG instance at slices {instance.placement.start}+{instance.placement.size} "
                f"of GPU {gpu.uuid} was reported without its UUID or capability device minors"
            )
        return msgspec.structs.replace(
            whole_gpu,
            mig_uuid=instance.mig_uuid,
            profile=device.profile or instance.profile,
            gi_cap_minor=instance.gi_cap_minor,
            ci_cap_minor=instance.ci_cap_minor,
            gpu_instance_id=instance.gpu_instance_id,
        )


class _Instance(NamedTuple):
    """What prepare needs of a MIG instance, from a create result or from the inventory."""

    mig_uuid: str
    profile: str
    placement: MigPlacement
    gi_cap_minor: int
    ci_cap_minor: int
    gpu_instance_id: int

    @classmethod
    def of_result(cls, result: PartitionApplied) -> _Instance:
        return cls(
            result.mig_uuid,
            result.profile,
            result.placement,
            result.gi_cap_minor,
            result.ci_cap_minor,
            result.gpu_instance_id,
        )

    @property
    def complete(self) -> bool:
        return bool(self.mig_uuid) and self.gi_cap_minor >= 0 and self.ci_cap_minor >= 0


def _existing_instance(gpu: GpuInfo, placement: MigPlacement) -> _Instance | None:
    """An instance the inventory shows at exactly the allocated placement (made before the claim).

    The allocator reuses such instances without a partition command, so no PartitionApplied
    names them; the inventory carries their UUID and capability minors instead.
    """
    for instance in gpu.mig_instances:
        if instance.placement == placement and instance.compute_instance_id >= 0:
            return _Instance(
                instance.uuid,
                instance.profile,
                instance.placement,
                instance.gi_cap_minor,
                instance.ci_cap_minor,
                instance.gpu_instance_id,
            )
    return None
