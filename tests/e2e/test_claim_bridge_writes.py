"""The allocator's writes to the API server hold only against what it read: a stale claim or pod is
read again, and an allocation someone else wrote first stands (real API server, optimistic
concurrency)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

from services.allocator.kubernetes import ClaimBridge
from tangram.allocation import DeviceClass, FleetState
from tangram.allocation.ledger import Ledger
from tangram.events import ClaimAllocated, ClaimFailed, ClaimReleased, ClaimRequested, Event
from tangram.kubernetes.api import KubeApiError, call, call_json
from tangram.kubernetes.objects.claimbridge import claim_adopted, claim_requested
from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes
from tangram.kubernetes.objects.names import SCHEDULING_GATE
from tests.allocator.helpers import inventory
from tests.support.polling import until

pytestmark = [pytest.mark.timeout(120), pytest.mark.controlplane]

SHIPPED = {m["metadata"]["name"]: m for m in load_shipped_device_classes()}
NODE = "bridge-node"


class Setup:
    def __init__(self, kube: Any, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.resource = ResourceV1Api(kube)
        self.core = CoreV1Api(kube)
        self.published: list[Event] = []
        self.ledger = Ledger(
            fleet=FleetState(),
            classes={c.name: c for c in (DeviceClass.from_manifest(m) for m in SHIPPED.values())},
        )
        self.ledger.apply(inventory("hgx-h200", NODE), live=False)

        async def publish(event: Event) -> None:
            self.published.append(event)

        self.bridge = ClaimBridge(kube, self.ledger, publish, producer="test")
        self.bridge.classes = dict(SHIPPED)
        self.bridge._listed.update({"classes", "claims", "pods"})

    async def claim(self, name: str, *, count: int = 1, selector: str = "") -> dict[str, Any]:
        exactly: dict[str, Any] = {"deviceClassName": "gpu.tangram.dev", "count": count}
        if selector:
            exactly["selectors"] = [{"cel": {"expression": selector}}]
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        }
        return await call_json(
            "create claim",
            self.resource.create_namespaced_resource_claim(self.namespace, body, _preload_content=False),
        )

    async def read(self, name: str) -> dict[str, Any]:
        return await call_json(
            "read claim",
            self.resource.read_namespaced_resource_claim(name, self.namespace, _preload_content=False),
        )

    async def allocated_by_another(self, claim: dict[str, Any], device: str) -> dict[str, Any]:
        """The claim (as read) given `device` by another writer, as kube-scheduler writes it."""
        claim["status"] = {"allocation": allocation(device)}
        return await call_json(
            "kube-scheduler's allocation",
            self.resource.replace_namespaced_resource_claim_status(
                claim["metadata"]["name"], self.namespace, claim, _preload_content=False
            ),
        )

    def decide(self, claim: dict[str, Any]) -> ClaimAllocated:
        *_, allocated = self.ledger.apply(claim_requested(claim, SHIPPED, producer="test"))
        assert isinstance(allocated, ClaimAllocated)
        return allocated

    def refuse(self, claim: dict[str, Any]) -> ClaimFailed:
        [failed] = self.ledger.apply(claim_requested(claim, SHIPPED, producer="test"))
        assert isinstance(failed, ClaimFailed)
        return failed


@pytest.fixture
async def setup(kube: Any, unique: str) -> AsyncIterator[Setup]:
    await call("create namespace", CoreV1Api(kube).create_namespace({"metadata": {"name": unique}}))
    try:
        yield Setup(kube, unique)
    finally:
        with contextlib.suppress(KubeApiError):
            await call("delete namespace", CoreV1Api(kube).delete_namespace(unique))


def allocation(device: str) -> dict[str, Any]:
    return {
        "devices": {
            "results": [{"request": "gpu", "driver": "gpu.tangram.dev", "pool": NODE, "device": device}]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
            ]
        },
    }


async def test_a_write_against_a_stale_claim_is_retried_and_lands(setup: Setup) -> None:
    stale = await setup.claim("c")
    allocated = setup.decide(stale)
    setup.bridge.claims[(setup.namespace, "c")] = stale
    # someone changes the claim meanwhile (not its allocation): the write conflicts, then lands
    current = await setup.read("c")
    current["metadata"]["labels"] = {"touched": "yes"}
    await call_json(
        "label claim",
        setup.resource.replace_namespaced_resource_claim(
            "c", setup.namespace, current, _preload_content=False
        ),
    )
    await setup.bridge._write(allocated)
    written = await setup.read("c")
    [result] = written["status"]["allocation"]["devices"]["results"]
    assert result["device"] == allocated.devices[0].device and result["pool"] == NODE
    assert written["metadata"]["labels"] == {"touched": "yes"}
    assert setup.published == []


async def test_an_allocation_someone_else_wrote_first_stands_and_is_adopted(setup: Setup) -> None:
    stale = await setup.claim("c")
    allocated = setup.decide(stale)
    ours = allocated.devices[0].device
    theirs = next(f"gpu-{i}" for i in range(8) if f"gpu-{i}" != ours)
    setup.bridge.claims[(setup.namespace, "c")] = stale
    await setup.allocated_by_another(await setup.read("c"), theirs)
    await setup.bridge._write(allocated)
    kept = await setup.read("c")
    assert [r["device"] for r in kept["status"]["allocation"]["devices"]["results"]] == [theirs]
    [adopted] = setup.published
    assert isinstance(adopted, ClaimRequested) and adopted.allocation is not None
    assert [r["device"] for r in adopted.allocation["devices"]["results"]] == [theirs]
    # the ledger, folding it, gives up its own decision and holds theirs
    setup.ledger.apply(adopted)
    held = setup.ledger.fleet.allocation(adopted.uid)
    assert held is not None and [d.device for d in held.devices] == [theirs]


async def test_the_gate_goes_from_a_stale_pod_and_other_gates_stay(setup: Setup) -> None:
    ns = setup.namespace
    claim = await setup.claim("c")
    setup.bridge.claims[(ns, "c")] = {**claim, "status": {"allocation": allocation("gpu-1")}}
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": ns},
        "spec": {
            "schedulingGates": [{"name": "example.com/other"}, {"name": SCHEDULING_GATE}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}],
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    stale = await call_json("create pod", setup.core.create_namespaced_pod(ns, body, _preload_content=False))
    current = await call_json("read pod", setup.core.read_namespaced_pod("p", ns, _preload_content=False))
    current["metadata"]["labels"] = {"touched": "yes"}
    await call_json("label pod", setup.core.replace_namespaced_pod("p", ns, current, _preload_content=False))
    await setup.bridge._maybe_ungate(stale)
    now = await call_json("read pod", setup.core.read_namespaced_pod("p", ns, _preload_content=False))
    assert now["spec"]["schedulingGates"] == [{"name": "example.com/other"}]
    assert now["metadata"]["labels"] == {"touched": "yes"}


async def test_a_gated_pod_waits_while_its_tangram_claim_is_unallocated(setup: Setup) -> None:
    ns = setup.namespace
    claim = await setup.claim("c")
    setup.bridge.claims[(ns, "c")] = claim
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": ns},
        "spec": {
            "schedulingGates": [{"name": SCHEDULING_GATE}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}],
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    pod = await call_json("create pod", setup.core.create_namespaced_pod(ns, body, _preload_content=False))
    await setup.bridge._maybe_ungate(pod)
    now = await call_json("read pod", setup.core.read_namespaced_pod("p", ns, _preload_content=False))
    assert now["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]


async def test_a_decision_naming_a_device_another_claim_holds_is_not_written(setup: Setup) -> None:
    mine = await setup.claim("mine")
    allocated = setup.decide(mine)
    device = allocated.devices[0].device
    written_other = await setup.allocated_by_another(await setup.claim("other"), device)
    setup.bridge.claims[(setup.namespace, "mine")] = mine
    setup.bridge.claims[(setup.namespace, "other")] = written_other
    await setup.bridge._write(allocated)
    assert (await setup.read("mine")).get("status", {}).get("allocation") is None
    [adopted] = setup.published
    assert isinstance(adopted, ClaimRequested) and adopted.uid == written_other["metadata"]["uid"]
    # folding it, the ledger frees its own decision for the claim to be asked again
    [failed] = setup.ledger.apply(adopted)
    assert isinstance(failed, ClaimFailed) and failed.uid == allocated.uid


async def test_only_the_claims_that_freed_capacity_may_help_are_asked_again(setup: Setup) -> None:
    """A claim at fault fails the same way every time and is never asked again; one that no node
    could hold is asked again once the fleet's nodes change; one that waits for capacity is asked
    again as soon as capacity is freed."""
    at_fault = await setup.claim("at-fault", selector='device.attributes["gpu.tangram.dev"].index / 0 == 1')
    too_big = await setup.claim("too-big", count=9)
    free = setup.ledger.fleet.metrics().free_gpus
    assert free >= 1
    for n in range(free):
        setup.decide(await setup.claim(f"fill-{n}"))
    waiting = await setup.claim("waiting")
    failures = {}
    for claim in (at_fault, too_big, waiting):
        failed = setup.refuse(claim)
        failures[failed.name] = failed.cause
        setup.bridge.claims[(setup.namespace, failed.name)] = claim
        await setup.bridge._failed(failed)
    assert failures == {"at-fault": "claim", "too-big": "hardware", "waiting": "capacity"}
    asker = setup.bridge._asker

    def asked_again() -> set[str]:
        uids = {c["metadata"]["uid"]: c["metadata"]["name"] for c in (at_fault, too_big, waiting)}
        return {name for uid, name in uids.items() if asker.waiting(uid)}

    setup.bridge._retry_pending()  # as after a release
    assert asked_again() == {"waiting"}
    setup.ledger.apply(inventory("hgx-h200", "second-node"), live=False)
    setup.bridge._retry_pending()
    assert asked_again() == {"waiting", "too-big"}


async def test_a_release_that_freed_nothing_asks_no_claim_again(setup: Setup) -> None:
    """Every claim waiting for capacity is asked again when a release frees some, never for the
    release of a claim that held nothing (one that had failed, or was allocated on a node not of
    this fleet): deleting many such claims would have each of them decide every waiting claim again."""
    holder = await setup.claim("holder", count=setup.ledger.fleet.metrics().free_gpus)
    setup.decide(holder)
    waiting = await setup.claim("waiting")
    failed = setup.refuse(waiting)
    setup.bridge.claims[(setup.namespace, "waiting")] = waiting
    await setup.bridge._failed(failed)
    retries: list[str] = []
    bridge_retry = setup.bridge._retry_pending
    setup.bridge._retry_pending = lambda: (retries.append("retry"), bridge_retry())  # type: ignore[method-assign]

    def release(claim: dict[str, Any]) -> ClaimReleased:
        meta = claim["metadata"]
        return ClaimReleased(key=meta["uid"], uid=meta["uid"], namespace=setup.namespace, name=meta["name"])

    assert not setup.ledger.frees_capacity(waiting["metadata"]["uid"])
    assert setup.ledger.frees_capacity(holder["metadata"]["uid"])
    stop = asyncio.Event()
    answering = asyncio.create_task(setup.bridge._answer(stop))
    try:
        setup.bridge.notice(release(waiting), [], frees=False)
        # a retry waits for every answer noticed before it, the first release's retry included
        setup.bridge.notice(release(holder), [], frees=True)
        await until("the release of the holder asks again", lambda: bool(retries), 30)
    finally:
        stop.set()
        answering.cancel()
        await asyncio.gather(answering, return_exceptions=True)
    assert retries == ["retry"]
    assert setup.bridge._asker.waiting(waiting["metadata"]["uid"])


async def test_decisions_are_written_concurrently_and_each_claims_answers_in_order(setup: Setup) -> None:
    """Hundreds of pods arriving together must not wait for each other's round trips: the first
    write is held until a second one has started (sequential writes would never release it)."""
    claims = [await setup.claim(f"burst-{n}") for n in range(6)]
    decisions = [setup.decide(claim) for claim in claims]
    for claim in claims:
        setup.bridge.claims[(setup.namespace, claim["metadata"]["name"])] = claim
    writer = setup.bridge._writer._resource
    original = writer.replace_namespaced_resource_claim_status
    second_started = asyncio.Event()
    first_saw_second: list[bool] = []
    calls = 0

    async def held_first(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            try:
                await asyncio.wait_for(second_started.wait(), 30)
                first_saw_second.append(True)
            except TimeoutError:
                first_saw_second.append(False)
        else:
            second_started.set()
        return await original(*args, **kwargs)

    writer.replace_namespaced_resource_claim_status = held_first
    # one claim is refused, then decided: its two answers must land in that order
    late = await setup.claim("late")
    setup.bridge.claims[(setup.namespace, "late")] = late
    refused = ClaimFailed(
        key=late["metadata"]["uid"],
        uid=late["metadata"]["uid"],
        namespace=setup.namespace,
        name="late",
        reason="no node has a free GPU",
        cause="capacity",
        attempt=1,
    )
    for event in decisions[:3]:
        setup.bridge.notice(event, [event])
    setup.bridge.notice(refused, [refused])
    for event in decisions[3:]:
        setup.bridge.notice(event, [event])
    late_allocated = setup.decide(late)
    setup.bridge.notice(late_allocated, [late_allocated])
    stop = asyncio.Event()
    answering = asyncio.create_task(setup.bridge._answer(stop))
    try:

        async def all_written() -> bool:
            names = [c["metadata"]["name"] for c in claims] + ["late"]
            read = [await setup.read(n) for n in names]
            return all((claim.get("status") or {}).get("allocation") for claim in read)

        await until("every decision written", all_written, 60)
    finally:
        stop.set()
        answering.cancel()
        await asyncio.gather(answering, return_exceptions=True)
    assert first_saw_second == [True]
    for claim, decided in zip(claims, decisions, strict=True):
        [result] = (await setup.read(claim["metadata"]["name"]))["status"]["allocation"]["devices"]["results"]
        assert result["device"] == decided.devices[0].device
    [result] = (await setup.read("late"))["status"]["allocation"]["devices"]["results"]
    assert result["device"] == late_allocated.devices[0].device
    # the refusal was acted on before the allocation: acted on after it, it would have found the
    # allocation written and handed it to the ledger as another writer's
    assert setup.published == []
    events = await call("list events", setup.core.list_namespaced_event(setup.namespace))
    assert [e.reason for e in events.items if e.involved_object.name == "late"] == ["TangramUnschedulable"]


async def _written_twice(setup: Setup, *, reserved: bool) -> tuple[dict[str, Any], ClaimFailed]:
    """Claim "mine" allocated by Tangram and "other" by another writer, one device in both (their
    writes crossed); returns "mine" as the API server holds it and the ledger's failure of it."""
    mine = await setup.claim("mine")
    allocated = setup.decide(mine)
    setup.bridge.claims[(setup.namespace, "mine")] = mine
    await setup.bridge._write(allocated)
    written = await setup.read("mine")
    if reserved:
        written["status"]["reservedFor"] = [
            {"resource": "pods", "name": "runs", "uid": "0c3b1f9e-0000-4000-8000-000000000001"}
        ]
        written = await call_json(
            "kube-scheduler reserves it",
            setup.resource.replace_namespaced_resource_claim_status(
                "mine", setup.namespace, written, _preload_content=False
            ),
        )
    other = await setup.allocated_by_another(await setup.claim("other"), allocated.devices[0].device)
    setup.bridge.claims[(setup.namespace, "mine")] = written
    setup.bridge.claims[(setup.namespace, "other")] = other
    request = claim_adopted(other, SHIPPED, producer="test")
    [failed] = [e for e in setup.ledger.apply(request) if isinstance(e, ClaimFailed)]
    assert failed.uid == allocated.uid
    return written, failed


