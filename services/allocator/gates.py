"""The claim bridge's pods: kept indexed by the claims they use, and their scheduling gates lifted.

A pod held by Tangram's gate has its claims asked once it waits for them; the gate is removed once
every claim it uses may be (`may_ungate`), with a JSON patch that tests the pod's resourceVersion
(a stale pod is read again and the patch retried).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio.client import CoreV1Api

from services.allocator.clusterview import WRITE_TRIES, ClusterView, key_of
from tangram.kubernetes.api import KubeApiError, call_json
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


class PodGates:
    """`ask(claim)` asks for a Tangram claim a gated pod waits for (the bridge's own asking)."""

    def __init__(self, core: CoreV1Api, view: ClusterView, ask: Ask, *, request_timeout_s: float) -> None:
        self._core = core
        self._view = view
        self._ask = ask
        self._timeout = request_timeout_s
        self.pods = PodsByClaim()

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
        await self.maybe_ungate(pod)

    def awaited(self, claim: dict[str, Any]) -> bool:
        """A pod held by Tangram's gate uses the claim: Tangram decides it then (as kube-scheduler
        allocates a claim when it schedules a pod), never for a claim no pod waits for."""
        if "pods" not in self._view.listed:
            return False
        return any(gated(pod) for pod in self.pods.users_of(claim_ref(claim)))

    async def ungate_users(self, claim: dict[str, Any]) -> None:
        for pod in [p for p in self.pods.users_of(claim_ref(claim)) if gated(p)]:
            await self.maybe_ungate(pod)

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
