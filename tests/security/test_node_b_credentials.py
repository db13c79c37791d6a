"""Every Tangram service under the generated NATS permissions, then attacks with node-b's credentials.

The first test proves the generated configuration lets the real services (discovery, partitioner
and cdi per node; the allocator) do all their work as separate OS processes. Each attack after it
is made by someone holding node-b's NATS user and password, and each asserts its concrete outcome:
refused by the server, or dead-lettered by the reader with the reason and without effect.
"""

from __future__ import annotations

import asyncio
import json
import time

import msgspec
import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient

from tangram.bus import Bus
from tangram.demo.driver import Held
from tangram.demo.scenario import DemoClaim, mig, whole_gpus
from tangram.events import (
    CLAIMS_STREAM,
    INVENTORY_STREAM,
    NODES_STREAM,
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    Event,
    MigPlacement,
    NodeInventory,
    PartitionApplied,
    PartitionFailed,
    PartitionRequested,
    encode,
)
from tangram.local.processes import LocalCluster, SimNode
from tangram.partitioning import MigExecutor
from tests.events.samples import HARDWARE
from tests.partitioner.helpers import MINORS, sim
from tests.support.refusals import RefusalRecorder

from .conftest import (
    NODE_A,
    NODE_B,
    USER_B,
    ClaimSource,
    dead_letters,
    eventually_dead_lettered,
)

FOLLOW_DEAD_LETTERS = "allocator-follow"  # the allocator's inventory follower
RESULT_DEAD_LETTERS = "allocator-partition-results"


# node-a has 7 whole GPUs free (its GPU 0 holds a MIG instance), node-b 3: only node-a fits 5, once.
VICTIM_GPUS = 5


async def _hold_node_a(source: ClaimSource, name: str) -> Held:
    """A live claim that only node-a can hold, and only once."""
    held = await source.driver.submit(DemoClaim("victims", name, whole_gpus(VICTIM_GPUS)))
    assert held is not None and held.node == NODE_A.name, source.driver.reasons
    return held


async def _decision(source: ClaimSource, held: Held) -> ClaimAllocated:
    decision = source.tracker.decisions[held.uid].result()
    assert isinstance(decision, ClaimAllocated)
    return decision


def _violations(cluster: LocalCluster) -> list[str]:
    assert cluster.nats is not None
    return [line for line in cluster.nats.log if "Violation" in line]


async def test_every_service_runs_claims_to_cdi_ready_under_the_generated_permissions(
    cluster: LocalCluster, source: ClaimSource
) -> None:
    driver = source.driver
    claims = [
        DemoClaim("ml", "mig-h200", mig("3g.71gb")),  # node-a: a MIG instance made live
        DemoClaim("ml", "mig-a100", mig("3g.40gb")),  # node-b
        DemoClaim("ml", "pair", whole_gpus(2, nvlink=True)),
    ]
    held = [await driver.submit(claim) for claim in claims]
    assert driver.outcomes["ready"] == 3, driver.reasons
    assert {h.node for h in held if h is not None} == {NODE_A.name, NODE_B.name}
    for claim in held:
        assert claim is not None
        await driver.release(claim)
    assert cluster.dead() == []
    assert _violations(cluster) == []  # nothing a real service did was refused


async def test_release_on_own_inventory_subject_frees_nothing(
    cluster: LocalCluster, source: ClaimSource, attacker: RefusalRecorder, admin: Bus
) -> None:
    victim = await _hold_node_a(source, "release-forged")
    forged = ClaimReleased(key=victim.uid, namespace="victims", name="release-forged", uid=victim.uid)
    subject = f"tangram.inventory.{NODE_B.name}"
    earlier = await dead_letters(admin, FOLLOW_DEAD_LETTERS, subject)
    await attacker.nc.jetstream().publish(subject, encode(forged), timeout=5)  # its own subject: stored

    letters = await eventually_dead_lettered(admin, FOLLOW_DEAD_LETTERS, subject, count=len(earlier) + 1)
    [letter] = letters[len(earlier) :]
    assert letter.reason == (
        f"refused by subject: claim.released on '{subject}': this subject carries node.inventory only"
    )
    # The GPUs were not freed: the same claim again does not fit anywhere.
    again = await source.driver.submit(DemoClaim("victims", "same-gpus", whole_gpus(VICTIM_GPUS)))
    assert again is None and source.driver.outcomes["failed"] == 1, source.driver.reasons
    await source.driver.release(victim)


