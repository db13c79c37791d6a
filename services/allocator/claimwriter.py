"""The allocator's decisions written back to the API server.

An allocation is written to the claim's `status.allocation`, guarded by the claim's
resourceVersion (re-read and retried on conflict; an allocation someone else wrote meanwhile is
adopted instead, and so is another claim that holds a device of the decision); the gates of the
pods that use the claim are lifted when the claims watch brings the allocation back. A failure
becomes a Warning Event on the claim and its pods, once per reason.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

from services.allocator.clusterview import WRITE_TRIES, ClusterView, key_of, uid_of
from services.allocator.gates import PodGates
from services.allocator.requester import ClaimRequester
from tangram.allocation.ledger import Ledger
from tangram.events import ClaimAllocated, ClaimFailed, ClaimRequested, Event
from tangram.events.ids import derived_id
from tangram.kubernetes.api import KubeApiError, call_json
from tangram.kubernetes.api.events import record_event
from tangram.kubernetes.objects.claimbridge import (
    UNSCHEDULABLE_REASON,
    ClaimRef,
    allocation_of,
    allocation_status,
    claim_adopted,
    claim_ref,
    held_devices,
    holds_driver,
    same_allocation,
    taken_by_others,
    warning_event,
)
from tangram.kubernetes.objects.times import kube_time

log = logging.getLogger("tangram.allocator.kubernetes")

Publish = Callable[[Event], Awaitable[object]]
COMPONENT = "tangram-allocator"


class ClaimWriter:
    def __init__(
        self,
        view: ClusterView,
        requester: ClaimRequester,
        gates: PodGates,
        *,
        resource: ResourceV1Api,
        core: CoreV1Api,
        ledger: Ledger,
        publish: Publish,
        producer: str,
        request_timeout_s: float,
    ) -> None:
        self._resource = resource
        self._core = core
        self._view = view
        self._ledger = ledger
        self._requester = requester
        self._gates = gates
        self._publish = publish
        self._producer = producer
        self._timeout = request_timeout_s
        self._adopted: set[str] = set()
        self._warned: dict[str, str] = {}  # uid -> the failure reason last recorded as an Event

    async def release(self, ref: ClaimRef, *, deleted: bool = False) -> bool:
        """Publish the claim's release where there is one (`ClaimRequester.release`); whether it
        was published. Released, a later failure of the claim is told again, even for the same reason."""
        released = self._requester.release(ref, deleted=deleted)
        if released is None:
            return False
        self._warned.pop(ref.uid, None)
        await self._publish(released)
        return True

    async def write(self, allocated: ClaimAllocated) -> None:
        self._requester.allocated(allocated.uid)
        self._warned.pop(allocated.uid, None)
        claim = self._view.claims.get((allocated.namespace, allocated.name))
        if claim is None or uid_of(claim) != allocated.uid:
            claim = await self.current_claim(allocated.namespace, allocated.name, allocated.uid)
            if claim is None:
                # Gone from Kubernetes: released as deleted. Its deletion may have been read while
                # nothing of it was decided here (a new leader reads deletions before it decides the
                # requests the previous leader sent), and then it released nothing.
                ref = ClaimRef(namespace=allocated.namespace, name=allocated.name, uid=allocated.uid)
                if await self.release(ref, deleted=True):
                    log.info(
                        "claim decided after its deletion released",
                        extra={"claim": f"{ref.namespace}/{ref.name}", "uid": ref.uid},
                    )
                return
        await self.write_allocation(claim, allocation_status(allocated), allocated.uid)

    async def current_claim(self, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        try:
            claim = await call_json(
                f"read ResourceClaim {namespace}/{name}",
                self._resource.read_namespaced_resource_claim(
                    name, namespace, _preload_content=False, _request_timeout=self._timeout
                ),
            )
        except KubeApiError as error:
            if error.not_found:
                return None
            raise
        return claim if uid_of(claim) == uid else None

    async def write_allocation(self, claim: dict[str, Any], allocation: dict[str, Any], uid: str) -> None:
        """status.allocation, against the claim as read; on conflict read again and retry.

        Every allocation is written with the time it is written (`allocationTimestamp`): kube-scheduler
        (1.36+) stamps one that has none when it reserves the claim, and the API server refuses that
        change to an allocation already set, so the pod would never be bound."""
        allocation = {"allocationTimestamp": kube_time(datetime.now(UTC)), **allocation}
        namespace, name = key_of(claim)
        for _ in range(WRITE_TRIES):
            current = allocation_of(claim)
            if current is not None:
                if not same_allocation(current, allocation) and uid not in self._adopted:
                    # someone else allocated it first: theirs stands, the ledger undoes ours
                    self._adopted.add(uid)
                    await self._publish(self._adopted_request(claim))
                break
            taken = taken_by_others(uid, allocation, self._view.claims.holding(held_devices(allocation)))
            if taken:
                # Another writer gave a device of this decision to another claim first: that
                # allocation stands, the ledger (told by its adoption) decides this claim again.
                log.warning(
                    "a device of the decision is allocated to another claim; not written",
                    extra={
                        "claim": f"{namespace}/{name}",
                        "taken": {device: "/".join(key_of(other)) for device, other in taken.items()},
                    },
                )
                for other in taken.values():
                    await self.adopt(other)
                return
            status = {**(claim.get("status") or {}), "allocation": allocation}
            found, written = await self._put_status(claim, status, "write the allocation of")
            if found is None:
                return
            claim = found
            if not written:
                continue
            log.info("claim allocation written", extra={"claim": f"{namespace}/{name}"})
            break
        # The gates are lifted once the claims watch brings the allocated claim (the bridge's
        # reconcile), never straight after the write: kube-scheduler's own watch of claims then has
        # it too, most likely. Lifted earlier, kube-scheduler could take the pod while its cache
        # still holds the claim unallocated, allocate it itself, fail at PreBind ("got allocated
        # elsewhere in the meantime") and try the pod again only after a backoff of a second.
        self._view.claims[(namespace, name)] = claim

    async def _put_status(
        self, claim: dict[str, Any], status: dict[str, Any], what: str
    ) -> tuple[dict[str, Any] | None, bool]:
        """Replace the claim's status, guarded by the resourceVersion it was read with. Returns the
        claim as written and True; on a conflict, the claim read again and False (None when it is
        gone, or is another claim of that name now)."""
        namespace, name = key_of(claim)
        body = {**claim, "status": status}
        try:
            written = await call_json(
                f"{what} ResourceClaim {namespace}/{name}",
                self._resource.replace_namespaced_resource_claim_status(
                    name,
                    namespace,
                    body,
                    field_manager=COMPONENT,
                    _preload_content=False,
                    _request_timeout=self._timeout,
                ),
            )
        except KubeApiError as error:
            if not (error.conflict or error.not_found):
                raise
            return await self.current_claim(namespace, name, uid_of(claim)), False
        return written, True

    async def adopt(self, claim: dict[str, Any]) -> None:
        """Tell the ledger of an allocation another writer made (once per claim)."""
        uid = uid_of(claim)
        allocation = allocation_of(claim) or {}
        if uid in self._adopted or self._ours(uid, allocation) or not holds_driver(allocation):
            return
        self._adopted.add(uid)
        self._requester.adopted(uid)
        await self._publish(self._adopted_request(claim))

    def _adopted_request(self, claim: dict[str, Any]) -> ClaimRequested:
        """The request telling the ledger of the claim's allocation, with its pods' priority."""
        return claim_adopted(
            claim, self._view.classes, producer=self._producer, priority=self._requester.rank(claim)[0]
        )

    async def _withdrawn(self, claim: dict[str, Any], allocation: dict[str, Any]) -> bool:
        """Remove the allocation this allocator wrote when another writer (kube-scheduler, for a
        pod the gate missed) allocated one of its devices to another claim in the same moment, and
        no pod uses the claim yet: the API server then holds each device once, and kube-scheduler
        allocates the claim for its pod (its gate is gone). False when it must stand."""
        uid = uid_of(claim)
        namespace, name = key_of(claim)
        for _ in range(WRITE_TRIES):
            current = allocation_of(claim)
            if current is None:
                return True
            others = taken_by_others(uid, current, self._view.claims.holding(held_devices(current)))
            if not others or (claim.get("status") or {}).get("reservedFor"):
                return False
            status = {k: v for k, v in (claim.get("status") or {}).items() if k != "allocation"}
            found, written = await self._put_status(claim, status, "withdraw the allocation of")
            if found is None:
                return True
            claim = found
            if not written:
                continue
            log.warning(
                "allocation withdrawn: another writer allocated one of its devices at the same time",
                extra={"claim": f"{namespace}/{name}", "taken": sorted(others)},
            )
            self._view.claims[(namespace, name)] = claim
            return True
        return False

    def _ours(self, uid: str, allocation: dict[str, Any]) -> bool:
        """The allocation is the one the ledger decided (written by this allocator)."""
        if self._ledger.decided.get(uid) != "allocated":
            return False
        held = self._ledger.fleet.allocation(uid)
        return held is not None and same_allocation(allocation_status(held), allocation)

    async def failed(self, failed: ClaimFailed) -> None:
        claim = self._view.claims.get((failed.namespace, failed.name))
        if claim is None or uid_of(claim) != failed.uid:
            return
        allocation = allocation_of(claim)
        if allocation is not None and holds_driver(allocation):
            if not await self._withdrawn(claim, allocation):
                # Failed after its allocation was written (its MIG instance could not be made, or
                # another writer's allocation of a device came in the same moment and a pod
                # already uses this one): the allocation stands in the API server and the node
                # prepares it, so the ledger holds its devices again rather than give them out.
                await self._publish(self._adopted_request(claim))
        else:
            self._requester.failed(failed.uid, failed.cause)
        if self._warned.get(failed.uid) == failed.reason:
            return  # asked again and failed for the same reason: said once is enough
        self._warned[failed.uid] = failed.reason
        now = kube_time(datetime.now(UTC))
        # one Event per reason: a group's member says it waits for its group, then why the group
        # does not fit, in the same attempt
        suffix = derived_id(failed.uid, failed.attempt, failed.reason, "unschedulable")[:16]
        users = self._gates.pods.users_of(claim_ref(claim))
        involved = [("ResourceClaim", claim)] + [("Pod", pod) for pod in users]
        for kind, obj in involved:
            event = warning_event(
                obj,
                kind,
                reason=UNSCHEDULABLE_REASON,
                message=failed.reason,
                now=now,
                component=COMPONENT,
                suffix=suffix,
            )
            await record_event(self._core, event, timeout_s=self._timeout)
