"""Convergence after a NATS outage: the partitioner's view of the log may lag its commands.

After a server restart the claim decisions a partitioner follows can arrive after the partition
commands that depend on them, and a redelivered destroy can arrive after a later create on the
same slices. These tests publish in exactly those orders, through a real nats-server, to the
partitioner service running on a simulated node, and check that nothing is refused, nothing
fails and nothing is left behind.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import REGISTRY

from services.partitioner.settings import PartitionerSettings
from tangram.bus import Bus
from tangram.events import (
    AllocatedDevice,
    ClaimAllocated,
    ClaimReleased,
    MigPlacement,
    NodeInventory,
    PartitionApplied,
    PartitionFailed,
)
from tangram.local.natsserver import NatsServer
from tangram.nvml import SimNvml
from tangram.partitioning import MigExecutor
from tests.partitioner.helpers import MINORS, NODE, Inbox, command, gpu_uuid, running, sim, subscribe

# 3g.40gb at slices 0-3 of GPU 0 (dgx-h100), then a 1g.10gb at slice 0: overlapping, not equal.
BIG = {"profile": "3g.40gb", "profile_id": 9, "start": 0, "size": 4}
SMALL = {"profile": "1g.10gb", "profile_id": 19, "start": 0, "size": 1}


def settings(server: NatsServer, state: Path) -> PartitionerSettings:
    # A short grace for other claims' releases: the waits under test must not depend on it.
    return PartitionerSettings(
        nats_urls=(server.url,),
        node_name=NODE,
        sim_machine="dgx-h100",
        state_file=state,
        claim_release_wait_s=0.05,
    )


def allocated(uid: str, view: SimNvml, shape: dict[str, object], create: str) -> ClaimAllocated:
    placement = MigPlacement(start=int(shape["start"]), size=int(shape["size"]))  # type: ignore[call-overload]
    device = AllocatedDevice(
        request="r", driver="gpu.tangram.dev", pool=NODE, device=f"mig-{uid}", gpu_index=0,
        gpu_uuid=gpu_uuid(view, 0), profile=str(shape["profile"]), profile_id=int(shape["profile_id"]),  # type: ignore[call-overload]
        placement=placement, partition_command=create,
    )  # fmt: skip
    return ClaimAllocated(
        key=uid, namespace="ns", name=uid, uid=uid, node=NODE, devices=[device], partitions=[create]
    )


def released(uid: str) -> ClaimReleased:
    return ClaimReleased(key=uid, namespace="ns", name=uid, uid=uid)


async def result_of(results: Inbox, command_id: str) -> PartitionApplied | PartitionFailed:
    """The command's result, whenever it came: results of other commands read meanwhile are kept
    (a reconcile's result may arrive before or after a create's)."""
    while command_id not in results.results:
        event = await results.next(PartitionApplied | PartitionFailed)  # type: ignore[arg-type]
        assert isinstance(event, PartitionApplied | PartitionFailed)
        results.results[event.command_id] = event
    found = results.results.pop(command_id)
    assert isinstance(found, PartitionApplied | PartitionFailed)
    return found


async def waiting_for_release() -> None:
    """Until the partitioner holds a command for a claim's release it has not read: the wait that
    does not end with the short grace for other claims' releases."""

    async def held() -> None:
        while REGISTRY.get_sample_value("tangram_partition_commands_waiting_for_release") != 1:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(held(), 30)


async def create_for(bus: Bus, view: SimNvml, results: Inbox, uid: str, shape: dict[str, object]) -> str:
    """The claim's allocation, then its create command; returns the MIG device UUID made."""
    await bus.publish(allocated(uid, view, shape, f"create-{uid}"))
    await bus.publish(command(f"create-{uid}", view, claim_uid=uid, **shape))  # type: ignore[arg-type]
    made = await result_of(results, f"create-{uid}")
    assert isinstance(made, PartitionApplied), made
    return made.mig_uuid


async def test_a_destroy_that_arrives_before_its_release_is_read_waits_for_it(
    bus: Bus, nats_server: NatsServer, tmp_path: Path
) -> None:
    state = tmp_path / "node.json"
    view = sim("dgx-h100", state)
    results = await subscribe(bus, f"tangram.node.{NODE}.partition.*")
    inventories = await subscribe(bus, f"tangram.inventory.{NODE}")
    async with running(bus, settings(nats_server, state)):
        await inventories.next(NodeInventory)
        mig_uuid = await create_for(bus, view, results, "x", BIG)
        # The destroy is read first; the release that caused it only later (the log lagged).
        await bus.publish(
            command("destroy-x", view, action="destroy", claim_uid="x", mig_uuid=mig_uuid, **BIG)
        )  # type: ignore[arg-type]
        await waiting_for_release()  # past the grace given to other claims' releases
        await bus.publish(released("x"))
        outcome = await result_of(results, "destroy-x")
    assert isinstance(outcome, PartitionApplied), outcome
    assert (outcome.action, outcome.mig_uuid) == ("destroy", mig_uuid)
    assert MigExecutor(view, minors=MINORS).observe(0) == []


