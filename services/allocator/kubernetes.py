"""The allocator's bridge to Kubernetes (leader only): claims in, allocations and gates out.

Lists and watches ResourceClaims (all namespaces), DeviceClasses and Pods (re-listing whenever a
watch ends or expires). Tangram's unallocated claims become claim requests; the deletion or the
deallocation of a claim the ledger knows becomes a release; a claim another writer allocated
becomes a request carrying that allocation, which the ledger holds as taken. Each decision comes
back here: an allocation is written to `status.allocation` (guarded by the claim's
resourceVersion, re-read and retried on conflict; an allocation someone else wrote meanwhile is
adopted instead); once the claims watch brings the allocation back, Tangram's scheduling gate is
removed from every pod that uses the claim, so kube-scheduler binds the pod to the allocated
node. A failure becomes a Warning Event on the claim and its pods, and the claim is asked again
whenever capacity is released (only when it failed for want of capacity: a claim at fault fails
the same way again, and one no node could ever hold waits for the fleet's nodes to change).

Decisions are acted on as they come, up to `max_writes` at once (each is a write or two to the
API server, and hundreds of pods arriving together must not wait for each other's round trips);
the answers about one claim keep their order, and claims are asked again after a release only
once the answers before it are acted on. A watch event older than the claim the writer kept from
its own write is ignored.

Claims are asked fairly: each namespace waits in its own line, the lines take turns, and only
`max_in_flight` claims are asked and not yet answered (decided, and the decision written) at a
time, so a namespace that floods the cluster with claims delays another namespace's claim by a
bounded number of decisions, not by the length of its flood.

The bridge follows the three kinds and hands each job on: which claims are asked, with which
attempt, and which are released (`requester.ClaimRequester`, asking through `asking.FairAsker`);
the decisions written back (`claimwriter.ClaimWriter`); the pods, indexed by the claims they use,
and their gates (`gates.PodGates`); what all of them read of the cluster (`clusterview.ClusterView`).
The pure rules (whose claim is it, what is written) are in `tangram.kubernetes.objects.claimbridge`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api
from prometheus_client import Gauge

from services.allocator.asking import MAX_IN_FLIGHT, FairAsker
from services.allocator.claimwriter import ClaimWriter
from services.allocator.clusterview import ClaimsSeen, ClusterView, Key, key_of, older, uid_of
from services.allocator.domains import DomainWatch
from services.allocator.gates import PodGates
from services.allocator.podgroups import PodGroups
from services.allocator.preemptions import Preemptions
from services.allocator.provisioning import Provisioning
from services.allocator.requester import ClaimRequester
from tangram.allocation.ledger import Ledger
from tangram.events import (
    ClaimAllocated,
    ClaimFailed,
    ClaimPreempting,
    ClaimReleased,
    ClaimRequested,
    Event,
    GangMember,
    PartitionApplied,
)
from tangram.kubernetes.api import KubeApiError, call_json
from tangram.kubernetes.api.watching import list_then_watch
from tangram.kubernetes.objects.claimbridge import (
    allocation_of,
    claim_ref,
    classify,
    is_tangrams,
    pod_claims,
)
from tangram.kubernetes.objects.gangs import gang_member, pod_group_name
from tangram.kubernetes.objects.pods import PodsByClaim
from tangram.service import first

log = logging.getLogger("tangram.allocator.kubernetes")

Publish = Callable[[Event], Awaitable[object]]
# Decisions acted on at once: enough to keep a write pipeline full against an API server's
# round trip, few enough that a burst does not trip its priority-and-fairness limits.
MAX_WRITES = 16
CLAIMS = Gauge(
    "tangram_allocator_kubernetes_claims",
    "Tangram's claims not yet allocated, by where they wait: in line to be asked (waiting), asked "
    "and not yet answered (asked), failed and waiting for capacity or nodes to change (unplaceable)",
    ["state"],
)
CLAIM_STATES = ("waiting", "asked", "unplaceable")


def _forget(last: dict[str, asyncio.Task[None]], keys: set[str], done: asyncio.Task[None]) -> None:
    for key in keys:
        if last.get(key) is done:
            del last[key]


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
        max_writes: int = MAX_WRITES,
    ) -> None:
        self._resource = ResourceV1Api(api)
        self._core = CoreV1Api(api)
        self._ledger = ledger
        self._publish = publish
        self._timeout = request_timeout_s
        self._watch_timeout = watch_timeout_s
        self._max_writes = max_writes
        self._view = ClusterView()
        self._requester = ClaimRequester(
            self._view, ledger, publish, producer=producer, max_in_flight=max_in_flight
        )
        self._gates = PodGates(self._core, self._view, self._ask, request_timeout_s=request_timeout_s)
        self._preemptions = Preemptions(
            api,
            self._view,
            self._gates,
            ledger,
            self._retry_pending,
            request_timeout_s=request_timeout_s,
            watch_timeout_s=watch_timeout_s,
        )
        self._requester.rank = self._preemptions.rank
        self._requester.protected = self._preemptions.protected
        self._requester.gang = self._gang_of
        self._provisioning = Provisioning(api, request_timeout_s=request_timeout_s)
        self._domains = DomainWatch(self._core, ledger, self._users, request_timeout_s=request_timeout_s)
        self._pod_groups = PodGroups(
            api, self._pod_group_changed, request_timeout_s=request_timeout_s, watch_timeout_s=watch_timeout_s
        )
        self._writer = ClaimWriter(
            self._view,
            self._requester,
            self._gates,
            resource=self._resource,
            core=self._core,
            ledger=ledger,
            publish=publish,
            producer=producer,
            request_timeout_s=request_timeout_s,
        )
        # the decisions to act on, in the allocator's order (or an answer's own failure)
        self._queue: asyncio.Queue[tuple[Event, list[Event], bool] | Exception] = asyncio.Queue()
        self.synced = asyncio.Event()  # every kind listed once and the resync done

    # --- what the bridge has seen ---------------------------------------------------------------

    @property
    def classes(self) -> dict[str, dict[str, Any]]:
        return self._view.classes

    @classes.setter
    def classes(self, classes: dict[str, dict[str, Any]]) -> None:
        self._view.classes = classes

    @property
    def claims(self) -> ClaimsSeen:
        return self._view.claims

    @claims.setter
    def claims(self, claims: Mapping[Key, dict[str, Any]]) -> None:
        self._view.claims = claims

    @property
    def pods(self) -> PodsByClaim:
        return self._gates.pods

    @property
    def _listed(self) -> set[str]:
        return self._view.listed

    @property
    def _asker(self) -> FairAsker:
        return self._requester.asker

    def _gang_of(self, claim: dict[str, Any]) -> GangMember | None:
        """The group of pods the claim is placed with, from the pods that use it."""
        namespace = key_of(claim)[0]
        return gang_member(
            self._gates.pods.users_of(claim_ref(claim)),
            lambda name: self._view.claims.get((namespace, name)),
            lambda other: is_tangrams(other, self._view.classes),
            lambda name: self._pod_groups.get(namespace, name),
        )

    def _pod_group_changed(self, key: tuple[str, str]) -> None:
        """A PodGroup appeared or changed: the claims of its gated pods are asked again, now that
        the group's size is known (or changed)."""
        namespace, name = key
        for pod in list(self._gates.pods.by_key.values()):
            if (pod.get("metadata") or {}).get("namespace") != namespace or pod_group_name(pod) != name:
                continue
            for claim_name in pod_claims(pod) or []:
                claim = self._view.claims.get((namespace, claim_name))
                if claim is not None and classify(claim, self._view.classes) == "tangram":
                    self._requester.ask_again(claim)

    # --- the allocator's decisions --------------------------------------------------------------

    def notice(self, event: Event, outputs: list[Event], *, frees: bool = False) -> None:
        """An event the allocator handled and what it produced (called in the consumer's order);
        `frees`: a release that freed capacity (`Ledger.frees_capacity`, asked before the fold)."""
        self._queue.put_nowait((event, outputs, frees))

    async def _answer(self, stop: asyncio.Event) -> None:
        """Act on the decisions as they come, up to `max_writes` at once: each is a write or two
        to the API server, and hundreds of pods arriving together must not wait for each other's
        round trips. The answers about one claim stay in the order they were decided."""
        slots = asyncio.Semaphore(self._max_writes)
        last: dict[str, asyncio.Task[None]] = {}  # claim uid -> its latest answer, not yet done
        running: set[asyncio.Task[None]] = set()
        try:
            while not stop.is_set():
                item = await self._queue.get()
                if isinstance(item, Exception):
                    raise item  # an answer failed other than by the API server refusing: ours
                event, outputs, frees = item
                if (
                    (isinstance(event, ClaimReleased) and frees)
                    or (isinstance(event, PartitionApplied) and event.action == "destroy")
                    or (isinstance(event, ClaimRequested) and event.allocation is not None and outputs)
                ):
                    # capacity freed, or a claim decided again after another writer's allocation:
                    # asked again once the answers before it are acted on (a failure not yet
                    # recorded would not be asked again). A release that freed nothing (a claim
                    # that had failed, or was held on a node not of this fleet) asks nothing again:
                    # every claim waiting for capacity would be decided again for nothing.
                    retry = asyncio.create_task(self._retry_after(list(running)))
                    running.add(retry)
                    retry.add_done_callback(running.discard)
                uid = event.uid if isinstance(event, ClaimRequested) else None
                acts = [o for o in outputs if isinstance(o, ClaimAllocated | ClaimFailed | ClaimPreempting)]
                if not acts and uid is None:
                    continue
                await slots.acquire()
                keys = {a.uid for a in acts} | ({uid} if uid else set())
                before = [last[k] for k in keys if k in last]
                task = asyncio.create_task(self._act(acts, uid, before, slots))
                running.add(task)
                task.add_done_callback(running.discard)
                for key in keys:
                    last[key] = task
                task.add_done_callback(functools.partial(_forget, last, keys))
        finally:
            for task in list(running):
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _retry_after(self, earlier: list[asyncio.Task[None]]) -> None:
        await asyncio.gather(*earlier, return_exceptions=True)
        self._retry_pending()

    async def _act(
        self,
        acts: list[ClaimAllocated | ClaimFailed | ClaimPreempting],
        asked: str | None,
        before: list[asyncio.Task[None]],
        slots: asyncio.Semaphore,
    ) -> None:
        try:
            if before:
                await asyncio.gather(*before, return_exceptions=True)
            for act in acts:
                if isinstance(act, ClaimAllocated):
                    await self._write(act)
                elif isinstance(act, ClaimPreempting):
                    await self._preemptions.preempt(act)
                else:
                    await self._failed(act)
        except KubeApiError as error:
            log.warning("cannot act on a decision in Kubernetes", extra={"error": str(error)})
        except Exception as error:
            self._queue.put_nowait(error)
        finally:
            slots.release()
            if asked is not None:
                self._asker.answered(asked)

    async def _write(self, allocated: ClaimAllocated) -> None:
        await self._writer.write(allocated)  # `ClaimWriter.write`
        await self._provisioning.settled(self._users(allocated.namespace, allocated.name, allocated.uid))

    async def _failed(self, failed: ClaimFailed) -> None:
        await self._writer.failed(failed)  # `ClaimWriter.failed`
        if failed.cause == "hardware":
            # no node could ever hold it: cluster-autoscaler is asked for one
            await self._provisioning.ask(
                self._users(failed.namespace, failed.name, failed.uid), failed.reason
            )

    def _users(self, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
        claim = self._view.claims.get((namespace, name))
        if claim is None or uid_of(claim) != uid:
            return []
        return self.pods.users_of(claim_ref(claim))

    def inventory_seen(self) -> None:
        """A node's inventory was folded: a trouble on a node of a running job's NVLink domain is
        told on its pods; once the fleet's nodes are others than before, the claims no node could
        hold are asked again (a node cluster-autoscaler added may hold them)."""
        if self._ledger.domains:
            self._domains.check()
        self._requester.nodes_seen()

    def _retry_pending(self) -> None:
        self._requester.retry_pending()

    # --- run ---------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        claims_call = self._resource.list_resource_claim_for_all_namespaces
        follows = (
            ("classes", self._list_classes, self._resource.list_device_class, self._class_changed),
            ("claims", self._list_claims, claims_call, self._claim_changed),
            ("pods", self._gates.relist, self._core.list_pod_for_all_namespaces, self._pod_seen),
        )
        tasks = [
            asyncio.create_task(self._answer(stop)),
            asyncio.create_task(self._asker.run(stop)),
            asyncio.create_task(self._gates.run(stop)),
        ]
        tasks += [asyncio.create_task(self._follow(*follow, stop)) for follow in follows]
        tasks.append(asyncio.create_task(self._preemptions.follow_budgets(stop)))
        tasks.append(asyncio.create_task(self._domains.run(stop)))
        tasks.append(asyncio.create_task(self._pod_groups.follow(stop)))
        for state in CLAIM_STATES:  # read when scraped, from the bridge that leads now
            CLAIMS.labels(state).set_function(functools.partial(self._claims_in, state))
        try:
            await first(stop.wait(), tasks)  # a failing task fails the allocator, never silently
        finally:
            for state in CLAIM_STATES:
                CLAIMS.labels(state).set_function(lambda: 0.0)  # a follower holds no line
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

    def _claims_in(self, state: str) -> float:
        return float(self._requester.counts()[state])

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
            self._view.listed.add(kind)
            if self._view.ready():
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
        self._view.classes = {str(c["metadata"]["name"]): c for c in listed.get("items") or []}
        return str(listed["metadata"].get("resourceVersion", ""))

    async def _class_changed(self, kind: str, obj: dict[str, Any]) -> None:
        name = str(obj["metadata"]["name"])
        if kind == "DELETED":
            self._view.classes.pop(name, None)
        else:
            self._view.classes[name] = obj
        await self._reconcile_all()

    # --- ResourceClaims ----------------------------------------------------------------------------

    async def _list_claims(self) -> str:
        listed = await call_json(
            "list ResourceClaims",
            self._resource.list_resource_claim_for_all_namespaces(
                _preload_content=False, _request_timeout=self._timeout
            ),
        )
        present = {key_of(c): c for c in listed.get("items") or []}
        for key, gone in list(self._view.claims.items()):
            if key not in present or uid_of(present[key]) != uid_of(gone):
                await self._claim_gone(gone)
        self._view.claims = present
        return str(listed["metadata"].get("resourceVersion", ""))

    async def _claim_changed(self, kind: str, obj: dict[str, Any]) -> None:
        key = key_of(obj)
        before = self._view.claims.get(key)
        if kind == "DELETED":
            self._view.claims.pop(key, None)
            await self._claim_gone(obj)
            return
        if before is not None and older(obj, before):
            return  # the writer already keeps a newer version (its own write's answer)
        if before is not None and uid_of(before) != uid_of(obj):
            await self._claim_gone(before)
            before = None
        self._view.claims[key] = obj
        await self._reconcile_claim(obj, before)

    async def _reconcile_all(self) -> None:
        if self._view.ready():
            for claim in list(self._view.claims.values()):
                await self._reconcile_claim(claim, None)

    async def _reconcile_everything(self) -> None:
        await self._reconcile_all()
        await self._gates.reconcile_all()

    async def _reconcile_claim(self, claim: dict[str, Any], before: dict[str, Any] | None) -> None:
        if not self._view.ready():
            return
        uid = uid_of(claim)
        kind = classify(claim, self._view.classes)
        if kind == "deleting":
            await self._writer.release(claim_ref(claim), deleted=True)
        elif kind == "allocated":
            await self._writer.adopt(claim)
        elif before is not None and allocation_of(before) is not None and self._requester.knows(uid):
            await self._writer.release(claim_ref(claim))  # deallocated
        elif kind == "tangram" and self._gates.awaited(claim):
            await self._ask(claim)
        self._gates.lift_soon(claim)

    async def _ask(self, claim: dict[str, Any]) -> None:
        """Ask for the claim (`ClaimRequester.ask`); a decision made but never written (the
        allocator stopped in between) is written now."""
        held = self._requester.ask(claim)
        if held is not None:
            await self._writer.write_allocation(claim, held, uid_of(claim))

    async def _claim_gone(self, claim: dict[str, Any]) -> None:
        await self._writer.release(claim_ref(claim), deleted=True)

    async def _resync(self) -> None:
        """After the first listing as leader: claims the ledger holds that were deleted meanwhile."""
        for ref in self._requester.gone_while_away():
            await self._writer.release(ref, deleted=True)
        await self._preemptions.resume()

    # --- pods ---------------------------------------------------------------------------------------

    async def _pod_seen(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._provisioning.gone(key_of(obj))
        await self._gates.pod_seen(kind, obj)

    async def _maybe_ungate(self, pod: dict[str, Any]) -> None:
        await self._gates.maybe_ungate(pod)
