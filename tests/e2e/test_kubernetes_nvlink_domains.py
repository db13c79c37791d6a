"""A job that asks for one NVLink domain, on GB200 NVL racks and the real control plane.

Two simulated racks: rack a of three trays, rack b of two (each tray a node of 4 GPUs). A job of
8 one-GPU pods asks for one NVLink domain: it lands in one clique (rack b, which it fills exactly,
leaving rack a whole for a larger job), every pod gets the same IMEX channel through its CDI spec,
the IMEX daemon runs on exactly the job's two nodes with a nodes config listing exactly those (by
their Nodes' addresses), a GPU failing on one of them is told on the job's pods, and all of it is
gone once the pods are deleted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.allocator.domains import DOMAIN_TROUBLE_REASON
from tangram.dra.imex import imex_of
from tangram.imex.domains import NODES_FILE
from tangram.kubernetes.objects.gangs import GANG_LABEL, GANG_SIZE_ANNOTATION, NVLINK_DOMAIN_ANNOTATION
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.local.controlplane import ControlPlane
from tangram.local.processes import SimNode
from tangram.nvml import SimNvml
from tangram.nvml.sim.imexd import STATUS_FILE
from tests.e2e.kubecluster import (
    Node,
    allocator_state,
    claim_of,
    pod,
    started_fleet,
    template,
    until,
    wait_for_pod,
)
from tests.support.driver import DRIVER

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]

PODS = 8


@pytest.fixture
async def racks(controlplane: ControlPlane, kube: Any, unique: str) -> AsyncIterator[list[Node]]:
    suffix = unique.rsplit("-", 1)[-1]
    trays = [SimNode(f"a{i}-{suffix}", "gb200-tray", rack=f"rack-a-{suffix}") for i in (1, 2, 3)]
    trays += [SimNode(f"b{i}-{suffix}", "gb200-tray", rack=f"rack-b-{suffix}") for i in (1, 2)]
    addresses = {tray.name: f"10.250.0.{i}" for i, tray in enumerate(trays, start=1)}
    async with started_fleet(controlplane, kube, unique, trays, decide=True, addresses=addresses) as nodes:
        yield nodes


async def submit_job(node: Node, name: str) -> list[str]:
    ns = node.namespace
    request = {"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": 1}}
    await node.resource.create_namespaced_resource_claim_template(
        ns, template(name, ns, {"devices": {"requests": [request]}})
    )
    names = [f"{name}-{i}" for i in range(PODS)]
    for pod_name in names:
        manifest = pod(
            pod_name, ns, None, {"gpus": {"resourceClaimTemplateName": name}}, gates=[SCHEDULING_GATE]
        )
        manifest["metadata"]["labels"] = {GANG_LABEL: name}
        manifest["metadata"]["annotations"] = {
            GANG_SIZE_ANNOTATION: str(PODS),
            NVLINK_DOMAIN_ANNOTATION: "true",
        }
        await node.core.create_namespaced_pod(ns, manifest)
    return names


async def test_an_nvl72_job_of_eight_pods_lands_in_one_clique_with_one_imex_channel_and_leaves_nothing(
    racks: list[Node],
) -> None:
    first = racks[0]
    by_name = {n.name: n for n in racks}
    rack_b = sorted(n.name for n in racks if n.name.startswith("b"))
    names = await submit_job(first, "train")

    placed: dict[str, str] = {}
    channels = set()
    for pod_name in names:
        running = await wait_for_pod(first, pod_name, "Running")
        placed[pod_name] = running.spec.node_name
        claim = await claim_of(first, running, "gpus")
        channel = imex_of(claim["status"]["allocation"]["devices"].get("config") or [], DRIVER)
        assert channel is not None, claim["status"]["allocation"]
        channels.add(channel)
        # the pod's CDI spec on its node carries the domain's channel device node
        spec = json.loads(by_name[running.spec.node_name].spec_text(claim["metadata"]["uid"]))
        paths = [d["path"] for d in spec["containerEdits"]["deviceNodes"]]
        assert channel.device_path in paths, paths
    assert sorted(set(placed.values())) == rack_b, placed  # one clique: rack b, filled exactly
    [channel] = channels  # every pod the same channel, of one domain on exactly the job's nodes
    assert channel.domain == f"{first.namespace}/train" and list(channel.nodes) == rack_b

    # the daemons reach each other at their Nodes' InternalIPs: node names need not resolve
    peers = [f"10.250.0.{4 + rack_b.index(name)}" for name in rack_b]
    for name in rack_b:
        imex_root = first.cluster.imex_root(name)
        [domain_dir] = list(imex_root.iterdir())
        assert (domain_dir / NODES_FILE).read_text() == "".join(f"{p}\n" for p in peers)
        assert json.loads((domain_dir / STATUS_FILE).read_text())["nodes"] == peers  # the daemon's word
        device = first.cluster.driver_root(name) / channel.device_path.lstrip("/")
        assert device.exists()
    for node in racks:
        if node.name not in rack_b:
            imex_root = first.cluster.imex_root(node.name)
            assert not imex_root.exists() or not list(imex_root.iterdir())

    # a GPU of the first tray fails (a critical XID): the job's pods are told which node and why
    failing = rack_b[0]
    nvml = SimNvml.from_machine(
        str(first.cluster.workdir / failing / "machine.yaml"), state_file=first.cluster.state_file(failing)
    )
    nvml.nvmlInit()
    nvml.sim_inject_xid(1, 79)

    async def told() -> str | None:
        events = await first.core.list_namespaced_event(first.namespace)
        for event in events.items:
            if event.reason == DOMAIN_TROUBLE_REASON and event.involved_object.name in names:
                return str(event.message)
        return None

    message = await until("the job's pods told of the failed GPU", told)
    assert (
        f"NVLink domain {channel.domain}: GPU 1 (" in message and f"of node {failing} is unhealthy" in message
    )

    for pod_name in names:
        await first.core.delete_namespaced_pod(pod_name, first.namespace, grace_period_seconds=0)

    async def all_gone() -> bool:
        for name in rack_b:
            imex_root = first.cluster.imex_root(name)
            if imex_root.exists() and list(imex_root.iterdir()):
                return False
            if (first.cluster.driver_root(name) / channel.device_path.lstrip("/")).exists():
                return False
            if list(first.cluster.cdi_dir(name).glob("*.json")):
                return False
        state = await allocator_state(first.cluster)
        return not state.get("domains")

    await until("the domain's daemons, channels, CDI specs and ledger entry gone", all_gone)
