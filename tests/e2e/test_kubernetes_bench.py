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

pytestmark = [pytest.mark.timeout(300), pytest.mark.controlplane]


async def test_the_kube_scheduler_run_reports_what_the_api_server_holds(
    controlplane: ControlPlane, kube: Any, unique: str
) -> None:
    # H100 NVL: no MIG instance at start, so every claim kube-scheduler allocates can be prepared.
    node = f"kb-{unique.rsplit('-', 1)[-1]}"
    ops = kb.workload(1, 8, pods=0, saturation=1.3)  # about ten pods, asking for 1.3x the GPUs
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
        listed = await call("list pods", CoreV1Api(kube).list_namespaced_pod(unique))
    finally:
        with contextlib.suppress(KubeApiError):
            await call("delete namespace", CoreV1Api(kube).delete_namespace(unique))

    in_api = {pod.metadata.name: pod for pod in listed.items}
    names = [row["pod"] for row in report["pods"]]
    assert set(names) == set(in_api)  # nothing departs before the fill: every pod is still there
    assert report["pods_created"] == len(names) and report["pods_deleted"] == 0
    # More asked for than the node holds: a pod could not be placed, and it is the first pod the
    # API server holds unbound; every pod created before it is bound to the node.
    first = report["first_unplaceable"]
    assert first is not None
    bound = [in_api[name].spec.node_name for name in names]
    admitted = bound.index(None)
    assert names[admitted] == first["pod"] == names[-1]
    assert report["admitted_before_first_unplaceable"] == admitted > 0
    assert all(where == node for where in bound[:admitted])
    [scheduled] = [c for c in in_api[first["pod"]].status.conditions if c.type == "PodScheduled"]
    assert (scheduled.status, scheduled.reason) == ("False", "Unschedulable")
    running = [name for name in names if in_api[name].status.phase == "Running"]
    assert report["prepared"] == len(running) == admitted and report["not_prepared"] == 0

    shapes = {kb.pod_name(op.uid): op.shape for op in ops if isinstance(op, Arrival)}
    multi = [name for name in names[:admitted] if shapes[name].kind == "gpu" and shapes[name].count > 1]
    assert report["multi_gpu_claims"] == len(multi)
    assert 0 <= report["stranded_gpus"] <= 8 - report["admitted_gpus"]
    for key in ("create_to_scheduled", "create_to_prepared"):
        assert 0 < report[key]["p50_ms"] <= report[key]["p99_ms"]
    assert report["create_to_scheduled"]["p50_ms"] < report["create_to_prepared"]["p50_ms"]
    assert report["decisions"] == len(names) and report["decisions_per_s"] > 0