async def test_an_allocation_crossed_by_another_writers_is_withdrawn_while_no_pod_uses_it(
    setup: Setup,
) -> None:
    _, failed = await _written_twice(setup, reserved=False)
    await setup.bridge._failed(failed)
    assert (await setup.read("mine")).get("status", {}).get("allocation") is None
    assert [e for e in setup.published if isinstance(e, ClaimRequested)] == []


async def test_an_allocation_crossed_by_another_writers_stands_once_a_pod_uses_it(setup: Setup) -> None:
    _, failed = await _written_twice(setup, reserved=True)
    await setup.bridge._failed(failed)
    assert (await setup.read("mine"))["status"]["allocation"] is not None
    [adopted] = [e for e in setup.published if isinstance(e, ClaimRequested)]
    assert adopted.uid == failed.uid and adopted.allocation is not None


async def test_a_claim_deallocated_then_deleted_is_released_again_as_deleted(setup: Setup) -> None:
    """A deallocation releases the claim; its deletion, seen later, releases it again as deleted
    (an event of its own, so the bus keeps both), and only once: the allocator forgets only the
    claims that can never be asked again."""
    ns = setup.namespace
    kept = await setup.claim("deallocated-first")
    gone = await setup.claim("deleted-at-once")
    for claim in (kept, gone):
        device = setup.decide(claim).devices[0].device
        written = await setup.allocated_by_another(await setup.read(claim["metadata"]["name"]), device)
        await setup.bridge._claim_changed("MODIFIED", written)
    allocated = await setup.read("deallocated-first")
    allocated["status"] = {}
    deallocated = await call_json(
        "deallocate",
        setup.resource.replace_namespaced_resource_claim_status(
            "deallocated-first", ns, allocated, _preload_content=False
        ),
    )
    await setup.bridge._claim_changed("MODIFIED", deallocated)
    for name in ("deallocated-first", "deleted-at-once"):
        last = await setup.read(name)
        await call("delete claim", setup.resource.delete_namespaced_resource_claim(name, ns))
        await setup.bridge._claim_changed("DELETED", last)
        await setup.bridge._claim_changed("DELETED", last)  # seen twice (a relist): released once
    releases = [(e.name, e.deleted) for e in setup.published if isinstance(e, ClaimReleased)]
    assert releases == [("deallocated-first", False), ("deallocated-first", True), ("deleted-at-once", True)]
    ids = [e.event_id for e in setup.published if isinstance(e, ClaimReleased)]
    assert len(set(ids)) == 3


async def test_a_claim_deleted_before_its_decision_is_released_when_the_decision_finds_it_gone(
    setup: Setup,
) -> None:
    """A new leader can read a claim's deletion before it decides the request the previous leader
    sent: the deletion releases nothing then, as nothing of the claim is decided here. The
    decision, finding the claim gone, releases it, or the ledger would hold its devices forever."""
    claim = await setup.claim("gone-first")
    last = await setup.read("gone-first")
    await call("delete claim", setup.resource.delete_namespaced_resource_claim("gone-first", setup.namespace))
    await setup.bridge._claim_changed("DELETED", last)
    assert [e for e in setup.published if isinstance(e, ClaimReleased)] == []
    allocated = setup.decide(claim)
    assert setup.ledger.fleet.allocation(allocated.uid) is not None
    await setup.bridge._write(allocated)
    await setup.bridge._write(allocated)  # delivered again: released once
    [released] = [e for e in setup.published if isinstance(e, ClaimReleased)]
    assert (released.uid, released.deleted) == (allocated.uid, True)
    setup.ledger.apply(released)
    assert setup.ledger.fleet.allocation(allocated.uid) is None