async def test_a_create_on_a_released_claims_slices_does_not_wait_for_that_claims_late_destroy(
    bus: Bus, nats_server: NatsServer, tmp_path: Path
) -> None:
    state = tmp_path / "node.json"
    view = sim("dgx-h100", state)
    results = await subscribe(bus, f"tangram.node.{NODE}.partition.*")
    inventories = await subscribe(bus, f"tangram.inventory.{NODE}")
    async with running(bus, settings(nats_server, state)):
        await inventories.next(NodeInventory)
        old = await create_for(bus, view, results, "x", BIG)
        await bus.publish(released("x"))
        # The new claim's create comes before the released claim's destroy (a late redelivery).
        new = await create_for(bus, view, results, "y", SMALL)
        await bus.publish(command("destroy-x", view, action="destroy", claim_uid="x", mig_uuid=old, **BIG))  # type: ignore[arg-type]
        late = await result_of(results, "destroy-x")
    assert isinstance(late, PartitionApplied) and late.action == "destroy", late
    left = MigExecutor(view, minors=MINORS).observe(0)
    assert [(o.mig_uuid, o.placement) for o in left] == [(new, MigPlacement(start=0, size=1))]


async def test_a_create_read_before_the_previous_holders_release_waits_for_it(
    bus: Bus, nats_server: NatsServer, tmp_path: Path
) -> None:
    state = tmp_path / "node.json"
    view = sim("dgx-h100", state)
    results = await subscribe(bus, f"tangram.node.{NODE}.partition.*")
    inventories = await subscribe(bus, f"tangram.inventory.{NODE}")
    async with running(bus, settings(nats_server, state)):
        await inventories.next(NodeInventory)
        old = await create_for(bus, view, results, "x", BIG)
        await bus.publish(allocated("y", view, SMALL, "create-y"))
        await bus.publish(command("create-y", view, claim_uid="y", **SMALL))  # type: ignore[arg-type]
        await waiting_for_release()  # the release of x is read only now
        await bus.publish(released("x"))
        made = await result_of(results, "create-y")
        assert isinstance(made, PartitionApplied), made
        await bus.publish(command("destroy-x", view, action="destroy", claim_uid="x", mig_uuid=old, **BIG))  # type: ignore[arg-type]
        late = await result_of(results, "destroy-x")
    assert isinstance(late, PartitionApplied) and late.action == "destroy", late
    left = MigExecutor(view, minors=MINORS).observe(0)
    assert [o.mig_uuid for o in left] == [made.mig_uuid]


async def test_commands_sent_before_an_allocator_crash_and_decided_again_leave_nothing_behind(
    bus: Bus, nats_server: NatsServer, tmp_path: Path
) -> None:
    """The allocator sent a claim's create, died before its decision, and decided the claim again
    elsewhere after restart: the first instance is removed once the decision is read, and a first
    command read after the decision creates nothing."""
    state = tmp_path / "node.json"
    view = sim("dgx-h100", state)
    results = await subscribe(bus, f"tangram.node.{NODE}.partition.*")
    inventories = await subscribe(bus, f"tangram.inventory.{NODE}")
    async with running(bus, settings(nats_server, state)):
        await inventories.next(NodeInventory)
        await bus.publish(command("first-x", view, claim_uid="x", **BIG))  # type: ignore[arg-type]
        first = await result_of(results, "first-x")
        assert isinstance(first, PartitionApplied)
        second = await create_for(bus, view, results, "x", SMALL | {"start": 6})
        cleaned = await result_of(results, f"reconcile-{first.mig_uuid}")
        assert isinstance(cleaned, PartitionApplied) and cleaned.action == "destroy"
        await bus.publish(command("late-x", view, claim_uid="x", **BIG))  # type: ignore[arg-type]
        late = await result_of(results, "late-x")
    assert isinstance(late, PartitionFailed) and "decided without command late-x" in late.reason
    left = MigExecutor(view, minors=MINORS).observe(0)
    assert [o.mig_uuid for o in left] == [second]
