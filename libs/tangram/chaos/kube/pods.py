"""The pods a chaos run on Kubernetes makes: their shapes, priorities and manifests (pure), and the
API calls that ride out the API server, or admission, being down."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio.client import CoreV1Api

from tangram.kubernetes.api import KubeApiError, call, call_json

NAMESPACE = "chaos"
# (PriorityClass, value): the pods' priorities, mixed so that preemption happens
PRIORITIES = (("chaos-low", 100), ("chaos-mid", 500), ("chaos-high", 1000))
PRIORITY_WEIGHTS = (5, 3, 2)
# GPU 0 of a simulated HGX H200 holds MIG instances made before Tangram ran: kept out of the run
NOT_GPU0 = 'device.attributes["gpu.tangram.dev"].index >= 1'
TOPOLOGY = {"apiVersion": "gpu.tangram.dev/v1alpha1", "kind": "TopologyConfig", "interconnect": "NVLink"}
API_DOWN_S = 180.0  # how long a call waits for an API server that is restarting
ADMISSION_DOWN = "failed calling webhook"  # the API server's refusal while the webhook is down
# A restarted API server's Priority admission reads PriorityClasses from a cache that may not have
# synced yet: it refuses a pod naming a class the run made at its start (403) for a moment.
PRIORITY_NOT_SYNCED = "no PriorityClass with name"

T = TypeVar("T")


def _gpus(count: int, *, nvlink: bool = False) -> dict[str, Any]:
    request = {
        "name": "gpus",
        "exactly": {
            "deviceClassName": "gpu.tangram.dev",
            "count": count,
            "selectors": [{"cel": {"expression": NOT_GPU0}}],
        },
    }
    devices: dict[str, Any] = {"requests": [request]}
    if nvlink:
        devices["config"] = [
            {"requests": ["gpus"], "opaque": {"driver": "gpu.tangram.dev", "parameters": TOPOLOGY}}
        ]
    return {"devices": devices}


def _mig() -> dict[str, Any]:
    expression = f'device.attributes["gpu.tangram.dev"].placementSize == 1 && {NOT_GPU0}'
    request = {
        "name": "gpus",
        "exactly": {
            "deviceClassName": "mig.gpu.tangram.dev",
            "selectors": [{"cel": {"expression": expression}}],
        },
    }
    return {"devices": {"requests": [request]}}


SHAPES: dict[str, dict[str, Any]] = {
    "whole-1": _gpus(1),
    "nvlink-2": _gpus(2, nvlink=True),
    "whole-4": _gpus(4),
    "mig-1-slice": _mig(),
}
SHAPE_WEIGHTS = (3, 2, 1, 4)


def pick(rng: random.Random) -> tuple[str, str]:
    """A shape and a PriorityClass for the next pod."""
    shape = rng.choices(list(SHAPES), SHAPE_WEIGHTS)[0]
    priority = rng.choices([name for name, _ in PRIORITIES], PRIORITY_WEIGHTS)[0]
    return shape, priority


def claim_template(shape: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": shape, "namespace": NAMESPACE},
        "spec": {"spec": SHAPES[shape]},
    }


def claim(name: str, shape: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": SHAPES[shape],
    }


def pod(
    name: str, priority: str, *, template: str | None = None, claim_name: str | None = None
) -> dict[str, Any]:
    """A pod using one claim, from a template or named; no gate: admission adds Tangram's."""
    source = {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim_name}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "chaos"}},
        "spec": {
            "priorityClassName": priority,
            "resourceClaims": [{"name": "gpus", **source}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpus"}]},
                }
            ],
        },
    }


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "preemptionPolicy": "PreemptLowerPriority",
    }


def transient(error: BaseException) -> bool:
    """An API server that is down or restarting, not one that refused the request for good."""
    if isinstance(error, KubeApiError):
        return (
            error.status == 0
            or error.status >= 500
            or error.status == 429
            or (error.status == 403 and PRIORITY_NOT_SYNCED in str(error))
        )
    return isinstance(error, aiohttp.ClientError | TimeoutError | ConnectionError)


async def retrying(call: Callable[[], Awaitable[T]], *, within_s: float = API_DOWN_S) -> T:
    """`call()` until it is answered (the API server may be restarting), at most `within_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    delay = 0.2
    while True:
        try:
            return await call()
        except Exception as error:
            if not transient(error) or loop.time() > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


async def create_pod(core: CoreV1Api, manifest: dict[str, Any]) -> int:
    """Create the pod as its controller would: again while the API server is down, or refuses it
    because the webhook is (failurePolicy Fail: never admitted without the gate). How many times
    admission refused it."""
    name = manifest["metadata"]["name"]
    refused = 0

    async def create() -> Any:
        nonlocal refused
        try:
            return await call(f"create Pod {name}", core.create_namespaced_pod(NAMESPACE, manifest))
        except KubeApiError as error:
            if ADMISSION_DOWN in str(error):
                refused += 1
            raise

    try:
        await retrying(create)
    except KubeApiError as error:
        if not error.already_exists:
            raise  # already there: an earlier try landed before the API server went away
    return refused


async def read_pod(core: CoreV1Api, name: str) -> dict[str, Any]:
    found: dict[str, Any] = await retrying(
        lambda: call_json(
            f"read Pod {name}", core.read_namespaced_pod(name, NAMESPACE, _preload_content=False)
        )
    )
    return found


async def delete_pod(core: CoreV1Api, name: str) -> None:
    try:
        await retrying(lambda: call(f"delete Pod {name}", core.delete_namespaced_pod(name, NAMESPACE)))
    except KubeApiError as error:
        if not error.not_found:
            raise
