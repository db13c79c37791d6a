"""The gate timeout: which pods have held Tangram's gate too long (pure), and two replicas lifting
the same gate at once against the real API server (one lifts it, the other finds it gone)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio.client import CoreV1Api

from tangram.admission.gatekeeper import REASON, Expired, GateKeeper, expired_gates, guarded_removal
from tangram.k8s.names import SCHEDULING_GATE
from tangram.kube import KubeApiError, call

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def gated_pod(
    name: str,
    age_s: float,
    *,
    gates: tuple[str, ...] = (SCHEDULING_GATE,),
    namespace: str = "ns",
    deleting: bool = False,
    created: str | None = None,
) -> dict[str, Any]:
    stamp = (NOW - timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%SZ") if created is None else created
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "resourceVersion": "7",
        "creationTimestamp": stamp,
    }
    if deleting:
        metadata["deletionTimestamp"] = stamp
    return {"metadata": metadata, "spec": {"schedulingGates": [{"name": g} for g in gates]}}


def test_pods_held_past_the_timeout_expire_oldest_first() -> None:
    pods = [
        gated_pod("young", 119),
        gated_pod("exactly", 120),
        gated_pod("old", 600, namespace="b"),
        gated_pod("older", 601, namespace="a", gates=("example.com/x", SCHEDULING_GATE)),
    ]
    assert expired_gates(pods, NOW, 120) == [
        Expired("a", "older", 601.0),
        Expired("b", "old", 600.0),
        Expired("ns", "exactly", 120.0),
    ]


def test_pods_without_tangrams_gate_or_being_deleted_or_undated_are_left_alone() -> None:
    pods = [
        gated_pod("other-gate", 900, gates=("example.com/x",)),
        gated_pod("no-gates", 900, gates=()),
        gated_pod("deleting", 900, deleting=True),
        gated_pod("undated", 900, created="yesterday"),
        {
            "metadata": {"name": "bare", "namespace": "ns"},
            "spec": {"schedulingGates": [{"name": SCHEDULING_GATE}]},
        },
    ]
    assert expired_gates(pods, NOW, 120) == []


def test_a_timeout_of_zero_is_off() -> None:
    assert expired_gates([gated_pod("old", 10_000)], NOW, 0) == []
    assert [e.name for e in expired_gates([gated_pod("old", 10_000)], NOW, 1)] == ["old"]


def test_a_creation_time_with_fractions_or_an_offset_is_read() -> None:
    pods = [
        gated_pod("fraction", 0, created="2026-12-01T11:58:00.5Z"),
        gated_pod("offset", 0, created="2026-12-01T12:58:00+01:00"),
    ]
    assert expired_gates(pods, NOW, 119.5) == [
        Expired("ns", "offset", 120.0),
        Expired("ns", "fraction", 119.5),
    ]


def test_the_removal_tests_the_resource_version_and_keeps_other_gates() -> None:
    pod = gated_pod("p", 500, gates=("example.com/x", SCHEDULING_GATE, "example.com/y"))
    assert guarded_removal(pod) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "test", "path": "/spec/schedulingGates/1/name", "value": SCHEDULING_GATE},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
    ]
    assert guarded_removal(gated_pod("q", 500, gates=("example.com/x",))) is None


# --- against the real API server ----------------------------------------------------------------


@pytest.mark.controlplane
@pytest.mark.timeout(300)
async def test_two_replicas_lift_one_gate_once_and_record_one_event(kube: Any, unique: str) -> None:
    core = CoreV1Api(kube)
    await call("create namespace", core.create_namespace({"metadata": {"name": unique}}))
    try:
        body = {
            "metadata": {"name": "held"},
            "spec": {
                "schedulingGates": [{"name": "example.com/x"}, {"name": SCHEDULING_GATE}],
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
            },
        }
        await call("create the pod", core.create_namespaced_pod(unique, body))
        # judged an hour on: the pod has held the gate for longer than the timeout
        later = datetime.now(UTC) + timedelta(hours=1)
        replicas = [GateKeeper(kube, timeout_s=60, now=lambda: later) for _ in range(2)]
        for replica in replicas:
            await replica.relist()
            assert (unique, "held") in replica.gated
        removed = await asyncio.gather(*(r.judge() for r in replicas))
        assert sorted(removed) == [0, 1]
        pod = await call("read the pod", core.read_namespaced_pod("held", unique))
        assert [g.name for g in pod.spec.scheduling_gates] == ["example.com/x"]
        events = await call("list events", core.list_namespaced_event(unique))
        ours = [e for e in events.items if e.reason == REASON]
        assert len(ours) == 1
        assert ours[0].involved_object.name == "held" and "60 s" in ours[0].message
    finally:
        with contextlib.suppress(KubeApiError):
            await call("delete namespace", core.delete_namespace(unique))
