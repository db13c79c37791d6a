"""Troubles of a running job's NVLink domain, told on its pods: a node of the domain left the
fleet, a GPU its claims hold there turned unhealthy (an XID or ECC error), the node's GPUs left the
domain's fabric clique, or the fabric reports degraded bandwidth there. Each trouble is told once,
as a Warning Event on every pod of the domain's claims; a trouble that clears and comes back is
told again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import CoreV1Api

from tangram.allocation.ledger import Ledger
from tangram.events.ids import derived_id
from tangram.kubernetes.api import KubeApiError
from tangram.kubernetes.api.events import record_event
from tangram.kubernetes.objects.claimbridge import warning_event
from tangram.kubernetes.objects.times import kube_time

log = logging.getLogger("tangram.allocator.kubernetes")

COMPONENT = "tangram-allocator"
DOMAIN_TROUBLE_REASON = "TangramNvlinkDomainTrouble"
# The pods that use a claim: (namespace, name, uid) -> pods as read
Users = Callable[[str, str, str], list[dict[str, Any]]]


class DomainWatch:
    def __init__(self, core: CoreV1Api, ledger: Ledger, users: Users, *, request_timeout_s: float) -> None:
        self._core = core
        self._ledger = ledger
        self._users = users
        self._timeout = request_timeout_s
        self._told: dict[tuple[str, str], str] = {}  # (domain, node) -> the trouble told
        self._queue: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue()

    def check(self) -> None:
        """Compare the domains' troubles with those told; queue the new ones."""
        troubles = self._ledger.domain_troubles()
        for key, trouble in troubles.items():
            if self._told.get(key) != trouble:
                self._told[key] = trouble
                self._queue.put_nowait((*key, trouble))
        for key in [k for k in self._told if k not in troubles]:
            del self._told[key]

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            domain, node, trouble = await self._queue.get()
            try:
                await self._tell(domain, node, trouble)
            except KubeApiError as error:
                log.warning(
                    "cannot tell an NVLink domain's trouble", extra={"domain": domain, "error": str(error)}
                )

    async def _tell(self, domain: str, node: str, trouble: str) -> None:
        message = (
            f"NVLink domain {domain}: {trouble}; the job's pods there may not reach the others over "
            "NVLink (its IMEX channel spans the domain's nodes)"
        )
        now = kube_time(datetime.now(UTC))
        suffix = derived_id(domain, node, trouble, "domain-trouble")[:16]
        log.warning("NVLink domain trouble", extra={"domain": domain, "node": node, "trouble": trouble})
        for uid in self._ledger.domain_members(domain):
            namespace, name = self._ledger.claims.get(uid, ("", ""))
            for pod in self._users(namespace, name, uid):
                event = warning_event(
                    pod,
                    "Pod",
                    reason=DOMAIN_TROUBLE_REASON,
                    message=message,
                    now=now,
                    component=COMPONENT,
                    suffix=suffix,
                )
                await record_event(self._core, event, timeout_s=self._timeout)
