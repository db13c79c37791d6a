"""The allocator's bridge to Kubernetes (leader only): claims in, allocations and gates out.

Lists and watches ResourceClaims (all namespaces), DeviceClasses and Pods (re-listing whenever a
watch ends or expires). Tangram's unallocated claims become claim requests; the deletion or the
deallocation of a claim the ledger knows becomes a release; a claim another writer allocated
becomes a request carrying that allocation, which the ledger holds as taken. Each decision comes
back here: an allocation is written to `status.allocation` (guarded by the claim's
resourceVersion, re-read and retried on conflict; an allocation someone else wrote meanwhile is
adopted instead), then Tangram's scheduling gate is removed from every pod that uses the claim,
so kube-scheduler binds the pod to the allocated node. A failure becomes a Warning Event on the
claim and its pods, and the claim is asked again whenever capacity is released (only when it
failed for want of capacity: a claim at fault fails the same way again, and one no node could
ever hold waits for the fleet's nodes to change).

Claims are asked fairly: each namespace waits in its own line, the lines take turns, and only
`max_in_flight` claims are asked and not yet answered (decided, and the decision written) at a
time, so a namespace that floods the cluster with claims delays another namespace's claim by a
bounded number of decisions, not by the length of its flood.

The pure rules (whose claim is it, what is written) are in `tangram.kubernetes.objects.claimbridge`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

from services.allocator.asking import MAX_IN_FLIGHT, FairAsker
from tangram.allocation.ledger import Ledger
from tangram.events import (
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    ClaimRequested,
    Event,
    PartitionApplied,
)
from tangram.events.ids import derived_id
from tangram.kubernetes.api import KubeApiError, call_json
from tangram.kubernetes.api.events import record_event
from tangram.kubernetes.api.watching import list_then_watch
from tangram.kubernetes.objects.claimbridge import (
    UNSCHEDULABLE_REASON,
    ClaimRef,
    allocation_of,
    allocation_status,
    claim_adopted,
    claim_ref,
    claim_released,
    claim_requested,
    classify,
    gated,
    holds_driver,
    is_tangrams,
    may_ungate,
    pod_claims,
    same_allocation,
    taken_by_others,
    ungate_patch,
    warning_event,
)
from tangram.kubernetes.objects.pods import PodsByClaim
from tangram.kubernetes.objects.times import kube_time
from tangram.service import first

log = logging.getLogger("tangram.allocator.kubernetes")

Publish = Callable[[Event], Awaitable[object]]
Key = tuple[str, str]  # (namespace, name)
COMPONENT = "tangram-allocator"
WRITE_TRIES = 8


def _key(obj: dict[str, Any]) -> Key:
    metadata = obj.get("metadata") or {}
    return (str(metadata.get("namespace", "")), str(metadata.get("name", "")))


def _uid(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


class ClaimBridge:
    def __init__(
        self,
        api: Any,
        ledger: Ledger,
        publish: Publish,
        *,
        producer: str,
        request_timeout_s: float = 10.0,
        watch_timeout_s: int = 300,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self._resource = ResourceV1Api(api)
        self._core = CoreV1Api(api)
        self._ledger = ledger
        self._publish = publish
        self._producer = producer
        self._timeout = request_timeout_s
        self._watch_timeout = watch_timeout_s
        self.classes: dict[str, dict[str, Any]] = {}
        self.claims: dict[Key, dict[str, Any]] = {}
        self.pods = PodsByClaim()
        self._requested: dict[str, int] = {}  # uid -> the attempt asked last
        self._adopted: set[str] = set()
        self._known: set[str] = set()  # uids of claims this bridge asked about
        self._pending: set[str] = set()  # uids of claims that failed for capacity: asked again on release
        # uids of claims no node could hold: asked again once the fleet's nodes change
        self._unfit: dict[str, frozenset[str]] = {}
        self._asker = FairAsker(publish, self._request_for, max_in_flight=max_in_flight)
        self._attempts: dict[str, int] = {}  # uid -> the attempt it is to be asked with
        self._keys: dict[str, Key] = {}  # uid -> (namespace, name) of the claims asked about
        self._released: set[str] = set()
        self._warned: dict[str, str] = {}  # uid -> the failure reason last recorded as an Event
        self._reasked: set[str] = set()  # released, then asked again for a pod that waits for it
        self._queue: asyncio.Queue[tuple[Event, list[Event]]] = asyncio.Queue()
        self.synced = asyncio.Event()  # every kind listed once and the resync done
        self._listed: set[str] = set()

    # --- the allocator's decisions --------------------------------------------------------------

    def notice(self, event: Event, outputs: list[Event]) -> None:
        """An event the allocator handled and what it produced (called in the consumer's order)."""
        self._queue.put_nowait((event, outputs))

    async def _answer(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            event, outputs = await self._queue.get()
            try:
                for output in outputs:
                    if isinstance(output, ClaimAllocated):
                        await self._write(output)
                    elif isinstance(output, ClaimFailed):
                        await self._failed(output)
                if (
                    isinstance(event, ClaimReleased)
                    or (isinstance(event, PartitionApplied) and event.action == "destroy")
                    or (isinstance(event, ClaimRequested) and event.allocation is not None and outputs)
                ):
                    # capacity freed, or a claim decided again after another writer's allocation
                    self._retry_pending()
            except KubeApiError as error:
                log.warning("cannot act on a decision in Kubernetes", extra={"error": str(error)})
            finally:
                if isinstance(event, ClaimRequested):
                    self._asker.answered(event.uid)

    def _enqueue(self, claim: dict[str, Any], attempt: int) -> None:
        """Put the claim in its namespace's line, to be asked with `attempt` when its turn comes."""
        uid = _uid(claim)
        self._keys[uid] = _key(claim)
        self._attempts[uid] = attempt
        self._requested[uid] = attempt
        self._known.add(uid)
        self._asker.enqueue(_key(claim)[0], uid)

    def _request_for(self, uid: str) -> ClaimRequested | None:
        claim = self._claim_by_uid(uid)
        if claim is None or classify(claim, self.classes) != "tangram":
            return None  # deleted, or no longer Tangram's, while it waited
        return claim_requested(claim, self.classes, producer=self._producer, attempt=self._attempts[uid])

    # --- run ---------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        claims_call = self._resource.list_resource_claim_for_all_namespaces
        follows = (
            ("classes", self._list_classes, self._resource.list_device_class, self._class_changed),
            ("claims", self._list_claims, claims_call, self._claim_changed),
            ("pods", self._list_pods, self._core.list_pod_for_all_namespaces, self._pod_seen),
        )
        tasks = [asyncio.create_task(self._answer(stop)), asyncio.create_task(self._asker.run(stop))]
        tasks += [asyncio.create_task(self._follow(*follow, stop)) for follow in follows]
        try:
            await first(stop.wait(), tasks)  # a failing task fails the allocator, never silently
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                except Exception:
                    # Stopping closes the client under a watch still reading ("Connection
                    # closed."): only a failure while running is the allocator's.
                    if not stop.is_set():
                        raise

    async def _follow(
        self,
        kind: str,
        list_all: Callable[[], Awaitable[str]],
        watch_call: Callable[..., Any],
        on_change: Callable[[str, dict[str, Any]], Awaitable[None]],
        stop: asyncio.Event,
    ) -> None:
        async def relist() -> str:
            version = await list_all()
            self._listed.add(kind)
            if self._listed >= {"classes", "claims", "pods"}:
                # Judged only with all three at hand: what one listing found may depend on another's.
                if not self.synced.is_set():
                    await self._resync()
                await self._reconcile_everything()
                self.synced.set()
            return version

        await list_then_watch(
            kind,
            relist,
            watch_call,
            on_change,
            stop,
            watch_timeout_s=self._watch_timeout,
            request_timeout_s=self._timeout,
        )

    # --- DeviceClasses ------------------------------------------------------------------------------

    async def _list_classes(self) -> str:
        listed = await call_json(
            "list DeviceClasses",
            self._resource.list_device_class(_preload_content=False, _request_timeout=self._timeout),
        )
        self.classes = {str(c["metadata"]["name"]): c for c in listed.get("items") or []}
        return str(listed["metadata"].get("resourceVersion", ""))

    async def _class_changed(self, kind: str, obj: dict[str, Any]) -> None:
        name = str(obj["metadata"]["name"])
        if kind == "DELETED":
            self.classes.pop(name, None)
        else:
            self.classes[name] = obj
        await self._reconcile_all()

    # --- ResourceClaims ----------------------------------------------------------------------------

    async def _list_claims(self) -> str:
        listed = await call_json(
            "list ResourceClaims",
            self._resource.list_resource_claim_for_all_namespaces(
                _preload_content=False, _request_timeout=self._timeout
            ),
        )
        present = {_key(c): c for c in listed.get("items") or []}
        for key, gone in list(self.claims.items()):
            if key not in present or _uid(present[key]) != _uid(gone):
                await self._claim_gone(gone)
        self.claims = present
        return str(listed["metadata"].get("resourceVersion", ""))

    async def _claim_changed(self, kind: str, obj: dict[str, Any]) -> None:
        key = _key(obj)
        before = self.claims.get(key)
        if kind == "DELETED":
            self.claims.pop(key, None)
            await self._claim_gone(obj)
            return
        if before is not None and _uid(before) != _uid(obj):
            await self._claim_gone(before)
            before = None
        self.claims[key] = obj
        await self._reconcile_claim(obj, before)

    async def _reconcile_all(self) -> None:
        if self._listed >= {"classes", "claims", "pods"}:
            for claim in list(self.claims.values()):
                await self._reconcile_claim(claim, None)

    async def _reconcile_everything(self) -> None:
        await self._reconcile_all()
        for pod in list(self.pods.by_key.values()):
            await self._pod_changed(pod)

    async def _reconcile_claim(self, claim: dict[str, Any], before: dict[str, Any] | None) -> None:
        if not self._listed >= {"classes", "claims", "pods"}:
            return
        uid = _uid(claim)
        kind = classify(claim, self.classes)
        if kind == "deleting":
            await self._release(claim_ref(claim))
        elif kind == "allocated":
            await self._adopt(claim)
        elif before is not None and allocation_of(before) is not None and uid in self._decided_or_known():
            await self._release(claim_ref(claim))  # deallocated
        elif kind == "tangram" and self._awaited(claim):
            await self._ask(claim)
        await self._ungate_users(claim)

    def _awaited(self, claim: dict[str, Any]) -> bool:
        """A pod held by Tangram's gate uses the claim: Tangram decides it then (as kube-scheduler
        allocates a claim when it schedules a pod), never for a claim no pod waits for."""
        if "pods" not in self._listed:
            return False
        return any(gated(pod) for pod in self.pods.users_of(claim_ref(claim)))

    def _decided_or_known(self) -> set[str]:
        return self._known | set(self._ledger.decided) | set(self._ledger.outside)

    def _ours(self, uid: str, allocation: dict[str, Any]) -> bool:
        """The allocation is the one the ledger decided (written by this allocator)."""
        if self._ledger.decided.get(uid) != "allocated":
            return False
        held = self._ledger.fleet.allocation(uid)
        return held is not None and same_allocation(allocation_status(held), allocation)

    async def _ask(self, claim: dict[str, Any]) -> None:
        """Publish the claim's request once; a decision already made but not written is written.

        Asked again (a later attempt) only when it was released and a pod waits for it again, or
        when it failed before this allocator led (capacity may have changed since); a claim that
        fails while this allocator leads is asked again when capacity is released.
        """
        uid = _uid(claim)
        released = uid in self._released or uid in self._ledger.released
        if released:
            if uid in self._reasked:
                return
            self._reasked.add(uid)
            self._released.discard(uid)
        elif self._ledger.decided.get(uid) == "allocated":
            held = self._ledger.fleet.allocation(uid)
            if held is not None:  # decided, never written (the allocator stopped in between)
                await self._write_allocation(claim, allocation_status(held), uid)
            return
        elif uid in self._requested:
            return
        attempt = max(self._ledger.attempts.get(uid, 0), self._requested.get(uid, 0))
        if released or self._ledger.decided.get(uid) == "failed":
            attempt += 1
        if self._ledger.decided.get(uid) == "failed":
            self._pending.add(uid)
        self._enqueue(claim, attempt)

    async def _claim_gone(self, claim: dict[str, Any]) -> None:
        await self._release(claim_ref(claim))

    async def _release(self, ref: ClaimRef) -> None:
        if ref.uid in self._released or ref.uid in self._ledger.released:
            return
        if ref.uid not in self._decided_or_known():
            return
        self._released.add(ref.uid)
        self._reasked.discard(ref.uid)
        self._pending.discard(ref.uid)
        self._unfit.pop(ref.uid, None)
        self._asker.discard(ref.uid)
        self._warned.pop(ref.uid, None)
        attempt = max(self._ledger.attempts.get(ref.uid, 0), self._requested.get(ref.uid, 0))
        await self._publish(claim_released(ref, producer=self._producer, attempt=attempt))

    async def _resync(self) -> None:
        """After the first listing as leader: claims the ledger holds that were deleted meanwhile."""
        present = {_uid(c) for c in self.claims.values()}
        for uid in sorted(set(self._ledger.decided) | set(self._ledger.outside)):
            if uid in present or uid in self._ledger.released:
                continue
            namespace, name = self._ledger.claims.get(uid, ("", ""))
            await self._release(ClaimRef(namespace=namespace, name=name, uid=uid))

    def _retry_pending(self) -> None:
        """Ask again, in their namespaces' lines, the claims that capacity freed now may fit; and
        those no node could hold, once the fleet's nodes are not the ones they failed on."""
        nodes = frozenset(self._ledger.fleet.node_names)
        retry = sorted(self._pending) + sorted(uid for uid, seen in self._unfit.items() if seen != nodes)
        for uid in retry:
            if self._asker.waiting(uid):
                continue  # asked again already, and still waiting for its turn
            claim = self._claim_by_uid(uid)
            if claim is None or classify(claim, self.classes) != "tangram":
                self._pending.discard(uid)
                self._unfit.pop(uid, None)
                continue
            self._unfit.pop(uid, None)
            attempt = max(self._requested.get(uid, 0), self._ledger.attempts.get(uid, 0)) + 1
            self._enqueue(claim, attempt)

    def _claim_by_uid(self, uid: str) -> dict[str, Any] | None:
        key = self._keys.get(uid)
        if key is not None:
            claim = self.claims.get(key)
            if claim is not None and _uid(claim) == uid:
                return claim
        return next((c for c in self.claims.values() if _uid(c) == uid), None)

    # --- writing decisions ---------------------------------------------------------------------------

    async def _write(self, allocated: ClaimAllocated) -> None:
        self._pending.discard(allocated.uid)
        self._unfit.pop(allocated.uid, None)
        self._warned.pop(allocated.uid, None)
        claim = self.claims.get((allocated.namespace, allocated.name))
        if claim is None or _uid(claim) != allocated.uid:
            claim = await self._read_claim(allocated.namespace, allocated.name, allocated.uid)
            if claim is None:
                return  # not (or no longer) in Kubernetes: its deletion releases it
        await self._write_allocation(claim, allocation_status(allocated), allocated.uid)

    async def _read_claim(self, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
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
        return claim if _uid(claim) == uid else None

    async def _write_allocation(self, claim: dict[str, Any], allocation: dict[str, Any], uid: str) -> None:
        """status.allocation, against the claim as read; on conflict read again and retry."""
        namespace, name = _key(claim)
        for _ in range(WRITE_TRIES):
            current = allocation_of(claim)
            if current is not None:
                if not same_allocation(current, allocation) and uid not in self._adopted:
                    # someone else allocated it first: theirs stands, the ledger undoes ours
                    self._adopted.add(uid)
                    await self._publish(claim_adopted(claim, self.classes, producer=self._producer))
                break
            taken = taken_by_others(uid, allocation, self.claims.values())
            if taken:
                # Another writer gave a device of this decision to another claim first: that
                # allocation stands, the ledger (told by its adoption) decides this claim again.
                log.warning(
                    "a device of the decision is allocated to another claim; not written",
                    extra={
                        "claim": f"{namespace}/{name}",
                        "taken": {device: "/".join(_key(other)) for device, other in taken.items()},
                    },
                )
                for other in taken.values():
                    await self._adopt(other)
                return
            body = dict(claim)
            body["status"] = {**(claim.get("status") or {}), "allocation": allocation}
            try:
                claim = await call_json(
                    f"write the allocation of ResourceClaim {namespace}/{name}",
                    self._resource.replace_namespaced_resource_claim_status(
                        name, namespace, body, _preload_content=False, _request_timeout=self._timeout
                    ),
                )
            except KubeApiError as error:
                if not (error.conflict or error.not_found):
                    raise
                found = await self._read_claim(namespace, name, uid)
                if found is None:
                    return
                claim = found
                continue
            log.info("claim allocation written", extra={"claim": f"{namespace}/{name}"})
            break
        self.claims[(namespace, name)] = claim
        await self._ungate_users(claim)

    async def _adopt(self, claim: dict[str, Any]) -> None:
        """Tell the ledger of an allocation another writer made (once per claim)."""
        uid = _uid(claim)
        allocation = allocation_of(claim) or {}
        if uid in self._adopted or self._ours(uid, allocation) or not holds_driver(allocation):
            return
        self._adopted.add(uid)
        self._known.add(uid)
        self._pending.discard(uid)
        self._unfit.pop(uid, None)
        self._asker.discard(uid)
        await self._publish(claim_adopted(claim, self.classes, producer=self._producer))

    async def _failed(self, failed: ClaimFailed) -> None:
        claim = self.claims.get((failed.namespace, failed.name))
        if claim is None or _uid(claim) != failed.uid:
            return
        allocation = allocation_of(claim)
        if allocation is not None and holds_driver(allocation):
            # Failed after its allocation was written (its MIG instance could not be made): the
            # allocation stands in the API server and the node prepares it, so the ledger holds
            # its devices again rather than give them to another claim.
            await self._publish(claim_adopted(claim, self.classes, producer=self._producer))
        elif failed.cause in ("capacity", "internal"):
            self._pending.add(failed.uid)
        elif failed.cause == "hardware":
            self._unfit[failed.uid] = frozenset(self._ledger.fleet.node_names)
        # A claim at fault is not asked again: its spec cannot change, so neither can its answer.
        if self._warned.get(failed.uid) == failed.reason:
            return  # asked again and failed for the same reason: said once is enough
        self._warned[failed.uid] = failed.reason
        now = kube_time(datetime.now(UTC))
        suffix = derived_id(failed.uid, failed.attempt, "unschedulable")[:16]
        involved = [("ResourceClaim", claim)] + [("Pod", pod) for pod in self.pods.users_of(claim_ref(claim))]
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

    # --- pods -----------------------------------------------------------------------------------------

    async def _list_pods(self) -> str:
        listed = await call_json(
            "list Pods",
            self._core.list_pod_for_all_namespaces(_preload_content=False, _request_timeout=self._timeout),
        )
        self.pods.clear()
        for pod in listed.get("items") or []:
            if _relevant(pod):
                self.pods.keep(_key(pod), pod)
        return str(listed["metadata"].get("resourceVersion", ""))

    async def _pod_seen(self, kind: str, obj: dict[str, Any]) -> None:
        key = _key(obj)
        if kind == "DELETED" or not _relevant(obj):
            self.pods.keep(key, None)
            return
        self.pods.keep(key, obj)
        await self._pod_changed(obj)

    async def _pod_changed(self, pod: dict[str, Any]) -> None:
        """A gated pod's claims are decided once it waits for them; its gate goes when they are."""
        if not self._listed >= {"classes", "claims", "pods"}:
            return
        if gated(pod):
            namespace = _key(pod)[0]
            for name in pod_claims(pod) or []:
                claim = self.claims.get((namespace, name))
                if claim is not None and classify(claim, self.classes) == "tangram":
                    await self._ask(claim)
        await self._maybe_ungate(pod)

    async def _ungate_users(self, claim: dict[str, Any]) -> None:
        for pod in [p for p in self.pods.users_of(claim_ref(claim)) if gated(p)]:
            await self._maybe_ungate(pod)

    async def _maybe_ungate(self, pod: dict[str, Any]) -> None:
        if not self._listed >= {"classes", "claims", "pods"}:
            return
        for _ in range(WRITE_TRIES):
            if not gated(pod) or not may_ungate(pod, self.claims, self.classes):
                return
            namespace, name = _key(pod)
            try:
                pod = await call_json(
                    f"remove the scheduling gate of Pod {namespace}/{name}",
                    self._core.patch_namespaced_pod(
                        name,
                        namespace,
                        ungate_patch(pod),
                        _content_type="application/json-patch+json",
                        _preload_content=False,
                        _request_timeout=self._timeout,
                    ),
                )
            except KubeApiError as error:
                if error.not_found:
                    return
                if error.status not in (409, 422):  # a stale resourceVersion fails the patch's test
                    raise
                try:
                    pod = await call_json(
                        f"read Pod {namespace}/{name}",
                        self._core.read_namespaced_pod(
                            name, namespace, _preload_content=False, _request_timeout=self._timeout
                        ),
                    )
                except KubeApiError as again:
                    if again.not_found:
                        return
                    raise
                continue
            log.info(
                "scheduling gate removed",
                extra={"pod": f"{namespace}/{name}", "tangram": self._uses_tangram(pod)},
            )
            self.pods.keep((namespace, name), pod)
            return

    def _uses_tangram(self, pod: dict[str, Any]) -> bool:
        namespace = _key(pod)[0]
        claims = [self.claims.get((namespace, name)) for name in pod_claims(pod) or []]
        return any(claim is not None and is_tangrams(claim, self.classes) for claim in claims)


def _relevant(pod: dict[str, Any]) -> bool:
    """Pods the bridge keeps: those that use claims or carry Tangram's gate."""
    spec = pod.get("spec") or {}
    return bool(spec.get("resourceClaims")) or gated(pod)
