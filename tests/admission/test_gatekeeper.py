"""The gate timeout: which pods have held Tangram's gate too long (pure), and two replicas lifting
the same gate at once against the real API server (one lifts it, the other finds it gone)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio.client import CoreV1Api

from services.admission.gatekeeper import REASON, Expired, GateKeeper, expired_gates, guarded_removal
from services.allocator.alive import AliveLease
from tangram.kubernetes.api import KubeApiError, call
from tangram.kubernetes.objects.alive import ALLOCATOR_LEASE, allocator_alive, lease_spec
from tangram.kubernetes.objects.gangs import GANG_LABEL
from tangram.kubernetes.objects.names import SCHEDULING_GATE

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def gated_pod(
    name: str,
    age_s: float,
    *,
    gates: tuple[str, ...] = (SCHEDULING_GATE,),
    namespace: str = "ns",
    deleting: bool = False,
    created: str | None = None,
    labels: dict[str, str] | None = None,
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
    if labels:
        metadata["labels"] = labels
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


def test_a_pod_of_a_group_keeps_its_gate_past_the_timeout() -> None:
    """kube-scheduler would place the group's pods one at a time: the group waits for Tangram."""
    pods = [
        gated_pod("member", 900, labels={GANG_LABEL: "train"}),
        gated_pod("alone", 900, labels={"app": "x"}),
    ]
    assert [e.name for e in expired_gates(pods, NOW, 120)] == ["alone"]


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
        # no allocator's Lease in this namespace: the allocator is down
        replicas = [
            GateKeeper(kube, timeout_s=60, lease_namespace=unique, now=lambda: later) for _ in range(2)
        ]
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


# --- is the allocator alive? ------------------------------------------------------------------


def lease(renewed: object, holder: object = "allocator-1") -> dict[str, Any]:
    return {"metadata": {"name": ALLOCATOR_LEASE}, "spec": {"holderIdentity": holder, "renewTime": renewed}}


def test_the_allocator_is_alive_while_its_lease_was_renewed_within_the_timeout() -> None:
    assert allocator_alive(lease("2026-12-01T11:59:58.500000Z"), NOW, 3)
    assert allocator_alive(lease("2026-12-01T11:59:57.000000Z"), NOW, 3)  # exactly the timeout
    assert allocator_alive(lease("2026-12-01T12:00:01Z"), NOW, 3)  # clocks apart: ahead counts
    assert allocator_alive(lease(NOW - timedelta(seconds=1)), NOW, 3)  # a parsed time
    assert allocator_alive({"spec": lease_spec("a", NOW)}, NOW, 3)  # as the allocator writes it


def test_the_allocator_is_down_with_its_lease_stale_missing_or_unreadable() -> None:
    assert not allocator_alive(lease("2026-12-01T11:59:56.999000Z"), NOW, 3)  # stale
    assert not allocator_alive(None, NOW, 3)  # no Lease
    assert not allocator_alive({}, NOW, 3)
    assert not allocator_alive({"spec": None}, NOW, 3)
    assert not allocator_alive({"spec": {"holderIdentity": "a"}}, NOW, 3)  # never renewed
    assert not allocator_alive(lease(None), NOW, 3)
    assert not allocator_alive(lease("yesterday"), NOW, 3)  # garbage
    assert not allocator_alive(lease(12345), NOW, 3)
    assert not allocator_alive(lease("2026-12-01T11:59:59Z", holder=""), NOW, 3)  # released
    assert not allocator_alive(lease("2026-12-01T11:59:59Z", holder=None), NOW, 3)


@pytest.mark.controlplane
@pytest.mark.timeout(300)
async def test_a_fresh_allocator_lease_keeps_the_gate_and_a_stale_one_lifts_it(
    kube: Any, unique: str
) -> None:
    core = CoreV1Api(kube)
    await call("create namespace", core.create_namespace({"metadata": {"name": unique}}))
    try:
        body = {
            "metadata": {"name": "held"},
            "spec": {
                "schedulingGates": [{"name": SCHEDULING_GATE}],
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
            },
        }
        await call("create the pod", core.create_namespaced_pod(unique, body))
        later = datetime.now(UTC) + timedelta(hours=1)
        clock = [later]
        alive = AliveLease(kube, namespace=unique, holder="allocator-1", now=lambda: clock[0])
        await alive.renew()  # created
        await alive.renew()  # replaced, guarded by the version just written
        assert alive.renewals == 2
        keeper = GateKeeper(kube, timeout_s=60, lease_namespace=unique, now=lambda: later)
        await keeper.relist()
        written = await keeper.allocator_lease()
        assert written is not None
        assert written["spec"]["holderIdentity"] == "allocator-1"
        assert written["spec"]["leaseDurationSeconds"] > 0
        # the pod is held an hour past the timeout, but the allocator is alive: the gate stays
        assert await keeper.judge() == 0
        pod = await call("read the pod", core.read_namespaced_pod("held", unique))
        assert [g.name for g in pod.spec.scheduling_gates] == [SCHEDULING_GATE]
        # someone else writes the Lease: the next renewal is refused, read again, then renews
        taken = dict(written, spec=dict(written["spec"], holderIdentity="other"))
        await call(
            "replace the lease",
            keeper._coordination.replace_namespaced_lease(ALLOCATOR_LEASE, unique, taken),
        )
        before = alive.renewals
        await alive.renew()
        await alive.renew()
        assert alive.renewals == before + 1
        assert (await keeper.allocator_lease() or {})["spec"]["holderIdentity"] == "allocator-1"
        # the allocator stops renewing: past the timeout the gate is lifted
        stale = GateKeeper(
            kube, timeout_s=60, lease_namespace=unique, now=lambda: later + timedelta(seconds=61)
        )
        await stale.relist()
        assert await stale.judge() == 1
        pod = await call("read the pod", core.read_namespaced_pod("held", unique))
        assert not pod.spec.scheduling_gates
    finally:
        with contextlib.suppress(KubeApiError):
            await call("delete namespace", core.delete_namespace(unique))
