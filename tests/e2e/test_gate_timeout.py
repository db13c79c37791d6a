"""The gate timeout: kube-scheduler decides only with the allocator down past it.

Against the real control plane: one simulated node of Tangram's services (its slices published,
played by the test kubelet; the allocator keeps its Lease in the test's namespace) and the real
admission webhook process with a gate timeout of 3 s.

With the allocator killed, a pod using a Tangram 1g claim is gated at admission; nothing allocates
it; past the timeout (the allocator's Lease no longer renewed) the webhook removes the gate and
records a TangramGateTimeout Event, kube-scheduler allocates the claim and binds the pod to the
node; the allocator, started again, holds that allocation in its ledger as taken.

With the allocator alive and the node full, a pod whose claim cannot be placed keeps its gate well
past the timeout (the gate keeper judges it several times and keeps it: the Lease is fresh), and
Tangram allocates it once capacity frees.
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio.client import CoordinationV1Api, CoreV1Api

from services.admission.gatekeeper import REASON
from tangram.kubernetes.api import KubeApiError, call
from tangram.kubernetes.objects.alive import ALLOCATOR_LEASE
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.local.controlplane import ControlPlane
from tests.e2e.kubecluster import (
    DRIVER,
    MIG_1G,
    allocator_state,
    gpus_template,
    leading_allocator,
    pod,
    started_node,
    template,
    until,
    wait_for_pod,
)
from tests.e2e.webhook import gates_of, serving

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]

TIMEOUT_S = 3
KEPT = "scheduling gate kept past the timeout: the allocator is alive"


async def alive_lease(kube: Any, namespace: str) -> Any:
    try:
        return await call(
            "read the allocator's Lease",
            CoordinationV1Api(kube).read_namespaced_lease(ALLOCATOR_LEASE, namespace),
        )
    except KubeApiError as error:
        if error.not_found:
            return None
        raise


def times_kept(log: Path, pod: str) -> int:
    """How many times the webhook's gate keeper judged `pod` past the timeout and kept its gate."""
    count = 0
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and entry.get("message") == KEPT and entry.get("pod") == pod:
                count += 1
    return count


