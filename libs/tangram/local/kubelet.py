"""A kubelet stand-in for one simulated node: what kubelet does with DRA claims, and no more.

It watches the Pods bound to its node. For a new Pod it finds the ResourceClaims the Pod uses
(named directly, or generated from a template and named in the Pod's status), prepares them
through the node's DRA socket exactly as kubelet calls it (NodePrepareResources, v1, 45 s), and
marks the Pod Running. A Pod being deleted has its claims unprepared (those no other Pod of the
node still uses) and is then removed, as kubelet confirms a deletion once its containers are gone.
No container runs: this is for trying Tangram with `kubectl` on simulated GPUs, and for tests.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api, V1DeleteOptions, V1Preconditions

from tangram.kubelet.client import KUBELET_TIMEOUT_S, ClaimHandle, KubeletClient
from tangram.kubernetes.api import KubeApiError, call
from tangram.kubernetes.api.watching import AbandoningWatch
from tangram.kubernetes.objects.times import kube_time

log = logging.getLogger("tangram.local.kubelet")

RETRY_S = (0.5, 1.0, 2.0, 5.0)  # between prepare attempts of a Pod whose claims are not ready
# Every request is bounded: the API client waits for ever by default, and one request left hanging
# across an API server restart held the node's lock, and so every Pod of the node, for good.
REQUEST_S = 30.0
RECONCILE_S = 2 * KUBELET_TIMEOUT_S + 4 * REQUEST_S  # one Pod's prepare or unprepare, at most
WATCH_IDLE_S = 330.0  # the watch asks the server to end it after 300 s; past this it is gone


@dataclass
class _PodClaims:
    handles: list[ClaimHandle] = field(default_factory=list)


class NodeKubelet:
    def __init__(self, api: Any, *, node: str, dra_socket: Path) -> None:
        self.node = node
        self._core = CoreV1Api(api)
        self._resource = ResourceV1Api(api)
        self._client = KubeletClient(dra_socket)
        self._prepared: dict[str, _PodClaims] = {}  # pod uid -> its claims, prepared
        self._running: set[str] = set()  # pods prepared and marked Running
        self._retries: dict[str, asyncio.Task[None]] = {}
        self._attempts: dict[str, int] = {}
        self._lock = asyncio.Lock()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop`: list the node's Pods, then watch them, listing again after a break."""
        try:
            while not stop.is_set():
                try:
                    await self._serve_once(stop)
                except (KubeApiError, aiohttp.ClientError, TimeoutError) as error:
                    # the API server gone (restarting, say): list and watch again once it answers
                    log.warning("pod watch of node %s interrupted: %s", self.node, error)
                    await _wait(stop, 1.0)
                except Exception:
                    # kubelet keeps serving its node whatever one Pod did; so does its stand-in
                    log.exception("pod watch of node %s failed; listing again", self.node)
                    await _wait(stop, 1.0)
        finally:
            for task in self._retries.values():
                task.cancel()
            await asyncio.gather(*self._retries.values(), return_exceptions=True)
            await self._client.close()

    async def _serve_once(self, stop: asyncio.Event) -> None:
        selector = f"spec.nodeName={self.node}"
        listed = await call(
            f"list Pods of node {self.node}",
            self._core.list_pod_for_all_namespaces(field_selector=selector, _request_timeout=REQUEST_S),
        )
        for pod in listed.items:
            await self._reconcile(pod, deleted=False)
        stopped = asyncio.create_task(stop.wait())
        try:
            async with AbandoningWatch() as watch:
                stream = watch.stream(
                    self._core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=300,
                )
                while not stop.is_set():
                    following = asyncio.ensure_future(anext(stream))
                    await asyncio.wait(
                        [following, stopped], timeout=WATCH_IDLE_S, return_when=asyncio.FIRST_COMPLETED
                    )
                    if not following.done():
                        following.cancel()
                        await asyncio.gather(following, return_exceptions=True)
                        if stop.is_set():
                            return
                        raise TimeoutError(f"no pod watch event in {WATCH_IDLE_S:g} s")
                    try:
                        event = following.result()
                    except StopAsyncIteration:
                        return
                    if event["type"] == "ERROR":
                        return
                    await self._reconcile(event["object"], deleted=event["type"] == "DELETED")
        finally:
            stopped.cancel()
            await asyncio.gather(stopped, return_exceptions=True)

    async def _reconcile(self, pod: Any, *, deleted: bool) -> None:
        async with self._lock:
            uid = pod.metadata.uid
            where = f"{pod.metadata.namespace}/{pod.metadata.name}"
            try:
                async with asyncio.timeout(RECONCILE_S):
                    if deleted or pod.metadata.deletion_timestamp is not None:
                        await self._finish(pod, gone=deleted)
                    elif pod.status.phase in (None, "Pending", "Running") and uid not in self._running:
                        await self._start(pod)
            except (KubeApiError, TimeoutError) as error:
                # the API server or the plugin away: this Pod is tried again, the others go on
                if not deleted:
                    self._retry_later(pod, f"pod {where} not reconciled: {str(error) or 'timed out'}")

    async def _start(self, pod: Any) -> None:
        """Prepare the Pod's claims, then mark it Running; a Pod prepared whose mark did not land
        (the API server away) is only marked."""
        where = f"{pod.metadata.namespace}/{pod.metadata.name}"
        prepared = self._prepared.get(pod.metadata.uid)
        if prepared is None:
            prepared = await self._prepare(pod, where)
            if prepared is None:
                return
        if pod.status.phase != "Running":
            now = kube_time(datetime.now(UTC))
            status = {
                "status": {
                    "phase": "Running",
                    "startTime": now,
                    "conditions": [
                        {"type": "Ready", "status": "True", "lastTransitionTime": now},
                        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                    ],
                }
            }
            await call(
                f"mark pod {where} Running",
                self._core.patch_namespaced_pod_status(
                    pod.metadata.name, pod.metadata.namespace, status, _request_timeout=REQUEST_S
                ),
            )
        self._running.add(pod.metadata.uid)
        log.info(
            "pod running",
            extra={"pod": where, "node": self.node, "claims": [h.name for h in prepared.handles]},
        )

    async def _prepare(self, pod: Any, where: str) -> _PodClaims | None:
        """The Pod's claims prepared through the plugin; None when they are not (tried again later)."""
        try:
            handles = await self._claims_of(pod)
            answers = await self._client.prepare(handles) if handles else {}
        except (KubeApiError, _NotYet) as error:
            self._retry_later(pod, f"claims of pod {where} not ready: {error}")
            return None
        except grpc.aio.AioRpcError as error:
            # The plugin is not serving yet (or restarting): kubelet tries again too.
            self._retry_later(pod, f"claims of pod {where} not prepared: plugin: {error.details()}")
            return None
        errors = [f"{h.namespace}/{h.name}: {answers[h.uid].error}" for h in handles if answers[h.uid].error]
        if errors:
            self._retry_later(pod, f"claims of pod {where} not prepared: {'; '.join(errors)}")
            return None
        prepared = self._prepared[pod.metadata.uid] = _PodClaims(handles)
        self._attempts.pop(pod.metadata.uid, None)
        return prepared

    async def _claims_of(self, pod: Any) -> list[ClaimHandle]:
        generated = {s.name: s.resource_claim_name for s in pod.status.resource_claim_statuses or []}
        names: list[str] = []
        for entry in pod.spec.resource_claims or []:
            name = entry.resource_claim_name or generated.get(entry.name)
            if not name:
                raise _NotYet(f"no ResourceClaim generated yet for {entry.name!r}")
            names.append(name)
        # An extended resource (`nvidia.com/gpu: 1`) served through a DeviceClass: kube-scheduler
        # made the claim for the pod and names it in the pod's status.
        extended = getattr(pod.status, "extended_resource_claim_status", None)
        if extended is not None and extended.resource_claim_name:
            names.append(extended.resource_claim_name)
        handles = []
        for name in names:
            claim = await call(
                f"read ResourceClaim {pod.metadata.namespace}/{name}",
                self._resource.read_namespaced_resource_claim(
                    name, pod.metadata.namespace, _request_timeout=REQUEST_S
                ),
            )
            if claim.status is None or claim.status.allocation is None:
                raise _NotYet(f"ResourceClaim {name} is not allocated")
            handles.append(ClaimHandle(namespace=pod.metadata.namespace, uid=claim.metadata.uid, name=name))
        return handles

    def _retry_later(self, pod: Any, why: str) -> None:
        uid = pod.metadata.uid
        attempt = self._attempts.get(uid, 0)
        self._attempts[uid] = attempt + 1
        delay = RETRY_S[min(attempt, len(RETRY_S) - 1)]
        log.warning("%s; trying again in %.1f s", why, delay)
        previous = self._retries.get(uid)
        if previous is not None and not previous.done() and previous is not asyncio.current_task():
            return  # a retry is already due (one failing now schedules the next itself)
        self._retries[uid] = asyncio.create_task(
            self._retry(pod.metadata.namespace, pod.metadata.name, delay)
        )

    async def _retry(self, namespace: str, name: str, delay: float) -> None:
        await asyncio.sleep(delay)
        while True:
            try:
                pod = await call(
                    f"read pod {namespace}/{name}",
                    self._core.read_namespaced_pod(name, namespace, _request_timeout=REQUEST_S),
                )
                break
            except KubeApiError as error:
                if error.not_found:
                    return
                if error.status and error.status < 500:
                    log.warning("pod %s/%s not retried: %s", namespace, name, error)
                    return
                await asyncio.sleep(RETRY_S[-1])  # the API server away (restarting): kubelet waits too
        await self._reconcile(pod, deleted=False)

    async def _finish(self, pod: Any, *, gone: bool) -> None:
        uid = pod.metadata.uid
        where = f"{pod.metadata.namespace}/{pod.metadata.name}"
        retry = self._retries.pop(uid, None)
        if retry is not None and retry is not asyncio.current_task():
            retry.cancel()
        self._attempts.pop(uid, None)
        self._running.discard(uid)
        mine = self._prepared.pop(uid, None)
        if mine is not None:
            still_used = {h.uid for other in self._prepared.values() for h in other.handles}
            release = [h for h in mine.handles if h.uid not in still_used]
            try:
                errors = await self._client.unprepare(release) if release else {}
            except grpc.aio.AioRpcError as error:
                errors = {h.uid: f"plugin: {error.details()}" for h in release}
            failed = {uid: error for uid, error in errors.items() if error}
            if failed:
                # Kubelet keeps a pod whose claims it could not unprepare and tries again.
                self._prepared[uid] = mine
                self._retry_later(pod, f"claims of pod {where} not unprepared: {failed}")
                return
        if gone:
            return
        options = V1DeleteOptions(grace_period_seconds=0, preconditions=V1Preconditions(uid=uid))
        try:
            await call(
                f"remove pod {where}",
                self._core.delete_namespaced_pod(
                    pod.metadata.name, pod.metadata.namespace, body=options, _request_timeout=REQUEST_S
                ),
            )
        except KubeApiError as error:
            if not error.not_found and error.status != 409:
                raise
        log.info("pod removed", extra={"pod": where, "node": self.node})


class _NotYet(Exception):
    """What the Pod needs is not there yet (a generated claim, an allocation)."""


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return
