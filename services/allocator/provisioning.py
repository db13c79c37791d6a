"""The bridge's route to cluster-autoscaler for pods no current node could hold
(`tangram.kubernetes.objects.provisioning`): a PodTemplate and a ProvisioningRequest per pod, made
once, deleted once its claim is allocated (and collected with the pod otherwise).

Where the API server does not serve ProvisioningRequests (cluster-autoscaler's CRD not installed),
the pod's Event says so once and nothing is retried: the claim still waits for the fleet's nodes
to change, as it always did.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

from services.allocator.clusterview import Key, key_of
from tangram.kubernetes.api import KubeApiError, call
from tangram.kubernetes.api.events import record_event
from tangram.kubernetes.objects.claimbridge import gated, warning_event
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.kubernetes.objects.provisioning import (
    PROVISIONING_GROUP,
    PROVISIONING_PLURAL,
    PROVISIONING_REASON,
    PROVISIONING_VERSION,
    pod_template,
    provisioning_name,
    provisioning_request,
)
from tangram.kubernetes.objects.times import kube_time

log = logging.getLogger("tangram.allocator.kubernetes")

COMPONENT = "tangram-allocator"


class Provisioning:
    def __init__(self, api: Any, *, request_timeout_s: float) -> None:
        self._core = CoreV1Api(api)
        self._custom = CustomObjectsApi(api)
        self._timeout = request_timeout_s
        self._asked: set[Key] = set()  # pods a ProvisioningRequest was made for
        self._unserved = False  # the API server answered that it serves no ProvisioningRequests

    async def ask(self, pods: list[dict[str, Any]], reason: str) -> None:
        """A ProvisioningRequest for each gated pod not asked for yet; `reason` says why no node fits."""
        for pod in pods:
            key = key_of(pod)
            if key in self._asked or not gated(pod) or self._unserved:
                continue
            namespace, name = key
            made = provisioning_name(pod)
            try:
                await self._create(
                    f"create PodTemplate {namespace}/{made}",
                    self._core.create_namespaced_pod_template(
                        namespace, pod_template(pod, SCHEDULING_GATE), _request_timeout=self._timeout
                    ),
                )
                await self._create(
                    f"create ProvisioningRequest {namespace}/{made}",
                    self._custom.create_namespaced_custom_object(
                        PROVISIONING_GROUP,
                        PROVISIONING_VERSION,
                        namespace,
                        PROVISIONING_PLURAL,
                        provisioning_request(pod),
                        _request_timeout=self._timeout,
                    ),
                )
            except KubeApiError as error:
                if not error.not_found:
                    raise
                # No such kind: cluster-autoscaler's CRD is not installed. Said once, on this pod.
                self._unserved = True
                await self._forget_template(namespace, made)
                log.warning(
                    "ProvisioningRequests are not served: cluster-autoscaler cannot be asked for a node",
                    extra={"pod": f"{namespace}/{name}"},
                )
                await self._note(
                    pod,
                    f"no node of the cluster could hold its claims ({reason}), and this cluster serves "
                    "no ProvisioningRequest (autoscaling.x-k8s.io/v1), so cluster-autoscaler cannot "
                    "be asked for one; the pod waits for a node that fits",
                )
                continue
            self._asked.add(key)
            log.info("cluster-autoscaler asked for a node", extra={"pod": f"{namespace}/{name}"})
            await self._note(
                pod,
                f"no node of the cluster could hold its claims ({reason}); asked cluster-autoscaler "
                f"for one through ProvisioningRequest {namespace}/{made}",
            )

    async def settled(self, pods: list[dict[str, Any]]) -> None:
        """The pods' claims are allocated: their ProvisioningRequests are no longer wanted."""
        for pod in pods:
            key = key_of(pod)
            if key not in self._asked:
                continue
            namespace, made = key[0], provisioning_name(pod)
            try:
                await call(
                    f"delete ProvisioningRequest {namespace}/{made}",
                    self._custom.delete_namespaced_custom_object(
                        PROVISIONING_GROUP,
                        PROVISIONING_VERSION,
                        namespace,
                        PROVISIONING_PLURAL,
                        made,
                        _request_timeout=self._timeout,
                    ),
                )
            except KubeApiError as error:
                if not error.not_found:
                    raise
            await self._forget_template(namespace, made)
            self._asked.discard(key)

    def gone(self, key: Key) -> None:
        """The pod was deleted: what was made for it goes with it (owner references)."""
        self._asked.discard(key)

    async def _create(self, what: str, request: Any) -> None:
        try:
            await call(what, request)
        except KubeApiError as error:
            if not error.already_exists:
                raise

    async def _forget_template(self, namespace: str, name: str) -> None:
        try:
            await call(
                f"delete PodTemplate {namespace}/{name}",
                self._core.delete_namespaced_pod_template(name, namespace, _request_timeout=self._timeout),
            )
        except KubeApiError as error:
            if not error.not_found:
                raise

    async def _note(self, pod: dict[str, Any], message: str) -> None:
        event = warning_event(
            pod,
            "Pod",
            reason=PROVISIONING_REASON,
            message=message,
            now=kube_time(datetime.now(UTC)),
            component=COMPONENT,
            suffix="provisioning",
            event_type="Normal",
        )
        await record_event(self._core, event, timeout_s=self._timeout)