async def test_past_the_gate_timeout_kube_scheduler_allocates_and_tangram_adopts(
    controlplane: ControlPlane, kube: Any, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = CoreV1Api(kube)
    # the allocator keeps its Lease where this test's webhook reads it (its own namespace)
    monkeypatch.setenv("TANGRAM_NAMESPACE", unique)
    async with started_node(controlplane, kube, unique, decide=True) as node:
        ns = node.namespace

        async def leading() -> bool:
            return leading_allocator(node.cluster) == "allocator"

        await until("the allocator leading", leading)
        lease = await until("the allocator's Lease", lambda: alive_lease(kube, ns))
        assert lease.spec.holder_identity and lease.spec.renew_time is not None
        node.cluster.crash("allocator")  # every allocator down: its Lease is renewed no more
        request = {
            "name": "mig",
            "exactly": {
                "deviceClassName": "mig.gpu.tangram.dev",
                "selectors": [{"cel": {"expression": MIG_1G}}],
            },
        }
        await node.resource.create_namespaced_resource_claim_template(
            ns, template("small", ns, {"devices": {"requests": [request]}})
        )
        claims = {"c": {"resourceClaimTemplateName": "small"}}
        async with serving(
            controlplane, kube, unique, tmp_path, f"--gate-timeout={TIMEOUT_S}", make_namespace=False
        ):

            async def gated_in_a_dry_run() -> bool:
                # the API server picks up a new webhook configuration within a moment
                return SCHEDULING_GATE in await gates_of(
                    kube, ns, pod("probe", ns, None, claims), dry_run=True
                )

            await until("the API server calling the webhook", gated_in_a_dry_run)
            # gated at admission
            assert await gates_of(kube, ns, pod("late", ns, None, claims)) == [SCHEDULING_GATE]

            async def ungated() -> Any:
                found = await core.read_namespaced_pod("late", ns)
                return found if not found.spec.scheduling_gates else None

            released = await until("the gate removed past the timeout", ungated)

            async def recorded() -> list[Any]:
                found = await core.list_namespaced_event(ns)
                return [e for e in found.items if e.reason == REASON and e.involved_object.name == "late"]

            (timed_out,) = await until("the TangramGateTimeout Event", recorded)
            assert timed_out.type == "Warning"
            assert timed_out.involved_object.uid == released.metadata.uid
            assert f"within {TIMEOUT_S} s" in timed_out.message and "kube-scheduler" in timed_out.message
            # not before the timeout: held at least TIMEOUT_S from the pod's creation (both whole seconds)
            held = timed_out.first_timestamp - released.metadata.creation_timestamp
            assert held >= timedelta(seconds=TIMEOUT_S)

            # kube-scheduler allocates the claim from Tangram's slices and binds the pod to the node
            async def bound() -> Any:
                found = await core.read_namespaced_pod("late", ns)
                return found if found.spec.node_name and found.status.resource_claim_statuses else None

            placed = await until("kube-scheduler binding the pod", bound)
            assert placed.spec.node_name == node.name
            (status,) = placed.status.resource_claim_statuses
            claim = await call(
                "read the claim", node.resource.read_namespaced_resource_claim(status.resource_claim_name, ns)
            )
            (result,) = claim.status.allocation.devices.results
            assert (result.driver, result.pool) == (DRIVER, node.name)
            uid = claim.metadata.uid

            # the allocator, back, holds kube-scheduler's allocation as taken
            node.cluster.restart("allocator")

            async def adopted() -> bool:
                try:
                    state = await allocator_state(node.cluster)
                except (aiohttp.ClientError, OSError, ValueError, StopIteration):
                    return False  # not serving its state yet
                if "held" not in state:
                    return False  # serving, but not leading yet: no ledger to show
                return bool(
                    state["held"].get(uid) == node.name
                    and state["allocated"].get(node.name, {}).get(result.device) == uid
                )

            await until("the allocator adopting kube-scheduler's allocation", adopted)
            # and the node prepares it: the pod runs
            await wait_for_pod(node, "late", "Running")


async def test_with_the_allocator_alive_a_claim_that_cannot_be_placed_keeps_its_gate_past_the_timeout(
    controlplane: ControlPlane, kube: Any, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = CoreV1Api(kube)
    monkeypatch.setenv("TANGRAM_NAMESPACE", unique)
    async with started_node(controlplane, kube, unique, decide=True) as node:
        ns = node.namespace
        await node.resource.create_namespaced_resource_claim_template(ns, gpus_template("seven", ns, 7))
        await node.resource.create_namespaced_resource_claim_template(ns, gpus_template("one", ns, 1))
        await until("the allocator's Lease", lambda: alive_lease(kube, ns))
        async with serving(
            controlplane, kube, unique, tmp_path, f"--gate-timeout={TIMEOUT_S}", make_namespace=False
        ) as served:
            seven = {"gpus": {"resourceClaimTemplateName": "seven"}}

            async def gated_in_a_dry_run() -> bool:
                return SCHEDULING_GATE in await gates_of(
                    kube, ns, pod("probe", ns, None, seven), dry_run=True
                )

            await until("the API server calling the webhook", gated_in_a_dry_run)
            # every GPU the claims may use held by one pod, which Tangram places
            assert await gates_of(kube, ns, pod("holder", ns, None, seven)) == [SCHEDULING_GATE]
            await wait_for_pod(node, "holder", "Running")
            one = {"gpus": {"resourceClaimTemplateName": "one"}}
            assert await gates_of(kube, ns, pod("waiter", ns, None, one)) == [SCHEDULING_GATE]

            async def unschedulable() -> bool:
                events = await core.list_namespaced_event(ns)
                return any(
                    e.reason == "TangramUnschedulable" and e.involved_object.name == "waiter"
                    for e in events.items
                )

            await until("the allocator's TangramUnschedulable Event on the pod", unschedulable)

            # the gate keeper judges the pod past the timeout tick after tick (every 0.5 s here), and
            # keeps its gate each time: the allocator is alive
            async def kept_six_times() -> bool:
                return times_kept(served.webhook.log, f"{ns}/waiter") >= 6

            await until("the gate keeper keeping the gate six times", kept_six_times)
            waiting = await core.read_namespaced_pod("waiter", ns)
            assert [g.name for g in waiting.spec.scheduling_gates] == [SCHEDULING_GATE]
            assert waiting.spec.node_name is None
            held = datetime.now(UTC) - waiting.metadata.creation_timestamp
            assert held > timedelta(seconds=TIMEOUT_S)
            events = await core.list_namespaced_event(ns)
            assert not [e for e in events.items if e.reason == REASON]

            # capacity frees: Tangram places the pod it kept
            await core.delete_namespaced_pod("holder", ns)
            running = await wait_for_pod(node, "waiter", "Running")
            assert running.spec.node_name == node.name
            events = await core.list_namespaced_event(ns)
            assert not [e for e in events.items if e.reason == REASON]
