"""The gate timeout: a pod Tangram has not released within `timeout_s` goes to kube-scheduler.

Tangram's allocator removes the scheduling gate once it has written a claim's allocation. With
every allocator down nothing would ever remove it, and the pod would wait for ever; so the
admission webhook, which runs as its own Deployment, lists and watches the pods holding the gate
(every namespace; the API server cannot select pods by scheduling gate, so each pod is judged by
`expired_gates`) and removes the gate from any pod that has held it longer than the timeout,
measured from the pod's creation. kube-scheduler then allocates the pod's claims itself, and the
allocator, once it runs again, adopts what kube-scheduler allocated into its ledger (it watches
every claim and holds another writer's allocation as taken), so no device is given twice.

Every replica of the webhook runs this, and none needs to lead: the removal is a JSONPatch that
tests the pod's resourceVersion and the gate's position first, so of two replicas removing the same
gate one succeeds and the other is refused (409/422), reads the pod again and finds nothing left
to do.

Only with the allocator down: a pod Tangram cannot place yet stays pending while the allocator is
alive (it retries the claim when capacity frees). Each tick the keeper reads the allocator's Lease
(`tangram-allocator`, which the leading allocator renews every second; `tangram.kubernetes.objects.alive`): it
lifts gates only when that Lease is missing or was last renewed longer ago than the gate timeout,
and then only from pods that have held the gate longer than the timeout (from their creation). A
Lease it cannot read (other than missing) lifts nothing that tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import CoordinationV1Api, CoreV1Api
from prometheus_client import Counter

from tangram.kubernetes.api import KubeApiError, call_json
from tangram.kubernetes.api.events import record_event
from tangram.kubernetes.api.watching import list_then_watch
from tangram.kubernetes.objects.alive import ALLOCATOR_LEASE, allocator_alive
from tangram.kubernetes.objects.claimbridge import warning_event
from tangram.kubernetes.objects.gangs import GANG_LABEL
from tangram.kubernetes.objects.gates import holds_gate, remove_gate_patch
from tangram.kubernetes.objects.times import kube_time, parse_time

log = logging.getLogger("tangram.admission.gatekeeper")

REASON = "TangramGateTimeout"
COMPONENT = "tangram-admission"
TRIES = 5

GATES_TIMED_OUT = Counter(
    "tangram_admission_gates_timed_out_total",
    "Scheduling gates removed because Tangram had not allocated the pod's claims within the gate "
    "timeout (kube-scheduler allocates them instead)",
)
GATES_KEPT = Counter(
    "tangram_admission_gates_kept_total",
    "Pods held past the gate timeout whose gate stays because the allocator is alive (its Lease "
    "is fresh): Tangram retries their claims when capacity frees",
)


@dataclass(frozen=True)
class Expired:
    namespace: str
    name: str
    held_s: float  # how long the pod has held the gate (since its creation)


def _created(pod: Mapping[str, Any]) -> datetime | None:
    return parse_time((pod.get("metadata") or {}).get("creationTimestamp"))


def expired_gates(pods: Iterable[Mapping[str, Any]], now: datetime, timeout_s: float) -> list[Expired]:
    """The pods (as the API server sends them) that have held Tangram's gate for `timeout_s` or
    longer, oldest first. A timeout of 0 or less expires nothing (the timeout is off); a pod being
    deleted, or without a readable creation time, is left alone. So is a pod of a group of pods
    (gang): kube-scheduler would place its pods one at a time, and a part of the group would hold
    GPUs idle while the rest waits; the group waits for the allocator instead."""
    if timeout_s <= 0:
        return []
    found = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        if not holds_gate(pod) or metadata.get("deletionTimestamp"):
            continue
        if (metadata.get("labels") or {}).get(GANG_LABEL):
            continue
        created = _created(pod)
        if created is None:
            continue
        held = (now - created).total_seconds()
        if held >= timeout_s:
            found.append(Expired(str(metadata.get("namespace", "")), str(metadata.get("name", "")), held))
    return sorted(found, key=lambda e: (-e.held_s, e.namespace, e.name))


def guarded_removal(pod: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The JSONPatch lifting the gate from the pod exactly as read (its resourceVersion tested
    first; every other gate kept); None when it holds no gate."""
    removal = remove_gate_patch(pod)
    if removal is None:
        return None
    version = (pod.get("metadata") or {}).get("resourceVersion")
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": version}, *removal]


def _key(pod: Mapping[str, Any]) -> tuple[str, str]:
    metadata = pod.get("metadata") or {}
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))


