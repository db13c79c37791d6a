"""`tangram bench kubernetes` against the real control plane: kube-scheduler deciding a small
workload on one simulated node, the report checked against what the API server holds."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

from tangram.allocation import Allocated, Claim, FleetState
from tangram.bench import kubernetes as kb
from tangram.bench.traces import Arrival, shipped_classes
from tangram.kubernetes.api import KubeApiError, call
from tangram.kubernetes.objects.claimbridge import allocation_status
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tangram.kubernetes.objects.times import kube_time
from tangram.local.controlplane import ControlPlane, Release
from tests.support.polling import until

pytestmark = [pytest.mark.timeout(300), pytest.mark.controlplane]


async def test_the_kube_scheduler_run_reports_what_the_api_server_holds(
    controlplane: ControlPlane, kube: Any, unique: str
) -> None:
    # H100 NVL: pairs of NVLink-bridged GPUs, so a 4- or 8-GPU NVLink claim cannot be placed.
    node = f"kb-{unique.rsplit('-', 1)[-1]}"
    ops = kb.workload(1, 8, pods=0, saturation=1.3)  # about ten pods, asking for 1.3x the GPUs
    core = CoreV1Api(kube)
    try:
        report = await kb.run_decider(
            kube,
            controlplane.kubeconfig,
            [(node, "h100-nvl-4x2")],
            ops,
            kb.kube_scheduler_decider(),
            namespace=unique,
            cleanup=False,
        )
        names = [row["pod"] for row in report["pods"]]

        async def scheduler_events() -> dict[str, list[Any]] | None:
            events = await call("list events", core.list_namespaced_event(unique))
            by_pod: dict[str, list[Any]] = {}
            for event in events.items:
                if event.involved_object.kind == "Pod":
                    by_pod.setdefault(event.involved_object.name, []).append(event)
            return by_pod if set(names) <= set(by_pod) else None

        events = await until("kube-scheduler's events for every pod", scheduler_events)
        listed = await call("list pods", core.list_namespaced_pod(unique))
    finally:
        with contextlib.suppress(KubeApiError):
            await call("delete namespace", core.delete_namespace(unique))

    # What kube-scheduler recorded, pod by pod in creation order: bound, or not placeable.
    placed = [next((e.message for e in events[name] if e.reason == "Scheduled"), None) for name in names]
    assert all(
        any(e.reason == "FailedScheduling" for e in events[name])
        for name, where in zip(names, placed, strict=True)
        if where is None
    )
    admitted = placed.index(None)  # more is asked for than the node holds: one pod was not placed
    assert report["admitted_before_first_unplaceable"] == admitted > 0
    assert report["first_unplaceable"]["pod"] == names[admitted]
    assert all(
        where.endswith(f"/{name} to {node}") for name, where in zip(names, placed, strict=True) if where
    )
    assert report["pods_scheduled"] == sum(where is not None for where in placed)
    assert report["pods_unplaceable"] == placed.count(None) == len(names) - report["pods_scheduled"]
    assert report["pods_created"] == len(names) and report["pods_deleted"] == 0

    # Nothing departs in this trace: the scheduled pods are all there, bound and prepared; the
    # unplaceable ones were taken away.
    in_api = {pod.metadata.name: pod for pod in listed.items}
    assert set(in_api) == {name for name, where in zip(names, placed, strict=True) if where}
    assert all(pod.spec.node_name == node and pod.status.phase == "Running" for pod in in_api.values())
    assert report["prepared"] == len(in_api) and report["not_prepared"] == 0

    shapes = {kb.pod_name(op.uid): op.shape for op in ops if isinstance(op, Arrival)}
    multi = [name for name in in_api if shapes[name].kind == "gpu" and shapes[name].count > 1]
    assert report["multi_gpu_claims"] == len(multi)
    assert 0 <= report["stranded_gpus"] <= 8 - report["admitted_gpus"]
    for key in ("create_to_scheduled", "create_to_prepared"):
        assert 0 < report[key]["p50_ms"] <= report[key]["p99_ms"]
    assert report["create_to_scheduled"]["p50_ms"] < report["create_to_prepared"]["p50_ms"]
    assert report["decisions"] == len(names) and report["decisions_per_s"] > 0


class AllocatorStandIn:
    """What the Tangram run expects of the allocator in its Kubernetes mode, played by the test
    until that mode exists: for each gated pod of the namespace, decide its claim (FleetState,
    Tangram's policy), write `status.allocation` with a node selector and lift the gate; a claim
    that cannot be placed gets a Warning Event on its pod. A deleted claim is released."""

    def __init__(self, kube: Any, namespace: str, nodes: list[tuple[str, str]]) -> None:
        self.core, self.resource = CoreV1Api(kube), ResourceV1Api(kube)
        self.kube, self.namespace = kube, namespace
        self.fleet = FleetState()
        for hw in kb.node_hardware(nodes):
            self.fleet.apply_inventory(hw)
        self.classes = shipped_classes()
        self.held: set[str] = set()
        self.refused: set[str] = set()
        self.allocated = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(KubeApiError):
                await self.once()
            await asyncio.sleep(0.05)

    async def once(self) -> None:
        ns = self.namespace
        pods = await call("list pods", self.core.list_namespaced_pod(ns))
        listed = await call("list claims", self.resource.list_namespaced_resource_claim(ns))
        claims = {c.metadata.name: c for c in listed.items}
        for uid in self.held - {c.metadata.uid for c in claims.values()}:
            self.fleet.release(uid)
            self.held.discard(uid)
        for pod in pods.items:
            if not any(g.name == SCHEDULING_GATE for g in pod.spec.scheduling_gates or []):
                continue
            generated = [s.resource_claim_name for s in pod.status.resource_claim_statuses or []]
            claim = claims.get(generated[0]) if generated else None
            if claim is None or pod.metadata.name in self.refused:
                continue
            uid = claim.metadata.uid
            if uid not in self.held and not await self.decide(claim, pod):
                continue
            await call(
                "lift the gate",
                self.core.patch_namespaced_pod(
                    pod.metadata.name, ns, [{"op": "remove", "path": "/spec/schedulingGates"}]
                ),
            )

    async def decide(self, claim: Any, pod: Any) -> bool:
        """Allocate the claim and write `status.allocation`; False (and a Warning) when it cannot."""
        ns, uid = self.namespace, claim.metadata.uid
        spec = self.kube.sanitize_for_serialization(claim.spec)
        decision = self.fleet.allocate(
            Claim(namespace=ns, name=claim.metadata.name, uid=uid, spec=spec), self.classes
        )
        if not isinstance(decision, Allocated):
            self.refused.add(pod.metadata.name)
            await self.warn(pod, decision.reason)
            return False
        # as the allocator writes it: stamped, or a 1.36+ kube-scheduler never binds the pod
        allocation = allocation_status(decision, allocated_at=kube_time(datetime.now(UTC)))
        await call(
            "write status.allocation",
            self.resource.patch_namespaced_resource_claim_status(
                claim.metadata.name, ns, {"status": {"allocation": allocation}}
            ),
        )
        self.held.add(uid)
        self.allocated += 1
        return True

    async def warn(self, pod: Any, reason: str) -> None:
        name = f"{pod.metadata.name}.{secrets.token_hex(4)}"
        event = {
            "metadata": {"name": name, "namespace": self.namespace},
            "involvedObject": {
                "kind": "Pod",
                "name": pod.metadata.name,
                "namespace": self.namespace,
                "uid": pod.metadata.uid,
            },
            "type": "Warning",
            "reason": "FailedAllocation",
            "message": reason[:1000],
            "source": {"component": "tangram-allocator"},
        }
        await call("create event", self.core.create_namespaced_event(self.namespace, event))


async def test_the_tangram_run_drives_gated_pods_to_whoever_lifts_the_gate(
    controlplane: ControlPlane, kube: Any, unique: str
) -> None:
    """The Tangram run as the bench makes it, with the allocator's part played by the test: the
    pods carry the gate, a lifted gate and a bound pod is a decision, a Warning Event is a refusal."""
    node = f"kt-{unique.rsplit('-', 1)[-1]}"
    nodes = [(node, "h100-nvl-4x2")]
    ops = kb.workload(1, 8, pods=0, saturation=1.3)
    decider = dataclasses.replace(kb.tangram_decider(controlplane.kubeconfig), allocator_args=())
    stop = asyncio.Event()
    stand_in = AllocatorStandIn(kube, unique, nodes)
    task = asyncio.create_task(stand_in.run(stop))
    try:
        report = await kb.run_decider(kube, controlplane.kubeconfig, nodes, ops, decider, namespace=unique)
    finally:
        stop.set()
        await task
    names = [row["pod"] for row in report["pods"]]
    placed = [row["node"] for row in report["pods"]]
    assert set(placed) == {node, None}
    admitted = placed.index(None)
    assert report["admitted_before_first_unplaceable"] == admitted > 0
    assert report["first_unplaceable"]["pod"] == names[admitted]
    assert report["first_unplaceable"]["reason"].startswith("FailedAllocation: ")
    assert report["pods_unplaceable"] == len(stand_in.refused) == placed.count(None)
    assert report["prepared"] == report["pods_scheduled"] == stand_in.allocated > 0
    for key in ("create_to_scheduled", "create_to_prepared"):
        assert 0 < report[key]["p50_ms"] <= report[key]["p99_ms"]


async def test_the_tangram_run_with_the_allocator_deciding(
    controlplane: ControlPlane, kube: Any, unique: str
) -> None:
    """The Tangram run as the bench makes it, the allocator itself deciding: gated pods are placed
    until the node is full, then refused with the allocator's Warning Event."""
    node = f"kr-{unique.rsplit('-', 1)[-1]}"
    nodes = [(node, "h100-nvl-4x2")]
    ops = kb.workload(1, 8, pods=0, saturation=1.3)
    report = await kb.run_decider(
        kube,
        controlplane.kubeconfig,
        nodes,
        ops,
        kb.tangram_decider(controlplane.kubeconfig),
        namespace=unique,
    )
    placed = [row["node"] for row in report["pods"]]
    assert set(placed) == {node, None}
    admitted = placed.index(None)
    assert report["admitted_before_first_unplaceable"] == admitted > 0
    assert report["first_unplaceable"]["reason"].startswith("TangramUnschedulable: ")
    assert report["prepared"] == report["pods_scheduled"] > 0


async def test_synthetic_nodes_are_filled_then_churned_by_each_decider(
    controlplane: ControlPlane, kube: Any, unique: str, release: Release
) -> None:
    """No kubelet and no per-node process: the nodes' slices and inventories are all there is, and
    each decider fills every GPU, then keeps the cluster at half full while pods come and go."""
    suffix = unique.rsplit("-", 1)[-1]
    nodes = kb.synthetic_fleet(2, "scheduler-perf", prefix=f"sy{suffix}-")
    phases = kb.scheduler_perf_phases(16, steady=4, seed=1)
    reports = {}
    for decider in (kb.kube_scheduler_decider(), kb.tangram_decider(controlplane.kubeconfig)):
        reports[decider.name] = await kb.run_synthetic(
            kube,
            controlplane,
            nodes,
            phases,
            decider,
            namespace=f"sy{suffix}-{decider.name[:4]}",
            concurrency=8,
            rate=0,
        )
    for name, report in reports.items():
        assert report["decider"] == name and report["layout"] == release.minor
        fill = report["phases"]["fill"]
        assert (fill["pods_created"], fill["pods_scheduled"], fill["ended"]) == (16, 16, "bound"), report
        assert report["phases"]["steady"]["pods_scheduled"] == 4, report
        assert (report["pods_created"], report["pods_scheduled"], report["pods_deleted"]) == (20, 20, 12)
        assert report["first_unplaceable"] is None and report["stranded_gpus"] == 0
        assert report["pods_scheduled_per_s"] > 0 and report["api_requests_per_pod"] > 1
        p50, p99 = report["measured_create_to_scheduled"].values()
        assert 0 < p50 <= p99
    assert reports["tangram"]["allocator_cpu_s_per_pod"] > 0
    assert reports["tangram"]["allocator_peak_rss_mb"] > 0
    assert reports["kube-scheduler"]["allocator_cpu_s_per_pod"] is None
    # the synthetic nodes are gone with the run, and their slices with them (the garbage collector
    # follows the slices' owner, the Node)
    listed = await call("list nodes", CoreV1Api(kube).list_node())
    assert not [n.metadata.name for n in listed.items if n.metadata.name.startswith(f"sy{suffix}-")]

    async def slices_gone() -> bool:
        slices = await call("list slices", ResourceV1Api(kube).list_resource_slice())
        return not [s for s in slices.items if (s.spec.node_name or "").startswith(f"sy{suffix}-")]

    await until("the synthetic nodes' slices collected", slices_gone, 60)


async def test_a_phase_past_capacity_ends_once_each_decider_declares_the_rest_unplaceable(
    controlplane: ControlPlane, kube: Any, unique: str
) -> None:
    """Ten 1-GPU pods for one 8-GPU node: the phase ends on the deciders' own word that two cannot
    be placed (kube-scheduler's Unschedulable condition, Tangram's Event), not on a quiet spell."""
    suffix = unique.rsplit("-", 1)[-1]
    nodes = kb.synthetic_fleet(1, "scheduler-perf", prefix=f"so{suffix}-")
    phases = [kb.Phase("fill", [Arrival(f"claim-over-{n}", kb.ONE_GPU) for n in range(10)], True)]
    says = {"kube-scheduler": "Unschedulable: ", "tangram": "TangramUnschedulable: "}
    for decider in (kb.kube_scheduler_decider(), kb.tangram_decider(controlplane.kubeconfig)):
        report = await kb.run_synthetic(
            kube,
            controlplane,
            nodes,
            phases,
            decider,
            namespace=f"so{suffix}-{decider.name[:4]}",
            concurrency=10,
            rate=0,
        )
        assert report["phases"]["fill"]["ended"] == "declared", report
        assert (report["pods_scheduled"], report["pods_unplaceable"]) == (8, 2), report
        assert report["first_unplaceable"]["reason"].startswith(says[decider.name]), report


async def test_tangram_places_mig_claims_on_synthetic_nodes_whose_partitioners_answer_at_once(
    controlplane: ControlPlane, kube: Any, unique: str
) -> None:
    suffix = unique.rsplit("-", 1)[-1]
    nodes = kb.synthetic_fleet(1, "mixed", prefix=f"sm{suffix}-")  # one hgx-h200
    phases = kb.mixed_phases(8, pods=0, saturation=0.8, seed=6)
    arrivals = [op for op in phases[0].ops if isinstance(op, Arrival)]
    assert any(op.shape.kind == "mig" for op in arrivals)
    report = await kb.run_synthetic(
        kube,
        controlplane,
        nodes,
        phases,
        kb.tangram_decider(controlplane.kubeconfig),
        namespace=f"sm{suffix}",
        concurrency=4,
        rate=0,
    )
    # MIG 1g and 3g, four 1-GPU and one NVLink pair: room for all of them, MIG ones included
    assert (report["pods_created"], report["pods_scheduled"]) == (len(arrivals), len(arrivals)), report
    assert report["first_unplaceable"] is None
