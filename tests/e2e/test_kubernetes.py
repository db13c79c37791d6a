"""A claim made in Kubernetes reaches a ready device: the real control plane allocates from the
slices discovery publishes, the node makes the MIG instance and prepares, deletion undoes it all.

Tangram's services run as separate processes on a simulated HGX H200 (embedded NATS); the test
plays kubelet for the node with the kubelet stand-in over the real DRA socket.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tangram.kubelet.client import ClaimHandle, KubeletClient
from tangram.local.controlplane import ControlPlane
from tests.e2e.kubecluster import (
    DRIVER,
    MIG_1G,
    NOT_GPU0,
    Node,
    claim_of,
    pod,
    started_node,
    template,
    until,
    wait_for_pod,
)

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]


@pytest.fixture
async def node(controlplane: ControlPlane, kube: Any, unique: str) -> AsyncIterator[Node]:
    async with started_node(controlplane, kube, unique) as started:
        yield started


async def test_a_pod_gets_a_new_mig_instance_and_an_nvlink_pair(node: Node) -> None:
    ns = node.namespace
    await node.resource.create_namespaced_resource_claim_template(
        ns,
        template(
            "small",
            ns,
            {
                "devices": {
                    "requests": [
                        {
                            "name": "mig",
                            "exactly": {
                                "deviceClassName": "mig.gpu.tangram.dev",
                                "selectors": [{"cel": {"expression": MIG_1G}}],
                            },
                        }
                    ]
                }
            },
        ),
    )
    # The pair is a claim of its own, named by the pod, not a second template: before 1.37,
    # kube-controller-manager can flap a pod's status between its generated claims when the pod
    # has two templates (kubernetes/kubernetes#138407), and no kubelet then finds both.
    await node.resource.create_namespaced_resource_claim(
        ns,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "pair", "namespace": ns},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpus",
                            "exactly": {
                                "deviceClassName": DRIVER,
                                "count": 2,
                                "selectors": [{"cel": {"expression": NOT_GPU0}}],
                            },
                        }
                    ],
                    "constraints": [{"requests": ["gpus"], "matchAttribute": f"{DRIVER}/nvlinkDomain"}],
                }
            },
        },
    )
    before = node.mig_uuids()
    await node.core.create_namespaced_pod(
        ns,
        pod(
            "worker",
            ns,
            node.name,
            {"mig": {"resourceClaimTemplateName": "small"}, "gpus": {"resourceClaimName": "pair"}},
        ),
    )
    running = await wait_for_pod(node, "worker", "Running")
    assert running.spec.node_name == node.name

    mig_claim = await claim_of(node, running, "mig")
    pair_claim = node.api.sanitize_for_serialization(
        await node.resource.read_namespaced_resource_claim("pair", ns)
    )
    [mig_result] = mig_claim["status"]["allocation"]["devices"]["results"]
    assert mig_result["driver"] == DRIVER and mig_result["pool"] == node.name
    assert "-mig-1g-18gb-" in mig_result["device"]
    pair = pair_claim["status"]["allocation"]["devices"]["results"]
    assert len(pair) == 2 and all("-mig-" not in r["device"] for r in pair)

    [made] = node.mig_uuids() - before
    assert made in node.spec_text(mig_claim["metadata"]["uid"])
    spec = json.loads(node.spec_text(pair_claim["metadata"]["uid"]))
    assert len(spec["devices"]) == 2

    await node.core.delete_namespaced_pod("worker", ns)

    async def pod_gone() -> bool:
        try:
            await node.core.read_namespaced_pod("worker", ns)
        except Exception:
            return True
        return False

    await until("the pod removed after unprepare", pod_gone)

    async def destroyed() -> bool:
        return made not in node.mig_uuids()

    await until("the MIG instance destroyed", destroyed)
    assert not (
        node.cluster.cdi_dir(node.name) / f"{DRIVER}-claim_{mig_claim['metadata']['uid']}.json"
    ).exists()

    async def claim_released() -> bool:
        try:
            left = await node.resource.read_namespaced_resource_claim(mig_claim["metadata"]["name"], ns)
        except Exception:
            return True  # deleted with its pod by the resourceclaim controller
        return left.status is None or left.status.allocation is None

    await until("the generated claim gone or deallocated", claim_released)


async def test_bad_claims_fail_prepare_with_the_reason(node: Node) -> None:
    ns = node.namespace
    malformed = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "malformed", "namespace": ns},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "selectors": [{"cel": {"expression": NOT_GPU0}}],
                        },
                    }
                ],
                "config": [
                    {
                        "requests": ["gpu"],
                        "opaque": {
                            "driver": DRIVER,
                            "parameters": {
                                "apiVersion": "gpu.tangram.dev/v1alpha1",
                                "kind": "TopologyConfig",
                                "interconnect": "Carrier-Pigeon",
                            },
                        },
                    }
                ],
            }
        },
    }
    await node.resource.create_namespaced_resource_claim(ns, malformed)
    await node.core.create_namespaced_pod(
        ns, pod("bad-config", ns, node.name, {"gpu": {"resourceClaimName": "malformed"}})
    )

    async def allocated() -> Any:
        claim = await node.resource.read_namespaced_resource_claim("malformed", ns)
        return claim if claim.status is not None and claim.status.allocation is not None else None

    claim = await until("kube-scheduler allocates the claim", allocated)
    async with KubeletClient(node.cluster.dra_socket(node.name)) as client:
        answer = await client.prepare([ClaimHandle(namespace=ns, uid=claim.metadata.uid, name="malformed")])
    error = answer[claim.metadata.uid].error
    assert "status.allocation.devices.config[0].opaque.parameters.interconnect" in error, error
    assert not (node.cluster.cdi_dir(node.name) / f"{DRIVER}-claim_{claim.metadata.uid}.json").exists()


async def test_a_claim_of_another_driver_is_refused(node: Node) -> None:
    ns = node.namespace
    other = f"{ns}.example.com"
    await node.resource.create_resource_slice(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{ns}-other"},
            "spec": {
                "driver": other,
                "nodeName": node.name,
                "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "nic-0"}],
            },
        }
    )
    await node.resource.create_device_class(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": other},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{other}"'}}]},
        }
    )
    await node.resource.create_namespaced_resource_claim(
        ns,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "nic", "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": other}}]}},
        },
    )
    await node.core.create_namespaced_pod(
        ns, pod("nic-user", ns, node.name, {"nic": {"resourceClaimName": "nic"}})
    )

    async def allocated() -> Any:
        claim = await node.resource.read_namespaced_resource_claim("nic", ns)
        return claim if claim.status is not None and claim.status.allocation is not None else None

    claim = await until("kube-scheduler allocates the other driver's device", allocated)
    async with KubeletClient(node.cluster.dra_socket(node.name)) as client:
        answer = await client.prepare([ClaimHandle(namespace=ns, uid=claim.metadata.uid, name="nic")])
    error = answer[claim.metadata.uid].error
    assert f"holds no device of driver {DRIVER}" in error and other in error, error
    await node.resource.delete_device_class(other)
    await node.resource.delete_resource_slice(f"{ns}-other")
