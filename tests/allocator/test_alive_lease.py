"""The leading allocator's Lease against the real API server: renewed every tick, and a failure
(here its namespace missing) logged and retried, never fatal."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from kubernetes_asyncio.client import CoordinationV1Api, CoreV1Api

from services.allocator.alive import AliveLease
from tangram.kubernetes.api import KubeApiError, call
from tangram.kubernetes.objects.alive import ALLOCATOR_LEASE
from tests.support.polling import until


@pytest.mark.controlplane
@pytest.mark.timeout(300)
async def test_the_lease_is_renewed_and_a_failure_is_retried_not_fatal(kube: Any, unique: str) -> None:
    core = CoreV1Api(kube)
    alive = AliveLease(kube, namespace=unique, holder="allocator-1", renew_s=0.2)
    stop = asyncio.Event()
    task = asyncio.create_task(alive.run(stop))
    try:
        # the namespace does not exist yet: every renewal fails, and the renewer keeps trying
        async def failed_thrice() -> bool:
            return alive.failures >= 3

        await until("three failed renewals", failed_thrice)
        assert not task.done() and alive.renewals == 0
        await call("create namespace", core.create_namespace({"metadata": {"name": unique}}))

        async def renewed_twice() -> bool:
            return alive.renewals >= 2

        await until("the Lease created and renewed", renewed_twice)
        lease = await call(
            "read the lease", CoordinationV1Api(kube).read_namespaced_lease(ALLOCATOR_LEASE, unique)
        )
        assert lease.spec.holder_identity == "allocator-1"
        first = lease.spec.renew_time

        async def later_renewal() -> bool:
            again = await CoordinationV1Api(kube).read_namespaced_lease(ALLOCATOR_LEASE, unique)
            return bool(again.spec.renew_time > first)

        await until("the Lease renewed again", later_renewal)
        stop.set()
        await asyncio.wait_for(task, 10)  # stops at once, without an error
    finally:
        stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, KubeApiError):
            await task
        with contextlib.suppress(KubeApiError):
            await call("delete namespace", core.delete_namespace(unique))
