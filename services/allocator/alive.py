"""The leading allocator's Lease (coordination.k8s.io/v1): Tangram's allocator is alive.

While the allocator leads in Kubernetes mode it renews the Lease `tangram-allocator` in its
namespace every second: created when missing, else replaced guarded by its resourceVersion (a
conflict reads it again). The admission webhook's gate keeper reads it (`tangram.kubernetes.objects.alive`): a
pod Tangram cannot place yet keeps its gate while the Lease is fresh. Errors are logged and
retried, never fatal; renewals stop when the allocator stops leading (the service stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import CoordinationV1Api

from tangram.kubernetes.api import KubeApiError, call_json
from tangram.kubernetes.objects.alive import ALLOCATOR_LEASE, RENEW_S, lease_spec

log = logging.getLogger("tangram.allocator.alive")


class AliveLease:
    def __init__(
        self,
        api: Any,
        *,
        namespace: str,
        holder: str,
        renew_s: float = RENEW_S,
        request_timeout_s: float = 5.0,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._coordination = CoordinationV1Api(api)
        self.namespace = namespace
        self.holder = holder
        self.renew_s = renew_s
        self._timeout = request_timeout_s
        self._now = now
        self._lease: dict[str, Any] | None = None  # as last read or written
        self.renewals = 0
        self.failures = 0  # renewals that failed (and were tried again)

    async def run(self, stop: asyncio.Event) -> None:
        failing = False
        while not stop.is_set():
            try:
                await self.renew()
            except Exception as error:
                if stop.is_set():
                    # stopping: the client may have been closed under the request (aiohttp then
                    # fails it with a RuntimeError, or an AssertionError on its closed connector)
                    return
                if not isinstance(error, KubeApiError | RuntimeError):
                    raise
                self.failures += 1
                self._lease = None  # read afresh next time
                if not failing:
                    log.warning(
                        "cannot renew the allocator's Lease; trying again",
                        extra={"lease": f"{self.namespace}/{ALLOCATOR_LEASE}", "error": str(error)},
                    )
                failing = True
            else:
                if failing:
                    log.info("the allocator's Lease is renewed again")
                failing = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.renew_s)

    async def renew(self) -> None:
        """Write the Lease once: create it when missing, else replace the version last seen."""
        lease = self._lease
        if lease is None:
            lease = await self._read()
        now = self._now()
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": ALLOCATOR_LEASE, "namespace": self.namespace},
                "spec": lease_spec(self.holder, now),
            }
            try:
                self._lease = await call_json(
                    f"create Lease {self.namespace}/{ALLOCATOR_LEASE}",
                    self._coordination.create_namespaced_lease(
                        self.namespace, body, _preload_content=False, _request_timeout=self._timeout
                    ),
                )
            except KubeApiError as error:
                if not error.already_exists:
                    raise
                self._lease = None  # another leader's: read and replace it next time
                return
            self.renewals += 1
            return
        spec = lease.get("spec") or {}
        acquired = spec.get("acquireTime") if spec.get("holderIdentity") == self.holder else None
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": ALLOCATOR_LEASE,
                "namespace": self.namespace,
                "resourceVersion": (lease.get("metadata") or {}).get("resourceVersion"),
            },
            "spec": lease_spec(self.holder, now, acquired=acquired),
        }
        try:
            self._lease = await call_json(
                f"renew Lease {self.namespace}/{ALLOCATOR_LEASE}",
                self._coordination.replace_namespaced_lease(
                    ALLOCATOR_LEASE,
                    self.namespace,
                    body,
                    _preload_content=False,
                    _request_timeout=self._timeout,
                ),
            )
        except KubeApiError as error:
            if not (error.conflict or error.not_found):
                raise
            self._lease = None  # changed or deleted meanwhile: read it again next time
            return
        self.renewals += 1

    async def _read(self) -> dict[str, Any] | None:
        try:
            return await call_json(
                f"read Lease {self.namespace}/{ALLOCATOR_LEASE}",
                self._coordination.read_namespaced_lease(
                    ALLOCATOR_LEASE, self.namespace, _preload_content=False, _request_timeout=self._timeout
                ),
            )
        except KubeApiError as error:
            if error.not_found:
                return None
            raise
