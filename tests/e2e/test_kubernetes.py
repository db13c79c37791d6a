"""A claim made in Kubernetes reaches a ready device: the real control plane allocates from the
slices discovery publishes, the node makes the MIG instance and prepares, deletion undoes it all.

Tangram's services run as separate processes on a simulated HGX H200 (embedded NATS); the test
plays kubelet for the node with the kubelet stand-in over the real DRA socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

from tangram.cluster.kubelet import NodeKubelet
from tangram.cluster.up import install_device_classes
from tangram.demo.cluster import LocalCluster, SimNode
from tangram.kube import KubeApiError, call
from tangram.kube.controlplane import ControlPlane, register_node
from tangram.kubelet.client import ClaimHandle, KubeletClient
from tangram.partitioning import MigExecutor
from tests.partitioner.helpers import MINORS, sim

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]

DRIVER = "gpu.tangram.dev"
MACHINE = "hgx-h200"
WAIT_S = 120.0
# GPU 0 of the simulated HGX H200 starts with two MIG instances Kubernetes knows nothing of: the
# claims here stay off it, so the instance the test sees appear is the one made for the claim.
NOT_GPU0 = 'device.attributes["gpu.tangram.dev"].index >= 1'
MIG_1G = f'device.attributes["gpu.tangram.dev"].profile == "1g.18gb" && {NOT_GPU0}'


@dataclass
class Node:
    name: str
    namespace: str
    cluster: LocalCluster
    api: Any

    @property
    def core(self) -> CoreV1Api:
        return CoreV1Api(self.api)

    @property
    def resource(self) -> ResourceV1Api:
        return ResourceV1Api(self.api)

    def mig_uuids(self) -> set[str]:
        executor = MigExecutor(sim(MACHINE, self.cluster.state_file(self.name)), minors=MINORS)
        return {i.mig_uuid for gpu in range(8) for i in executor.observe(gpu) if i.mig_uuid}

    def spec_text(self, uid: str) -> str:
        return (self.cluster.cdi_dir(self.name) / f"{DRIVER}-claim_{uid}.json").read_text()


async def until(what: str, check: Callable[[], Awaitable[Any]], timeout: float = WAIT_S) -> Any:
    """Poll `check` until it returns something truthy; the deadline bounds a wait, never asserts time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        found = await check()
        if found:
            return found
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(0.2)


async def wait_for_pod(node: Node, name: str, phase: str) -> Any:
    """The pod once in `phase`, read until WAIT_S has passed (a watch can end early on a loaded
    machine); otherwise fail with what the API server says about it."""

    async def reached() -> Any:
        found = await node.core.read_namespaced_pod(name, node.namespace)
        return found if found.status.phase == phase else None

    try:
        return await until(f"pod {name} {phase}", reached)
    except AssertionError as error:
        raise AssertionError(f"{error}:\n{await why(node, name)}") from None


async def why(node: Node, name: str) -> str:
    """What the API server says about a pod that did not get where it should: its conditions and
    the events of its namespace (scheduling, claim allocation)."""
    lines = []
    with contextlib.suppress(KubeApiError, Exception):
        found = await node.core.read_namespaced_pod(name, node.namespace)
        lines += [
            f"  condition {c.type}={c.status}: {c.reason} {c.message}" for c in found.status.conditions or []
        ]
    with contextlib.suppress(Exception):
        events = await node.core.list_namespaced_event(node.namespace)
        lines += [
            f"  event {e.involved_object.kind}/{e.involved_object.name}: {e.reason}: {e.message}"
            for e in events.items
        ]
    return "\n".join(lines) or "  (nothing recorded)"


@pytest.fixture
async def node(controlplane: ControlPlane, kube: Any, unique: str) -> AsyncIterator[Node]:
    # Short: the node's DRA socket path, under the work folder, must fit a unix socket address.
    name = f"n1-{unique.rsplit('-', 1)[-1]}"
    await register_node(kube, name)
    await install_device_classes(kube)
    await call("create namespace", CoreV1Api(kube).create_namespace({"metadata": {"name": unique}}))
    cluster = LocalCluster([SimNode(name, MACHINE)], kubeconfig=controlplane.kubeconfig)
    cluster.start()
    stop = asyncio.Event()
    kubelet = NodeKubelet(kube, node=name, dra_socket=cluster.dra_socket(name))
    task = asyncio.create_task(kubelet.run(stop))
    try:

        async def serving() -> bool:
            return cluster.dra_socket(name).exists()

        # Tests that call the plugin themselves wait for it to serve, as kubelet waits for its
        # registration.
        await until("the node's kubelet plugin serving", serving)
        yield Node(name, unique, cluster, kube)
    finally:
        stop.set()
        await task
        codes = cluster.stop()
        with contextlib.suppress(KubeApiError):
            await call("delete namespace", CoreV1Api(kube).delete_namespace(unique))
        assert all(code == 0 for code in codes.values()), codes


def template(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": spec},
    }


def pod(name: str, namespace: str, node: str, claims: dict[str, dict[str, str]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": claim, **source} for claim, source in claims.items()],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": claim} for claim in claims]},
                }
            ],
        },
    }


async def claim_of(node: Node, pod_obj: Any, entry: str) -> dict[str, Any]:
    [name] = [s.resource_claim_name for s in pod_obj.status.resource_claim_statuses if s.name == entry]
    claim = await node.resource.read_namespaced_resource_claim(name, node.namespace)
    return dict(node.api.sanitize_for_serialization(claim))


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
    await node.resource.create_namespaced_resource_claim_template(
        ns,
        template(
            "pair",
            ns,
            {
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
        ),
    )
    before = node.mig_uuids()
    await node.core.create_namespaced_pod(
        ns,
        pod(
            "worker",
            ns,
            node.name,
            {"mig": {"resourceClaimTemplateName": "small"}, "gpus": {"resourceClaimTemplateName": "pair"}},
        ),
    )
    running = await wait_for_pod(node, "worker", "Running")
    assert running.spec.node_name == node.name

    mig_claim = await claim_of(node, running, "mig")
    pair_claim = await claim_of(node, running, "gpus")
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
