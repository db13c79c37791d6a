"""With the allocator down past the gate timeout, kube-scheduler decides and Tangram adopts.

Against the real control plane: one simulated node of Tangram's services (its slices published,
played by the test kubelet) whose allocator is killed, and the real admission webhook process with
a gate timeout of 3 s. A pod using a Tangram 1g claim is gated at admission; nothing allocates it
while the allocator is down; past the timeout the webhook removes the gate and records a
TangramGateTimeout Event, kube-scheduler allocates the claim and binds the pod to the node; the
allocator, started again, holds that allocation in its ledger as taken.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio.client import CoreV1Api

from tangram.admission.gatekeeper import REASON
from tangram.k8s.names import SCHEDULING_GATE
from tangram.kube import call
from tangram.kube.controlplane import ControlPlane
from tests.e2e.kubecluster import (
    DRIVER,
    MIG_1G,
    allocator_state,
    leading_allocator,
    pod,
    started_node,
    template,
    until,
    wait_for_pod,
)
from tests.e2e.test_admission import gates_of, serving

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]

TIMEOUT_S = 3


async def test_past_the_gate_timeout_kube_scheduler_allocates_and_tangram_adopts(
    controlplane: ControlPlane, kube: Any, unique: str, tmp_path: Path
) -> None:
    core = CoreV1Api(kube)
    async with started_node(controlplane, kube, unique, decide=True) as node:
        ns = node.namespace

        async def leading() -> bool:
            return leading_allocator(node.cluster) == "allocator"

        await until("the allocator leading", leading)
        node.cluster.crash("allocator")  # every allocator down
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
