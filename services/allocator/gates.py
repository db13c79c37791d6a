"""The claim bridge's pods: kept indexed by the claims they use, and their scheduling gates lifted.

A pod held by Tangram's gate has its claims asked once it waits for them; the gate is removed once
every claim it uses may be (`may_ungate`), with a JSON patch that tests the pod's resourceVersion
(a stale pod is read again and the patch retried).

The watches only say which pods' gates may go (`lift_soon`); the patches are sent by `run`, up to
`max_lifts` at once. A watch handler that waited for each patch would hold every later event of
its kind behind that round trip: at hundreds of pods a second the claims watch fell behind by
seconds, and with it every decision.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio.client import CoreV1Api

from services.allocator.clusterview import WRITE_TRIES, ClusterView, Key, key_of
from tangram.kubernetes.api import KubeApiError, call_json, relist_delay
from tangram.kubernetes.objects.claimbridge import (
    claim_ref,
    classify,
    gated,
    is_tangrams,
    may_ungate,
    pod_claims,
    ungate_patch,
)
from tangram.kubernetes.objects.pods import PodsByClaim

log = logging.getLogger("tangram.allocator.kubernetes")

Ask = Callable[[dict[str, Any]], Awaitable[None]]
# Gates lifted at once: enough to keep up with a burst of decisions, as the claim writes do.
MAX_LIFTS = 16


class PodGates:
    """`ask(claim)` asks for a Tangram claim a gated pod waits for (the bridge's own asking)."""

    def __init__(self, core: CoreV1Api, view: ClusterView, ask: Ask, *, request_timeout_s: float) -> None:
        self._core = core
        self._view = view
        self._ask = ask
        self._timeout = request_timeout_s
        self.pods = PodsByClaim()
        self._to_lift: dict[Key, None] = {}  # pods whose gate may go, in the order they were found
        self._failures: dict[Key, int] = {}  # lifts refused in a row, by pod
        self._wake = asyncio.Event()

    async def relist(self) -> str:
        listed = await call_json(
            "list Pods",
            self._core.list_pod_for_all_namespaces(_preload_content=False, _request_timeout=self._timeout),
        )
        self.pods.clear()
        for pod in listed.get("items") or []:
            if relevant(pod):
                self.pods.keep(key_of(pod), pod)
        return str(listed["metadata"].get("resourceVersion", ""))

    async def pod_seen(self, kind: str, obj: dict[str, Any]) -> None:
        key = key_of(obj)
        if kind == "DELETED" or not relevant(obj):
            self.pods.keep(key, None)
            return
        self.pods.keep(key, obj)
        await self.pod_changed(obj)

    async def reconcile_all(self) -> None:
        for pod in list(self.pods.by_key.values()):
            await self.pod_changed(pod)

    async def pod_changed(self, pod: dict[str, Any]) -> None:
        """A gated pod's claims are decided once it waits for them; its gate goes when they are."""
        if not self._view.ready():
            return
        if gated(pod):
            namespace = key_of(pod)[0]
            for name in pod_claims(pod) or []:
                claim = self._view.claims.get((namespace, name))
                if claim is not None and classify(claim, self._view.classes) == "tangram":
                    await self._ask(claim)
            self._lift_if_due(pod)

    def awaited(self, claim: dict[str, Any]) -> bool:
        """A pod held by Tangram's gate uses the claim: Tangram decides it then (as kube-scheduler
        allocates a claim when it schedules a pod), never for a claim no pod waits for."""
        if "pods" not in self._view.listed:
            return False
        return any(gated(pod) for pod in self.pods.users_of(claim_ref(claim)))

    def lift_soon(self, claim: dict[str, Any]) -> None:
        """The gates of the claim's pods go (by `run`) once every claim each pod uses may."""
        for pod in self.pods.users_of(claim_ref(claim)):
            self._lift_if_due(pod)

    def _lift_if_due(self, pod: dict[str, Any]) -> None:
        if gated(pod) and self._view.ready() and may_ungate(pod, self._view.claims, self._view.classes):
            self._to_lift[key_of(pod)] = None
            self._wake.set()

    async def run(self, stop: asyncio.Event, *, max_lifts: int = MAX_LIFTS) -> None:
        """Lift the gates found due, up to `max_lifts` at once, until stopped."""
        slots = asyncio.Semaphore(max_lifts)
        running: set[asyncio.Task[None]] = set()
        try:
            while not stop.is_set():
                if not self._to_lift:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                key = next(iter(self._to_lift))
                del self._to_lift[key]
                await slots.acquire()
                task = asyncio.create_task(self._lift(key, slots))
                running.add(task)
                task.add_done_callback(running.discard)
        finally:
            for task in list(running):
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _lift(self, key: Key, slots: asyncio.Semaphore) -> None:
        try:
            pod = self.pods.by_key.get(key)  # as last seen: the patch tests its resourceVersion
            if pod is not None:
                await self.maybe_ungate(pod)
            self._failures.pop(key, None)
        except KubeApiError as error:
            # Refused by the API server (not a stale pod: that is read again): tried again later,
            # the pod kept gated meanwhile; the admission webhook's gate timeout bounds the wait.
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            delay = relist_delay(failures)
            log.warning(
                "scheduling gate not removed; trying again",
                extra={"pod": "/".join(key), "error": str(error), "retry_in_s": delay},
            )
            asyncio.get_running_loop().call_later(delay, self._retry_lift, key)
        finally:
            slots.release()

    def _retry_lift(self, key: Key) -> None:
        pod = self.pods.by_key.get(key)
        if pod is None:
            self._failures.pop(key, None)  # gone meanwhile: nothing to lift, nothing to count
        else:
            self._lift_if_due(pod)

    async def maybe_ungate(self, pod: dict[str, Any]) -> None:
        if not self._view.ready():
            return
        for _ in range(WRITE_TRIES):
            if not gated(pod) or not may_ungate(pod, self._view.claims, self._view.classes):
                return
            namespace, name = key_of(pod)
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
        namespace = key_of(pod)[0]
        claims = [self._view.claims.get((namespace, name)) for name in pod_claims(pod) or []]
        return any(claim is not None and is_tangrams(claim, self._view.classes) for claim in claims)


def relevant(pod: dict[str, Any]) -> bool:
    """Pods the bridge keeps: those that use claims or carry Tangram's gate."""
    spec = pod.get("spec") or {}
    return bool(spec.get("resourceClaims")) or gated(pod)
