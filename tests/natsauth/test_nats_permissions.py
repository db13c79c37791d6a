"""The generated nats-server authorization, enforced by a real nats-server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient

from tangram.bus import (
    Bus,
    BusConfig,
    BusError,
    LeaderLease,
    allocator_consumer,
    allocator_results_consumer,
    partitioner_consumer,
)
from tangram.bus.declarations import CLAIM_DECISION_SUBJECTS, IMAGE_BUCKET, IMAGE_NAME
from tangram.events import (
    CLAIMS_STREAM,
    NODES_STREAM,
    ClaimFailed,
    ClaimRequested,
    Event,
    MigPlacement,
    PartitionApplied,
    PartitionRequested,
)
from tangram.local.natsserver import NatsServer
from tangram.natsauth.permissions import build_users, inbox, render_users
from tests.support.refusals import RefusalRecorder

NODE_A = "node-a"
NODE_B = "gpu-b.lab"  # a dotted name: its user is node-gpu-b_lab, its subjects tangram.node.gpu-b_lab.*
USER_A = "node-node-a"
USER_B = "node-gpu-b_lab"
# How long to wait for what must come (a message, an ack, a refusal): generous for a loaded
# machine, and spent only when the test fails anyway.
WAIT_S = 60.0


class AuthServer:
    def __init__(self, server: NatsServer, passwords: dict[str, str]) -> None:
        self.server = server
        self.passwords = passwords

    def url(self, user: str) -> str:
        return f"nats://{user}:{self.passwords[user]}@127.0.0.1:{self.server.port}"

    def violations(self) -> list[str]:
        return [line for line in self.server.log if "Violation" in line]


@pytest.fixture
def auth_server(tmp_path: Path) -> Iterator[AuthServer]:
    users = build_users([NODE_A, NODE_B])
    config = tmp_path / "auth.conf"
    config.write_text(render_users(users))
    server = NatsServer(tmp_path / "store", config_file=config).start()
    try:
        yield AuthServer(server, {user.name: user.password for user in users})
    finally:
        server.stop()


async def _bus(auth: AuthServer, user: str) -> Bus:
    config = BusConfig(servers=(auth.url(user),), name=user, producer=user, publish_retry_s=WAIT_S)
    return await Bus.connect(config, wait_s=WAIT_S)


@pytest.fixture
async def admin(auth_server: AuthServer) -> AsyncIterator[Bus]:
    bus = await _bus(auth_server, "admin")
    await bus.ensure_streams()
    try:
        yield bus
    finally:
        await bus.close()


async def _client(auth: AuthServer, user: str) -> RefusalRecorder:
    return await RefusalRecorder().connect(auth.url(user), inbox_prefix=inbox(user))


async def _stored(admin: Bus, stream: str) -> int:
    return (await admin.jetstream.stream_info(stream)).state.messages


async def test_a_wrong_password_is_refused(auth_server: AuthServer) -> None:
    url = f"nats://{USER_A}:not-the-password-at-all@127.0.0.1:{auth_server.server.port}"
    nc = NatsClient()
    try:
        with pytest.raises(nats.errors.Error, match="Authorization"):
            await nc.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=WAIT_S)
    finally:
        await nc.close()


async def test_node_publishes_its_own_inventory_and_results(auth_server: AuthServer, admin: Bus) -> None:
    node = await _client(auth_server, USER_A)
    try:
        js = node.nc.jetstream()
        inventory = await js.publish("tangram.inventory.node-a", b"{}", timeout=WAIT_S)
        applied = await js.publish("tangram.node.node-a.partition.applied", b"{}", timeout=WAIT_S)
        prepared = await js.publish("tangram.node.node-a.claim.prepared", b"{}", timeout=WAIT_S)
        # The cdi service makes the MIG instances of claims kube-scheduler allocated.
        command = await js.publish("tangram.node.node-a.partition.requested", b"{}", timeout=WAIT_S)
    finally:
        await node.nc.close()
    assert (inventory.stream, applied.stream, prepared.stream, command.stream) == (
        "TANGRAM_INVENTORY",
        "TANGRAM_NODES",
        "TANGRAM_NODES",
        "TANGRAM_NODES",
    )
    assert (applied.seq, prepared.seq, command.seq) == (1, 2, 3)
    assert node.errors == []


@pytest.mark.parametrize(
    "subject",
    [
        "tangram.node.gpu-b_lab.partition.applied",  # another node's results
        "tangram.node.gpu-b_lab.claim.prepared",
        "tangram.inventory.gpu-b_lab",  # another node's inventory
        "tangram.claim.allocated.x",  # a claim decision
        "tangram.claim.failed.x",
        "tangram.claim.preempting.x",  # a preemption: would have other tenants' pods evicted
        "tangram.node.gpu-b_lab.partition.requested",  # a command to another node
        "tangram.deadletter.allocator",  # another consumer's dead letters
        "$JS.API.STREAM.UPDATE.TANGRAM_NODES",  # streams are the admin's
        "$JS.API.STREAM.DELETE.TANGRAM_CLAIMS",
        "$JS.API.STREAM.PURGE.TANGRAM_NODES",
        "$JS.API.CONSUMER.DURABLE.CREATE.TANGRAM_NODES.partitioner-gpu-b_lab",  # another node's durable
        "$JS.API.CONSUMER.MSG.NEXT.TANGRAM_NODES.partitioner-gpu-b_lab",
        "$JS.API.CONSUMER.MSG.NEXT.TANGRAM_CLAIMS.allocator",
        "$JS.API.CONSUMER.DELETE.TANGRAM_NODES.partitioner-gpu-b_lab",
        "$JS.API.CONSUMER.INFO.TANGRAM_NODES.partitioner-gpu-b_lab",
        "$JS.ACK.TANGRAM_NODES.partitioner-gpu-b_lab.1.1.1.1.0",
    ],
)
async def test_node_is_refused_what_is_not_its_own(auth_server: AuthServer, admin: Bus, subject: str) -> None:
    node = await _client(auth_server, USER_A)
    try:
        assert await node.refused(subject)
    finally:
        await node.nc.close()
    assert await _stored(admin, NODES_STREAM) == 0
    assert await _stored(admin, CLAIMS_STREAM) == 0


async def test_node_subscribes_to_its_own_subjects_only(auth_server: AuthServer) -> None:
    node = await _client(auth_server, USER_B)
    allocator = await _client(auth_server, "allocator")
    try:
        # Replies come back on the node's own inbox prefix.
        reply = await node.nc.request("$JS.API.STREAM.INFO.TANGRAM_NODES", b"", timeout=5)
        assert reply.subject.startswith(f"{inbox(USER_B)}.")
        # Streams are read through consumers delivering to the user's inbox, never by subscribing.
        assert await node.refused("tangram.claim.*.*", subscribe=True)
        assert await node.refused("tangram.node.gpu-b_lab.>", subscribe=True)
        assert await node.refused("tangram.node.node-a.>", subscribe=True)
        assert await node.refused("tangram.inventory.node-a", subscribe=True)
        assert await node.refused("tangram.>", subscribe=True)
    finally:
        await node.nc.close()
        await allocator.nc.close()


async def test_allocator_publishes_decisions_and_commands(auth_server: AuthServer, admin: Bus) -> None:
    allocator = await _client(auth_server, "allocator")
    try:
        js = allocator.nc.jetstream()
        allocated = await js.publish("tangram.claim.allocated.x", b"{}", timeout=WAIT_S)
        failed = await js.publish("tangram.claim.failed.y", b"{}", timeout=WAIT_S)
        command = await js.publish("tangram.node.gpu-b_lab.partition.requested", b"{}", timeout=WAIT_S)
        # The allocator does not speak for a node.
        assert await allocator.refused("tangram.node.node-a.partition.applied")
        assert await allocator.refused("tangram.inventory.node-a")
        assert await allocator.refused("$JS.API.STREAM.DELETE.TANGRAM_CLAIMS")
        assert await allocator.refused("$JS.API.CONSUMER.MSG.NEXT.TANGRAM_NODES.partitioner-node-a")
        assert await allocator.refused("$JS.API.CONSUMER.DELETE.TANGRAM_NODES.partitioner-gpu-b_lab")
    finally:
        await allocator.nc.close()
    assert (allocated.seq, failed.seq, command.seq) == (1, 2, 1)
    assert await _stored(admin, NODES_STREAM) == 1


def _command(node: str, token: str) -> PartitionRequested:
    return PartitionRequested(
        key=token,
        producer="allocator",
        command_id="cmd-1",
        node=node,
        action="create",
        gpu_uuid="GPU-1",
        gpu_index=0,
        profile="1g.18gb",
        profile_id=19,
        placement=MigPlacement(start=0, size=1),
        claim_uid="claim-1",
    )


async def test_services_work_end_to_end_as_their_own_users(auth_server: AuthServer, admin: Bus) -> None:
    allocator = await _bus(auth_server, "allocator")
    node = await _bus(auth_server, USER_A)
    stop = asyncio.Event()
    commands: asyncio.Queue[Event] = asyncio.Queue()
    results: asyncio.Queue[Event] = asyncio.Queue()
    claims: asyncio.Queue[Event] = asyncio.Queue()
    followed: list[Event] = []
    ready = [asyncio.Event() for _ in range(3)]
    caught_up = asyncio.Event()

    async def into(queue: asyncio.Queue[Event], event: Event) -> None:
        queue.put_nowait(event)

    tasks = [
        asyncio.create_task(
            node.consume(partitioner_consumer(NODE_A), lambda e: into(commands, e), stop=stop, ready=ready[0])
        ),
        asyncio.create_task(
            allocator.consume(
                allocator_results_consumer(), lambda e: into(results, e), stop=stop, ready=ready[1]
            )
        ),
        asyncio.create_task(
            allocator.consume(allocator_consumer(), lambda e: into(claims, e), stop=stop, ready=ready[2])
        ),
        asyncio.create_task(
            node.follow(
                CLAIMS_STREAM, CLAIM_DECISION_SUBJECTS, followed.append, stop=stop, caught_up=caught_up
            )
        ),
    ]
    try:
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in ready), caught_up.wait()), WAIT_S)
        request = ClaimRequested(
            key="claim-1", producer="test", namespace="ns", name="c", uid="claim-1", spec={}
        )
        await allocator.publish(request)
        assert (await asyncio.wait_for(claims.get(), WAIT_S)).event_id == request.event_id
        failed = ClaimFailed(
            key="claim-1", producer="allocator", namespace="ns", name="c", uid="claim-1", reason="none fit"
        )
        await allocator.publish(failed)

        command = _command(NODE_A, "node-a")
        await allocator.publish(command)
        received = await asyncio.wait_for(commands.get(), WAIT_S)
        assert isinstance(received, PartitionRequested)
        assert (received.command_id, received.node) == ("cmd-1", NODE_A)

        applied = PartitionApplied(
            key="node-a",
            producer="partitioner@node-a",
            command_id="cmd-1",
            node=NODE_A,
            action="create",
            gpu_uuid="GPU-1",
            gpu_index=0,
            profile="1g.18gb",
            placement=MigPlacement(start=0, size=1),
            mig_uuid="MIG-1",
        )
        await node.publish(applied)
        result = await asyncio.wait_for(results.get(), WAIT_S)
        assert isinstance(result, PartitionApplied)
        assert result.mig_uuid == "MIG-1"

        # The allocator's start-up replay of the node results, through an ephemeral pull consumer.
        replayed = [
            event
            async for _, event in allocator.replay(
                NODES_STREAM, subjects=["tangram.node.*.partition.applied"]
            )
        ]
        assert [e.event_id for e in replayed] == [applied.event_id]
        deadline = time.monotonic() + WAIT_S
        while not followed and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert [e.event_id for e in followed] == [failed.event_id]
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await node.close()
        await allocator.close()
    assert auth_server.violations() == []


async def test_only_the_allocator_user_can_hold_the_allocator_lease(
    auth_server: AuthServer, admin: Bus
) -> None:
    allocator = await _bus(auth_server, "allocator")
    try:
        lease = LeaderLease(allocator, "allocator", "allocator-0")
        stop = asyncio.Event()
        assert await asyncio.wait_for(lease.acquire(stop), WAIT_S) is True
        stop_soon = asyncio.get_running_loop().call_later(lease.renew_every_s * 2.5, stop.set)
        await asyncio.wait_for(lease.hold(stop), WAIT_S)  # two renewals, then a clean stop
        stop_soon.cancel()
        await lease.release()
        assert lease.held is False
    finally:
        await allocator.close()
    node = await _client(auth_server, USER_A)
    try:
        assert await node.refused("$KV.tangram-leader.allocator")
    finally:
        await node.nc.close()
    deadline = time.monotonic() + WAIT_S
    while not auth_server.violations() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)  # the server writes its log line a moment after telling the client
    [violation] = auth_server.violations()  # the allocator's lease traffic was all permitted
    assert '"$G/user:node-node-a" - Publish Violation - Subject "$KV.tangram-leader.allocator"' in violation


async def test_only_the_allocator_user_writes_and_reads_the_ledger_image(
    auth_server: AuthServer, admin: Bus
) -> None:
    """The image is the allocator's state: a node that could write it would decide what a restarted
    allocator holds, one that could read it would learn every claim of the cluster."""
    image = b"x" * (300 * 1024)  # several chunks
    allocator = await _bus(auth_server, "allocator")
    try:
        await allocator.ensure_streams()  # as every service does at start: the information alone
        await allocator.put_object(IMAGE_BUCKET.bucket, IMAGE_NAME, image)
        await allocator.put_object(IMAGE_BUCKET.bucket, IMAGE_NAME, image[::-1])  # replaces the last
        assert await allocator.get_object(IMAGE_BUCKET.bucket, IMAGE_NAME) == image[::-1]
    finally:
        await allocator.close()
    assert auth_server.violations() == []  # the allocator's image traffic was all permitted
    bucket, stream = IMAGE_BUCKET.bucket, f"OBJ_{IMAGE_BUCKET.bucket}"
    node = await _client(auth_server, USER_A)
    try:
        assert await node.refused(f"$O.{bucket}.C.forged")  # a chunk
        assert await node.refused(f"$O.{bucket}.M.bGVkZ2Vy")  # the entry naming the chunks
        assert await node.refused(f"$JS.API.STREAM.PURGE.{stream}")
        assert await node.refused(f"$JS.API.STREAM.MSG.GET.{stream}")
        assert await node.refused(f"$JS.API.DIRECT.GET.{stream}.$O.{bucket}.M.bGVkZ2Vy")
        assert await node.refused(f"$JS.API.CONSUMER.CREATE.{stream}")
        assert await node.refused(f"$JS.API.CONSUMER.CREATE.{stream}.reader.$O.{bucket}.C.>")
    finally:
        await node.nc.close()
    node_bus = await _bus(auth_server, USER_B)
    try:
        with pytest.raises(BusError):
            await node_bus.get_object(IMAGE_BUCKET.bucket, IMAGE_NAME)
    finally:
        await node_bus.close()
    assert await admin.get_object(IMAGE_BUCKET.bucket, IMAGE_NAME) == image[::-1]  # untouched
