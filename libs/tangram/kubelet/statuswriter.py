"""A prepared claim's `status.devices` written to the API server, for people reading the claim.

The claim is read, this node's entries are replaced (tangram.kubelet.devicestatus decides what
they are and leaves every other driver's and node's alone) and the status is written back
through the status subresource, guarded by the resourceVersion just read: another writer in
between (kube-scheduler, the claim controller, another driver) makes it read again and retry.

It is a report, never a step of preparing: the devices are ready whether or not it is written.
So every failure is logged and counted (`tangram_cdi_claim_status_writes_total{result}`), never
raised, and the whole of it is bounded by a few seconds within kubelet's call. A claim that is
gone (404) or was made again under its name is no error. An API server that does not serve the
field (before Kubernetes 1.33, or with the DRAResourceClaimDeviceStatus gate off) drops it on
write without a word: that is seen in the object it answers with, counted, and logged once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

from kubernetes_asyncio.client import ResourceV1Api
from prometheus_client import Counter

from tangram.cdi.devices import ClaimRef, ResolvedAllocation
from tangram.events import NodeHardware
from tangram.kubelet.devicestatus import (
    device_entries,
    gpu_health,
    is_ours,
    status_devices,
    with_entries,
    without_entries,
)
from tangram.kubernetes.api import KubeApiError, call_json

log = logging.getLogger("tangram.kubelet.statuswriter")

Result = Literal["written", "unchanged", "gone", "unserved", "conflict", "failed"]
WRITES = Counter(
    "tangram_cdi_claim_status_writes_total",
    "Writes of prepared claims' status.devices, by result: written, unchanged (nothing to change), "
    "gone (the claim was deleted or made again), unserved (the API server dropped the field), "
    "conflict (other writers won every try), failed (an error or the time bound)",
    ["result"],
)
FIELD_MANAGER = "tangram-cdi"
WRITE_TRIES = 4
REQUEST_TIMEOUT_S = 5.0
# All tries of one claim together; kubelet's prepare call has 45 s and the devices are ready.
BUDGET_S = 10.0

Change = Callable[[dict[str, Any]], list[Any] | None]


class ClaimStatusWriter:
    """Writes and removes this node's entries in claims' `status.devices`."""

    def __init__(
        self,
        api: Any,
        *,
        driver: str,
        node: str,
        hardware: Callable[[], NodeHardware | None] = lambda: None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        budget_s: float = BUDGET_S,
        tries: int = WRITE_TRIES,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._api = ResourceV1Api(api)
        self.driver = driver
        self.node = node  # the pool of this node's devices
        self._hardware = hardware
        self._timeout = request_timeout_s
        self._budget = budget_s
        self._tries = tries
        self._clock = clock
        self._told_unserved = False

    async def prepared(self, allocation: ResolvedAllocation) -> Result:
        """This node's entries for the claim it prepared, as they are now (health included)."""

        def change(claim: dict[str, Any]) -> list[Any] | None:
            ours = device_entries(
                claim,
                allocation,
                driver=self.driver,
                pool=self.node,
                health=gpu_health(self._hardware()),
                now=self._clock(),
            )
            return with_entries(status_devices(claim), ours, driver=self.driver, pool=self.node)

        return await self._update(
            allocation.claim, allocation.claim.uid, change, "write the device status of"
        )

    async def unprepared(self, claim: ClaimRef) -> Result:
        """This node's entries removed; the claim may be gone already."""

        def change(found: dict[str, Any]) -> list[Any] | None:
            return without_entries(status_devices(found), driver=self.driver, pool=self.node)

        return await self._update(claim, claim.uid, change, "remove the device status of")

    async def _update(self, claim: ClaimRef, uid: str, change: Change, what: str) -> Result:
        result: Result
        try:
            async with asyncio.timeout(self._budget):
                result = await self._tried(claim, uid, change, what)
        except TimeoutError:
            log.warning(
                "claim status not written within %gs",
                self._budget,
                extra={"claim": f"{claim.namespace}/{claim.name}", "uid": uid},
            )
            result = "failed"
        except KubeApiError as error:
            log.warning(
                "claim status not written: %s", error, extra={"claim": f"{claim.namespace}/{claim.name}"}
            )
            result = "failed"
        WRITES.labels(result).inc()
        return result

    async def _tried(self, ref: ClaimRef, uid: str, change: Change, what: str) -> Result:
        for _ in range(self._tries):
            claim = await self._read(ref, uid)
            if claim is None:
                return "gone"
            devices = change(claim)
            if devices is None:
                return "unchanged"
            try:
                written = await self._replace(ref, claim, devices, what)
            except KubeApiError as error:
                if error.not_found:
                    return "gone"
                if error.conflict:
                    continue  # someone wrote the claim since it was read: read it again
                raise
            if self._dropped(devices, written):
                self._tell_unserved()
                return "unserved"
            return "written"
        log.warning(
            "claim status not written: other writers changed the claim at each of %d tries",
            self._tries,
            extra={"claim": f"{ref.namespace}/{ref.name}"},
        )
        return "conflict"

    async def _read(self, ref: ClaimRef, uid: str) -> dict[str, Any] | None:
        """The claim as the API server has it now; None when it is gone or is another claim now."""
        try:
            claim = await call_json(
                f"read ResourceClaim {ref.namespace}/{ref.name}",
                self._api.read_namespaced_resource_claim(
                    ref.name, ref.namespace, _preload_content=False, _request_timeout=self._timeout
                ),
            )
        except KubeApiError as error:
            if error.not_found:
                return None
            raise
        metadata = claim.get("metadata")
        return claim if isinstance(metadata, dict) and metadata.get("uid") == uid else None

    async def _replace(
        self, ref: ClaimRef, claim: dict[str, Any], devices: list[Any], what: str
    ) -> dict[str, Any]:
        status = {k: v for k, v in (claim.get("status") or {}).items() if k != "devices"}
        if devices:
            status["devices"] = devices
        # the resourceVersion read travels in the body: the write fails with a conflict if the
        # claim changed since
        body = {**claim, "status": status}
        return await call_json(
            f"{what} ResourceClaim {ref.namespace}/{ref.name}",
            self._api.replace_namespaced_resource_claim_status(
                ref.name,
                ref.namespace,
                body,
                field_manager=FIELD_MANAGER,
                _preload_content=False,
                _request_timeout=self._timeout,
            ),
        )

    def _dropped(self, sent: list[Any], written: dict[str, Any]) -> bool:
        """Entries of ours were sent and none came back: the server does not keep the field."""
        ours = [e for e in sent if is_ours(e, driver=self.driver, pool=self.node)]
        kept = [e for e in status_devices(written) if is_ours(e, driver=self.driver, pool=self.node)]
        return bool(ours) and not kept

    def _tell_unserved(self) -> None:
        if self._told_unserved:
            return
        self._told_unserved = True
        log.warning(
            "the API server does not keep ResourceClaim status.devices (Kubernetes before 1.33, or "
            "the DRAResourceClaimDeviceStatus feature gate off): prepared claims show no device status"
        )
