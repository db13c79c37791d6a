"""`tangram bench kubernetes` against the real control plane: kube-scheduler deciding a small
workload on one simulated node, the report checked against what the API server holds."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from kubernetes_asyncio.client import CoreV1Api

from tangram.bench import kubernetes as kb
from tangram.bench.traces import Arrival
from tangram.kube import KubeApiError, call
from tangram.kube.controlplane import ControlPlane
from tests.e2e.test_kubernetes import until

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
