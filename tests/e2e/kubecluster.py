"""What the end-to-end tests against the real control plane share: one simulated node of Tangram's
services played by the test kubelet, polling, and the objects the tests make."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

from tangram.kubernetes.api import KubeApiError, call
from tangram.kubernetes.objects.gangs import GANG_LABEL, GANG_SIZE_ANNOTATION
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.local.clusterup import install_device_classes
from tangram.local.controlplane import ControlPlane, register_node
from tangram.local.kubelet import NodeKubelet
from tangram.local.processes import LocalCluster, SimNode, leading_allocator, logged_health_port
from tangram.partitioning import MigExecutor
from tests.partitioner.helpers import MINORS, sim
from tests.support.driver import DRIVER
from tests.support.polling import until

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
    machine: str = MACHINE

    @property
    def core(self) -> CoreV1Api:
        return CoreV1Api(self.api)

    @property
    def resource(self) -> ResourceV1Api:
        return ResourceV1Api(self.api)

    def mig_uuids(self) -> set[str]:
        executor = MigExecutor(sim(self.machine, self.cluster.state_file(self.name)), minors=MINORS)
        return {i.mig_uuid for gpu in range(8) for i in executor.observe(gpu) if i.mig_uuid}

    def spec_text(self, uid: str) -> str:
        return (self.cluster.cdi_dir(self.name) / f"{DRIVER}-claim_{uid}.json").read_text()


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


@contextlib.asynccontextmanager
async def started_node(
    controlplane: ControlPlane,
    kube: Any,
    unique: str,
    *,
    decide: bool = False,
    allocators: int = 1,
    machine: str = MACHINE,
) -> AsyncIterator[Node]:
    """One simulated node of Tangram's services against the control plane, played by the test
    kubelet; with `decide`, the allocator decides the claims of pods held by Tangram's gate."""
    # Short: the node's DRA socket path, under the work folder, must fit a unix socket address.
    name = f"n1-{unique.rsplit('-', 1)[-1]}"
    async with started_fleet(
        controlplane, kube, unique, [SimNode(name, machine)], decide=decide, allocators=allocators
    ) as nodes:
        yield nodes[0]


@contextlib.asynccontextmanager
async def started_fleet(
    controlplane: ControlPlane,
    kube: Any,
    unique: str,
    sims: list[SimNode],
    *,
    decide: bool = False,
    allocators: int = 1,
    labels: Mapping[str, Mapping[str, str]] | None = None,
    addresses: Mapping[str, str] | None = None,
) -> AsyncIterator[list[Node]]:
    """Simulated nodes of Tangram's services against the control plane, each played by a test
    kubelet, in the namespace `unique`; `labels`: node name -> its Node's labels; `addresses`:
    node name -> the InternalIP its Node reports."""
    for sim_node in sims:
        await register_node(
            kube,
            sim_node.name,
            labels=(labels or {}).get(sim_node.name),
            address=(addresses or {}).get(sim_node.name),
        )
    await install_device_classes(kube)
    await call("create namespace", CoreV1Api(kube).create_namespace({"metadata": {"name": unique}}))
    cluster = LocalCluster(
        list(sims),
        kubeconfig=controlplane.kubeconfig,
        decide_in_kubernetes=decide,
        allocators=allocators,
    )
    cluster.start()
    stop = asyncio.Event()
    kubelets = [
        asyncio.create_task(NodeKubelet(kube, node=n.name, dra_socket=cluster.dra_socket(n.name)).run(stop))
        for n in sims
    ]
    failed = False
    try:
        for sim_node in sims:

            async def serving(name: str = sim_node.name) -> bool:
                return cluster.dra_socket(name).exists()

            # Tests that call the plugin themselves wait for it to serve, as kubelet waits for its
            # registration.
            await until(f"the kubelet plugin of {sim_node.name} serving", serving)
        yield [Node(n.name, unique, cluster, kube, n.machine) for n in sims]
    except BaseException:
        failed = True
        raise
    finally:
        stop.set()
        await asyncio.gather(*kubelets)
        codes = cluster.stop()
        with contextlib.suppress(KubeApiError):
            await call("delete namespace", CoreV1Api(kube).delete_namespace(unique))
        # a node left behind, with its ResourceSlices, is one kube-scheduler may bind a later
        # test's pod to, where no kubelet runs
        for sim_node in sims:
            with contextlib.suppress(KubeApiError):
                await call("delete node", CoreV1Api(kube).delete_node(sim_node.name))
        assert all(code == 0 for name, code in codes.items() if name not in cluster.crashed), codes
        if not failed:  # what failed keeps its services' logs and state to look at
            shutil.rmtree(cluster.workdir, ignore_errors=True)


def template(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": spec},
    }


def pod(
    name: str,
    namespace: str,
    node: str | None,
    claims: dict[str, dict[str, str]],
    *,
    gates: list[str] = [],  # noqa: B006 - never changed
) -> dict[str, Any]:
    """A pod using `claims`, pinned to `node` when given, held by `gates` (as admission adds them)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            **({"nodeSelector": {"kubernetes.io/hostname": node}} if node else {}),
            **({"schedulingGates": [{"name": g} for g in gates]} if gates else {}),
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


__all__ = ["leading_allocator", "logged_health_port"]


async def allocator_state(cluster: LocalCluster, name: str = "allocator") -> dict[str, Any]:
    """What a running allocator's ledger holds (its /state), read at the port it logged last."""
    return await allocator_state_at(logged_health_port(cluster.service(name).log_path))


async def allocator_state_at(port: int) -> dict[str, Any]:
    """What the allocator's ledger answering at `port` holds (its /state)."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/state") as answer:
        return dict(await answer.json())


def gpus_template(name: str, namespace: str, count: int) -> dict[str, Any]:
    request = {
        "name": "gpus",
        "exactly": {
            "deviceClassName": DRIVER,
            "count": count,
            "selectors": [{"cel": {"expression": NOT_GPU0}}],
        },
    }
    return template(name, namespace, {"devices": {"requests": [request]}})


async def gang_member(
    node: Node, name: str, gpus: int, group: str | None, size: int, *, gated: bool = True
) -> None:
    """A pod of `gpus` whole GPUs in `group` of `size` pods (alone when `group` is None)."""
    ns = node.namespace
    await node.resource.create_namespaced_resource_claim_template(ns, gpus_template(name, ns, gpus))
    manifest = pod(
        name,
        ns,
        None,
        {"gpus": {"resourceClaimTemplateName": name}},
        gates=[SCHEDULING_GATE] if gated else [],
    )
    if group is not None:
        manifest["metadata"]["labels"] = {GANG_LABEL: group}
        manifest["metadata"]["annotations"] = {GANG_SIZE_ANNOTATION: str(size)}
    await node.core.create_namespaced_pod(ns, manifest)


async def pod_events(node: Node, pod_name: str, reason: str) -> list[str]:
    found = await node.core.list_namespaced_event(node.namespace)
    return [
        str(e.message)
        for e in found.items
        if e.reason == reason and e.involved_object.kind == "Pod" and e.involved_object.name == pod_name
    ]


async def pod_gone(node: Node, name: str) -> bool:
    try:
        await node.core.read_namespaced_pod(name, node.namespace)
    except Exception:
        return True
    return False