@pytest.mark.parametrize("durable", ["allocator", "allocator-partition-results", "partitioner-node-a"])
@pytest.mark.parametrize("form", ["filtered", "named", "legacy durable", "anonymous"])
async def test_consumer_hijack_of_another_roles_durable_is_refused(
    attacker: RefusalRecorder, admin: Bus, durable: str, form: str
) -> None:
    stream = "TANGRAM_NODES" if durable != "allocator" else "TANGRAM_CLAIMS"
    own_filter = f"tangram.node.{NODE_B.name}.partition.*"
    before = await admin.jetstream.consumer_info(stream, durable)
    config = {
        "name": durable,
        "durable_name": durable,
        "filter_subject": own_filter,
        "ack_policy": "explicit",
    }
    subject = {
        "filtered": f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.{own_filter}",
        "named": f"$JS.API.CONSUMER.CREATE.{stream}.{durable}",
        "legacy durable": f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        # The anonymous create subject would take a body naming the durable and rewrite it.
        "anonymous": f"$JS.API.CONSUMER.CREATE.{stream}",
    }[form]
    if form == "anonymous":
        config.pop("durable_name")
    payload = json.dumps({"stream_name": stream, "config": config}).encode()
    assert await attacker.refused(subject, payload=payload)
    after = await admin.jetstream.consumer_info(stream, durable)
    assert (after.config.filter_subject, after.config.filter_subjects) == (
        before.config.filter_subject,
        before.config.filter_subjects,
    )


async def test_inventory_naming_node_a_on_node_b_subject_is_refused(
    source: ClaimSource, attacker: RefusalRecorder, admin: Bus
) -> None:
    real = source.tracker.inventories[NODE_A.name]
    # node-a with no GPUs at all: believed, it would empty node-a for every later decision.
    ghost = msgspec.structs.replace(real.hardware, gpus=[])
    forged = NodeInventory(key=NODE_B.name, hardware=ghost)
    subject = f"tangram.inventory.{NODE_B.name}"
    earlier = await dead_letters(admin, FOLLOW_DEAD_LETTERS, subject)
    await attacker.nc.jetstream().publish(subject, encode(forged), timeout=5)

    letters = await eventually_dead_lettered(admin, FOLLOW_DEAD_LETTERS, subject, count=len(earlier) + 1)
    assert any(
        letter.reason.endswith("it speaks for node 'node-a', but the subject is node 'node-b''s")
        for letter in letters
    ), [letter.reason for letter in letters]
    held = await _hold_node_a(source, "after-ghost")  # node-a still has its GPUs
    await source.driver.release(held)


async def test_partition_failed_from_node_b_for_node_a_claim_fails_nothing(
    source: ClaimSource, attacker: RefusalRecorder, admin: Bus
) -> None:
    victim = await source.driver.submit(DemoClaim("victims", "mig-victim", mig("3g.71gb")))
    assert victim is not None and victim.node == NODE_A.name, source.driver.reasons
    decision = await _decision(source, victim)
    [command_id] = decision.partitions
    device = decision.devices[0]
    assert device.placement is not None
    subject = f"tangram.node.{NODE_B.name}.partition.failed"
    for node in (NODE_B.name, NODE_A.name):  # its own name, then node-a's
        forged = PartitionFailed(
            key=NODE_B.name,
            command_id=command_id,
            node=node,
            action="create",
            gpu_uuid=device.gpu_uuid,
            profile=device.profile or "",
            placement=device.placement,
            claim_uid=victim.uid,
            reason="forged",
        )
        await attacker.nc.jetstream().publish(subject, encode(forged), timeout=5)

    letters = await eventually_dead_lettered(admin, RESULT_DEAD_LETTERS, subject, count=2)
    reasons = sorted(letter.reason for letter in letters)
    assert reasons == sorted(
        [
            f"poison: create result from node 'node-b' for command {command_id!r}, "
            "which was sent to node 'node-a'",
            f"refused by subject: partition.failed on '{subject}': it speaks for node 'node-a', "
            "but the subject is node 'node-b''s",
        ]
    )
    log = [event async for _, event in source.bus.replay(CLAIMS_STREAM)]
    assert not [e for e in log if isinstance(e, ClaimFailed) and e.uid == victim.uid]
    await source.driver.release(victim)