class GateKeeper:
    def __init__(
        self,
        api: Any,
        *,
        timeout_s: float,
        lease_namespace: str,
        request_timeout_s: float = 10.0,
        watch_timeout_s: int = 300,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._core = CoreV1Api(api)
        self._coordination = CoordinationV1Api(api)
        self.timeout_s = timeout_s
        self.lease_namespace = lease_namespace
        self._request_timeout = request_timeout_s
        self._watch_timeout = watch_timeout_s
        self._now = now
        self.gated: dict[tuple[str, str], dict[str, Any]] = {}  # pods holding the gate, as last seen
        self.listed = asyncio.Event()

    @property
    def tick_s(self) -> float:
        """How often the pods held are judged: a tenth of the timeout, within 0.5 to 5 s."""
        return max(0.5, min(5.0, self.timeout_s / 10))

    async def run(self, stop: asyncio.Event) -> None:
        follow = asyncio.create_task(self._follow(stop))
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.tick_s)
                if stop.is_set() or not self.listed.is_set():
                    continue
                if follow.done():
                    follow.result()  # a failing follower fails the keeper, never silently
                await self.judge()
        finally:
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follow

    async def allocator_lease(self) -> dict[str, Any] | None:
        """The allocator's Lease as the API server holds it; None when there is none."""
        try:
            return await call_json(
                f"read Lease {self.lease_namespace}/{ALLOCATOR_LEASE}",
                self._coordination.read_namespaced_lease(
                    ALLOCATOR_LEASE,
                    self.lease_namespace,
                    _preload_content=False,
                    _request_timeout=self._request_timeout,
                ),
            )
        except KubeApiError as error:
            if error.not_found:
                return None
            raise

    async def judge(self) -> int:
        """Remove the gate of every pod held past the timeout, when the allocator is down; how many
        were removed."""
        expired = expired_gates(list(self.gated.values()), self._now(), self.timeout_s)
        if not expired:
            return 0
        try:
            lease = await self.allocator_lease()
        except KubeApiError as error:
            log.warning(
                "cannot read the allocator's Lease: no gate is lifted this time",
                extra={"error": str(error)},
            )
            return 0
        if allocator_alive(lease, self._now(), self.timeout_s):
            for kept in expired:
                GATES_KEPT.inc()
                log.debug(
                    "scheduling gate kept past the timeout: the allocator is alive",
                    extra={"pod": f"{kept.namespace}/{kept.name}", "held_s": round(kept.held_s, 1)},
                )
            return 0
        removed = 0
        for expired_pod in expired:
            try:
                removed += await self._release(expired_pod)
            except KubeApiError as error:
                log.warning(
                    "cannot remove a timed-out scheduling gate",
                    extra={"pod": f"{expired_pod.namespace}/{expired_pod.name}", "error": str(error)},
                )
        return removed

    # --- following the pods -----------------------------------------------------------------------

    def _seen(self, kind: str, pod: dict[str, Any]) -> None:
        key = _key(pod)
        if kind == "DELETED" or not holds_gate(pod):
            self.gated.pop(key, None)
        else:
            self.gated[key] = pod

    async def relist(self) -> str:
        """Every pod holding the gate, listed afresh; the list's resourceVersion."""
        listed = await call_json(
            "list Pods",
            self._core.list_pod_for_all_namespaces(
                _preload_content=False, _request_timeout=self._request_timeout
            ),
        )
        self.gated = {_key(p): p for p in listed.get("items") or [] if holds_gate(p)}
        self.listed.set()
        return str(listed["metadata"].get("resourceVersion", ""))

    async def _follow(self, stop: asyncio.Event) -> None:
        async def seen(kind: str, pod: dict[str, Any]) -> None:
            self._seen(kind, pod)

        await list_then_watch(
            "pods",
            self.relist,
            self._core.list_pod_for_all_namespaces,
            seen,
            stop,
            watch_timeout_s=self._watch_timeout,
            request_timeout_s=self._request_timeout,
        )

    # --- removing a gate ------------------------------------------------------------------------------

    async def _read(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await call_json(
                f"read Pod {namespace}/{name}",
                self._core.read_namespaced_pod(
                    name, namespace, _preload_content=False, _request_timeout=self._request_timeout
                ),
            )
        except KubeApiError as error:
            if error.not_found:
                return None
            raise

    async def _release(self, expired: Expired) -> int:
        """Lift the gate from the pod as last seen; refused (it changed meanwhile, or another
        replica lifted it): read it again and judge again."""
        namespace, name = expired.namespace, expired.name
        pod: dict[str, Any] | None = self.gated.get((namespace, name))
        for _ in range(TRIES):
            if pod is None:
                self.gated.pop((namespace, name), None)
                return 0
            judged = expired_gates([pod], self._now(), self.timeout_s)
            patch = guarded_removal(pod)
            if not judged or patch is None:
                self._seen("MODIFIED", pod)
                return 0
            try:
                pod = await call_json(
                    f"remove the scheduling gate of Pod {namespace}/{name} (timed out)",
                    self._core.patch_namespaced_pod(
                        name,
                        namespace,
                        patch,
                        _content_type="application/json-patch+json",
                        _preload_content=False,
                        _request_timeout=self._request_timeout,
                    ),
                )
            except KubeApiError as error:
                if error.not_found:
                    pod = None
                    continue
                if error.status not in (409, 422):  # a changed pod fails the patch's test
                    raise
                pod = await self._read(namespace, name)
                continue
            self._seen("MODIFIED", pod)
            GATES_TIMED_OUT.inc()
            log.warning(
                "scheduling gate removed: the allocator is down past the timeout, kube-scheduler decides",
                extra={"pod": f"{namespace}/{name}", "held_s": round(judged[0].held_s, 1)},
            )
            await self._record(pod)
            return 1
        return 0

    async def _record(self, pod: dict[str, Any]) -> None:
        metadata = pod.get("metadata") or {}
        suffix = hashlib.sha256(f"{metadata.get('uid', '')}/{REASON}".encode()).hexdigest()[:16]
        message = (
            f"Tangram did not allocate this pod's claims within {self.timeout_s:g} s and its allocator "
            "is down: the scheduling gate is removed and kube-scheduler decides (Tangram adopts "
            "its allocation)"
        )
        event = warning_event(
            pod,
            "Pod",
            reason=REASON,
            message=message,
            now=kube_time(self._now()),
            component=COMPONENT,
            suffix=suffix,
        )
        await record_event(self._core, event, timeout_s=self._request_timeout)
