"""Claims resolved from the API server, the source of truth for claims in Kubernetes.

Kubelet names a claim; the plugin reads it, keeps the results of its own driver in this node's
pool, checks Tangram's opaque config, and maps each device name to this node's inventory. A MIG
placement is made by this node's partitioner: the create command's id is derived from the claim
uid and the slot (and how many earlier creates of that slot for the claim were closed), so a
retried prepare, a restarted plugin, and the allocator deciding the same claim all send the same
command, which the partitioner runs once. Unprepare sends the matching destroy; the partitioner
keeps the instance warm instead when its policy says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec
from kubernetes_asyncio.client import ResourceV1Api

from tangram.cdi.devices import ClaimRef, ResolvedAllocation, imex_grant
from tangram.dra import node_devices
from tangram.dra.model import Device
from tangram.events import AllocatedDevice, MigPlacement, PartitionAction, PartitionRequested, subject_token
from tangram.events.ids import command_event_id, partition_command_id
from tangram.kubelet.allocations import AllocationUnavailable, InMemoryAllocationSource, Pending
from tangram.kubelet.claimstatus import (
    ClaimAllocation,
    ClaimRefused,
    check_topology,
    read_allocation,
    reserved_pods,
)
from tangram.kubernetes.api import KubeApiError, call_json

log = logging.getLogger("tangram.kubelet.kubesource")

SendCommand = Callable[[PartitionRequested], Awaitable[object]]


class ClaimReader(Protocol):
    async def read(self, namespace: str, name: str) -> dict[str, Any]:
        """The ResourceClaim as the API server serves it (JSON); raises KubeApiError."""
        ...


class ApiClaimReader:
    """Reads ResourceClaims (resource.k8s.io/v1) as plain JSON: opaque parameters stay as written."""

    def __init__(self, api: Any, *, request_timeout_s: float = 10.0) -> None:
        self._api = ResourceV1Api(api)
        self._timeout = request_timeout_s

    async def read(self, namespace: str, name: str) -> dict[str, Any]:
        return await call_json(
            f"read ResourceClaim {namespace}/{name}",
            self._api.read_namespaced_resource_claim(
                name, namespace, _preload_content=False, _request_timeout=self._timeout
            ),
        )


class KubeAllocationSource:
    def __init__(
        self,
        *,
        node: str,
        driver: str,
        reader: ClaimReader,
        view: InMemoryAllocationSource,
        send: SendCommand,
        producer: str,
    ) -> None:
        self.node = node
        self.driver = driver
        self._reader = reader
        self._view = view
        self._send = send
        self._producer = producer
        self._key = subject_token(node)
        # share host -> claims this node prepares on it: the first makes (and the last destroys)
        # a MIG share host's instance, the others use it as the inventory shows it
        self._sharers: dict[str, set[str]] = {}

    async def resolve(self, claim: ClaimRef, *, timeout_s: float) -> ResolvedAllocation:
        try:
            obj = await self._reader.read(claim.namespace, claim.name)
        except KubeApiError as error:
            if error.not_found:
                raise AllocationUnavailable(
                    f"ResourceClaim {claim.namespace}/{claim.name} does not exist"
                ) from None
            raise AllocationUnavailable(f"cannot read the claim from the API server: {error}") from None
        try:
            allocation = read_allocation(obj, claim, driver=self.driver, pool=self.node)
        except ClaimRefused as error:
            raise AllocationUnavailable(str(error)) from None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        devices, commands = await self._view.wait_for(lambda: self._plan(claim, allocation), timeout_s)
        for command in commands:
            await self._send(command)
        remaining = max(deadline - loop.time(), 0.0)
        resolved = await self._view.resolve_devices(claim, devices, timeout_s=remaining)
        return msgspec.structs.replace(resolved, imex=imex_grant(allocation.imex), pods=reserved_pods(obj))

    def _plan(
        self, claim: ClaimRef, allocation: ClaimAllocation
    ) -> tuple[list[AllocatedDevice], list[PartitionRequested]]:
        hardware = self._view.hardware
        if hardware is None:
            raise Pending(f"waiting for the inventory of node {self.node}")
        by_name = {d.name: d for d in node_devices(hardware, driver=self.driver, shared=True).devices}
        for result in allocation.results:
            if result.device not in by_name:
                raise Pending(f"waiting for device {result.device} in the inventory of node {self.node}")
        try:
            check_topology(allocation, by_name, hardware, claim)
        except ClaimRefused as error:
            raise AllocationUnavailable(str(error)) from None
        devices: list[AllocatedDevice] = []
        commands: list[PartitionRequested] = []
        for result in allocation.results:
            device = by_name[result.device]
            joins = (
                device.shared
                and device.placement is not None
                and self._shared_with_others(device.name, claim.uid)
            )
            if device.shared:
                self._sharers.setdefault(device.name, set()).add(claim.uid)
            command = None if result.admin_access or joins else self._command_for(claim, device)
            if command is not None:
                commands.append(command)
            devices.append(
                AllocatedDevice(
                    request=result.request,
                    driver=self.driver,
                    pool=result.pool,
                    device=result.device,
                    gpu_index=device.gpu_index,
                    gpu_uuid=device.gpu_uuid,
                    profile=device.profile,
                    profile_id=device.profile_id,
                    placement=device.placement,
                    admin_access=result.admin_access,
                    partition_command=command.command_id if command is not None else "",
                    share=result.share,
                )
            )
        return devices, commands

    def _shared_with_others(self, device: str, claim_uid: str) -> bool:
        return bool(self._sharers.get(device, set()) - {claim_uid}) or self._view.held_by_others(
            device, claim_uid
        )

    def _command_for(self, claim: ClaimRef, device: Device) -> PartitionRequested | None:
        """The create of a MIG placement (reusing a free instance already there is the partitioner's
        call), or disable-mig for a whole GPU that can be in MIG mode; None for one that cannot."""
        if device.placement is not None and device.profile is not None and device.profile_id is not None:
            attempt = self._view.attempt(claim.uid, device.gpu_uuid, device.placement.start)
            return self._command(
                claim.uid,
                "create",
                gpu_index=device.gpu_index,
                gpu_uuid=device.gpu_uuid,
                profile=device.profile,
                profile_id=device.profile_id,
                placement=device.placement,
                attempt=attempt,
            )
        gpu = self._view.gpu(device.gpu_index)
        if gpu is not None and gpu.mig_capable:
            # Sent whether or not the inventory at hand shows MIG on: it may predate the last
            # create on this GPU, and the partitioner answers at once when MIG is already off.
            # Worded as the allocator words it: the whole GPU's slices, profile -1.
            whole = MigPlacement(start=0, size=max(gpu.memory_slices, 1))
            return self._command(
                claim.uid,
                "disable-mig",
                gpu_index=device.gpu_index,
                gpu_uuid=device.gpu_uuid,
                profile="",
                profile_id=-1,
                placement=whole,
                attempt=self._view.attempt(claim.uid, device.gpu_uuid, 0),
            )
        return None

    def _command(
        self,
        claim_uid: str,
        action: PartitionAction,
        *,
        gpu_index: int,
        gpu_uuid: str,
        profile: str,
        profile_id: int,
        placement: MigPlacement,
        attempt: int,
        mig_uuid: str = "",
    ) -> PartitionRequested:
        command_id = partition_command_id(
            claim_uid,
            action,
            gpu_index=gpu_index,
            profile_id=profile_id,
            start=placement.start,
            attempt=attempt,
        )
        return PartitionRequested(
            key=self._key,
            event_id=command_event_id(command_id),
            producer=self._producer,
            command_id=command_id,
            node=self.node,
            action=action,
            gpu_uuid=gpu_uuid,
            gpu_index=gpu_index,
            profile=profile,
            profile_id=profile_id,
            placement=placement,
            claim_uid=claim_uid,
            mig_uuid=mig_uuid,
        )

    async def release(self, allocation: ResolvedAllocation) -> None:
        """Destroy the MIG instances made for the claim; the command is durable once sent."""
        uid = allocation.claim.uid
        hardware = self._view.hardware
        # Device names are stable (GPU, profile, first slice): the inventory says where each sits.
        advertised = node_devices(hardware, driver=self.driver, shared=True).devices if hardware else []
        by_name = {d.name: d for d in advertised}
        for device in allocation.devices:
            sharers = self._sharers.get(device.device)
            if sharers is not None:
                sharers.discard(uid)
                if not sharers:
                    del self._sharers[device.device]
            if not device.is_mig:
                continue
            if device.share is not None and self._shared_with_others(device.device, uid):
                # the instance stays for the other shares of its host; the last one destroys it
                continue
            known = by_name.get(device.device)
            if known is None or known.placement is None or known.profile_id is None:
                log.warning(
                    "MIG instance of an unprepared claim not destroyed: its device is not in the inventory",
                    extra={"claim": uid, "device": device.device, "mig_uuid": device.mig_uuid},
                )
                continue
            command = self._command(
                uid,
                "destroy",
                gpu_index=known.gpu_index,
                gpu_uuid=known.gpu_uuid,
                profile=device.profile,
                profile_id=known.profile_id,
                placement=known.placement,
                attempt=self._view.attempt(uid, known.gpu_uuid, known.placement.start),
                mig_uuid=device.mig_uuid,
            )
            await self._send(command)
            log.info(
                "MIG instance of an unprepared claim sent for destruction",
                extra={"claim": uid, "mig_uuid": device.mig_uuid, "command_id": command.command_id},
            )