async def test_node_inventory_on_a_claim_subject_is_refused(attacker: RefusalRecorder, admin: Bus) -> None:
    forged = NodeInventory(key="ghost", hardware=msgspec.structs.replace(HARDWARE, node="ghost"))
    subject = "tangram.claim.requested.ghost"
    before = (await admin.jetstream.stream_info(CLAIMS_STREAM)).state.messages
    assert await attacker.refused(subject, payload=encode(forged))
    assert (await admin.jetstream.stream_info(CLAIMS_STREAM)).state.messages == before


@pytest.mark.parametrize(
    "subject", ["_INBOX.>", "_INBOX_allocator.>", "_INBOX_node-node-a.>", "_INBOX_admin.>"]
)
async def test_reading_other_users_replies_is_refused_and_reads_nothing(
    cluster: LocalCluster, source: ClaimSource, subject: str
) -> None:
    recorder = await RefusalRecorder().connect(cluster.url_for(USER_B), inbox_prefix="_INBOX_x")
    snooper, errors = recorder.nc, recorder.errors
    try:
        sub = await snooper.subscribe(subject)
        await snooper.flush(timeout=5)
        # Traffic that answers on every other user's inbox: a claim decided, prepared, released.
        held = await source.driver.submit(DemoClaim("ml", "snooped", whole_gpus(1)))
        assert held is not None
        await source.driver.release(held)
        await snooper.flush(timeout=5)
        assert sub.pending_msgs == 0 and sub.delivered == 0
        assert any(subject.lower() in e.lower() and "permissions violation" in e.lower() for e in errors), (
            errors
        )
    finally:
        await snooper.close()


def _whole_a100() -> DemoClaim:
    """One whole GPU that only node-b has: placing it changes no MIG layout, so node-b's discovery
    has nothing new to publish."""
    spec = whole_gpus(1)
    expression = 'device.attributes["gpu.tangram.dev"].productName.contains("A100")'
    spec["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": expression}}]
    return DemoClaim("ml", "a100", spec)


async def test_garbage_on_own_inventory_subject_keeps_the_last_good_inventory(
    source: ClaimSource, attacker: RefusalRecorder, admin: Bus
) -> None:
    subject = f"tangram.inventory.{NODE_B.name}"
    garbage = b"\x00 not an inventory {"
    before = await source.driver.submit(_whole_a100())  # the allocator holds node-b's inventory
    assert before is not None and before.node == NODE_B.name, source.driver.reasons
    await source.driver.release(before)

    earlier = await dead_letters(admin, FOLLOW_DEAD_LETTERS, subject)
    await attacker.nc.jetstream().publish(subject, garbage, timeout=5)
    letters = await eventually_dead_lettered(admin, FOLLOW_DEAD_LETTERS, subject, count=len(earlier) + 1)
    assert any(letter.reason.startswith("undecodable event:") for letter in letters), [
        letter.reason for letter in letters
    ]
    after = await source.driver.submit(_whole_a100())
    assert after is not None and after.node == NODE_B.name, source.driver.reasons
    # ... placed from the allocator's last good copy: the stream holds only the garbage for node-b.
    stored = await admin.jetstream.get_last_msg(INVENTORY_STREAM, subject)
    assert stored.data == garbage
    await source.driver.release(after)


async def test_anonymous_connection_is_refused(cluster: LocalCluster) -> None:
    nc = NatsClient()
    try:
        with pytest.raises(nats.errors.Error, match="Authorization"):
            await nc.connect(cluster.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
    finally:
        await nc.close()


async def test_wrong_password_is_refused(cluster: LocalCluster) -> None:
    assert cluster.nats is not None
    url = f"nats://{USER_B}:not-the-password-at-all@{cluster.nats.host}:{cluster.nats.port}"
    nc = NatsClient()
    try:
        with pytest.raises(nats.errors.Error, match="Authorization"):
            await nc.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
    finally:
        await nc.close()


@pytest.mark.parametrize(
    "subject",
    [
        "tangram.inventory.node-a",  # node-a's facts
        "tangram.node.node-a.partition.applied",
        "tangram.node.node-a.claim.prepared",
        "tangram.node.node-a.partition.requested",  # commands to another node
        "tangram.claim.released.some-claim",  # claim subjects
        "tangram.claim.allocated.some-claim",
        "tangram.claim.preempting.some-claim",  # a preemption: other tenants' pods evicted
        "$JS.API.STREAM.DELETE.TANGRAM_CLAIMS",  # streams
        "$JS.API.STREAM.PURGE.TANGRAM_NODES",
        "$JS.API.CONSUMER.MSG.NEXT.TANGRAM_NODES.partitioner-node-a",  # others' durables
        "$JS.API.CONSUMER.CREATE.TANGRAM_NODES.snoop.tangram.node.node-a.partition.*",  # others' filters
        "$JS.API.CONSUMER.CREATE.TANGRAM_NODES.snoop.tangram.node.node-a.claim.*",
        "$KV.tangram-leader.allocator",  # the leader lease
    ],
)
async def test_node_b_is_refused_what_is_not_its_own(attacker: RefusalRecorder, subject: str) -> None:
    assert await attacker.refused(subject)


async def _node_b_result(admin: Bus, command_id: str, timeout_s: float = 30.0) -> Event:
    """node-b's partitioner's answer to a command, once it is in the log."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [
            event
            async for _, event in admin.replay(NODES_STREAM)
            if isinstance(event, PartitionApplied | PartitionFailed) and event.command_id == command_id
        ]
        if found or time.monotonic() > deadline:
            assert found, f"no result for command {command_id} within {timeout_s:g} s"
            return found[0]
        await asyncio.sleep(0.2)


async def test_node_b_commanding_its_own_partitioner_cannot_destroy_a_live_claims_instance(
    source: ClaimSource, attacker: RefusalRecorder, admin: Bus, cluster: LocalCluster
) -> None:
    """A node may command its own partitioner (for claims kube-scheduler allocated), which its
    NVML access allows anyway; the partitioner still will not destroy what a live claim holds."""
    victim = await source.driver.submit(DemoClaim("victims", "mig-on-b", mig("3g.40gb")))
    assert victim is not None and victim.node == NODE_B.name, source.driver.reasons
    decision = await _decision(source, victim)
    device = decision.devices[0]
    assert device.placement is not None and device.profile_id is not None
    before = _mig_uuids(cluster, NODE_B)
    assert before
    destroy = PartitionRequested(
        key=NODE_B.name,
        command_id="node-b-destroys-a-live-instance",
        node=NODE_B.name,
        action="destroy",
        gpu_uuid=device.gpu_uuid,
        gpu_index=device.gpu_index,
        profile=device.profile or "",
        profile_id=device.profile_id,
        placement=device.placement,
        claim_uid="not-the-victim",
    )
    subject = f"tangram.node.{NODE_B.name}.partition.requested"
    await attacker.nc.jetstream().publish(subject, encode(destroy), timeout=5)
    result = await _node_b_result(admin, destroy.command_id)
    assert isinstance(result, PartitionFailed), result
    assert f"belongs to live claim {victim.uid}" in result.reason
    assert _mig_uuids(cluster, NODE_B) == before
    assert attacker.errors == []
    await source.driver.release(victim)


async def test_a_command_on_node_b_subject_naming_node_a_is_dead_lettered(
    attacker: RefusalRecorder, admin: Bus
) -> None:
    subject = f"tangram.node.{NODE_B.name}.partition.requested"
    forged = PartitionRequested(
        key=NODE_B.name,
        command_id="node-b-speaks-for-node-a",
        node=NODE_A.name,
        action="create",
        gpu_uuid="GPU-x",
        gpu_index=1,
        profile="1g.18gb",
        profile_id=19,
        placement=MigPlacement(start=0, size=1),
    )
    await attacker.nc.jetstream().publish(subject, encode(forged), timeout=5)
    [letter] = await eventually_dead_lettered(admin, f"partitioner-{NODE_B.name}", subject)
    assert letter.reason == (
        f"refused by subject: partition.requested on '{subject}': it speaks for node 'node-a', "
        "but the subject is node 'node-b''s"
    )


def _mig_uuids(cluster: LocalCluster, node: SimNode) -> set[str]:
    executor = MigExecutor(sim(node.machine, cluster.state_file(node.name)), minors=MINORS)
    return {i.mig_uuid for gpu in range(4) for i in executor.observe(gpu) if i.mig_uuid}
