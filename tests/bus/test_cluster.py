"""The bus on a 3-server JetStream cluster: streams replicated 3 times survive the loss of a server.

Each test starts its own cluster (three nats-server processes on loopback with their own ports
and stores); servers are killed with SIGKILL, as a machine losing power would.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tangram.bus import STREAMS, Bus, BusConfig, ConsumerSpec
from tangram.bus.declarations import LEADER_BUCKET
from tangram.events import CLAIMS_STREAM, ClaimRequested, Event
from tangram.local.natsserver import ClusterMembership, NatsCluster, NatsServer, NatsServerError


def claim(n: int) -> ClaimRequested:
    uid = f"uid-{n:05d}"
    return ClaimRequested(key=uid, namespace="team-a", name=f"claim-{n}", uid=uid, spec={"devices": {}})


async def connect(cluster: NatsCluster, name: str = "test") -> Bus:
    config = BusConfig(
        servers=cluster.urls, name=name, producer=name, publish_retry_s=30.0, stream_replicas=3
    )
    return await Bus.connect(config, wait_s=10)


async def stored_uids(bus: Bus) -> list[str]:
    return [e.uid async for _, e in bus.replay(CLAIMS_STREAM) if isinstance(e, ClaimRequested)]


async def stream_leader(bus: Bus, stream: str) -> str:
    info = await bus.jetstream.stream_info(stream)
    assert info.cluster is not None and info.cluster.leader is not None
    return info.cluster.leader


def test_cluster_starts_three_servers_that_agree_on_a_metadata_leader(nats_cluster: NatsCluster) -> None:
    assert nats_cluster.running() == [0, 1, 2]
    ports = {server.port for server in nats_cluster.servers}
    assert len(ports) == 3 and 0 not in ports
    for server in nats_cluster.servers:
        assert any("metadata leader" in line for line in server.log), server.log[-5:]


async def test_streams_and_the_leader_bucket_are_replicated_three_times(nats_cluster: NatsCluster) -> None:
    bus = await connect(nats_cluster)
    try:
        await bus.ensure_streams()
        for spec in STREAMS:
            info = await bus.jetstream.stream_info(spec.name)
            assert info.config.num_replicas == 3, spec.name
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2, spec.name
        bucket = await bus.jetstream.stream_info(f"KV_{LEADER_BUCKET.bucket}")
        assert bucket.config.num_replicas == 3
        # Declaring again changes nothing: the replica count is part of the declared shape.
        await bus.ensure_streams()
        assert (await bus.jetstream.stream_info(CLAIMS_STREAM)).config.num_replicas == 3
    finally:
        await bus.close()


async def test_killing_the_stream_leader_mid_publish_loses_nothing_acknowledged(
    nats_cluster: NatsCluster,
) -> None:
    bus = await connect(nats_cluster)
    acked: list[str] = []
    try:
        await bus.ensure_streams()
        leader = await stream_leader(bus, CLAIMS_STREAM)
        victim = next(
            i for i, s in enumerate(nats_cluster.servers) if s.cluster and s.cluster.server_name == leader
        )

        async def publisher(first: int) -> None:
            for n in range(first, first + 150):
                await bus.publish(claim(n))
                acked.append(claim(n).uid)

        writers = [asyncio.create_task(publisher(k * 1000)) for k in range(4)]
        while len(acked) < 100:
            await asyncio.sleep(0.005)
        await asyncio.to_thread(nats_cluster.kill, victim)
        await asyncio.gather(*writers)
        assert len(acked) == 600
        stored = await stored_uids(bus)
        assert sorted(stored) == sorted(acked)  # every acked event once, nothing else
        assert await stream_leader(bus, CLAIMS_STREAM) != leader
    finally:
        await bus.close()


async def test_replays_started_just_after_a_server_dies_read_the_whole_log_once(
    nats_cluster: NatsCluster,
) -> None:
    """For seconds after a server dies the metadata leader may still place a new consumer on it,
    and a create retried under the same name stayed there: replays started then still read every
    event once, in order."""
    bus = await connect(nats_cluster)
    try:
        await bus.ensure_streams()
        published = [claim(n) for n in range(30)]
        for event in published:
            await bus.publish(event)
        leader = await stream_leader(bus, CLAIMS_STREAM)
        connected = bus.nats.connected_url
        assert connected is not None
        victim = next(
            i
            for i, s in enumerate(nats_cluster.servers)
            if s.cluster and s.cluster.server_name != leader and s.port != connected.port
        )
        await asyncio.to_thread(nats_cluster.kill, victim)
        for _ in range(10):
            assert await stored_uids(bus) == [e.uid for e in published]
    finally:
        await bus.close()


async def test_the_bus_keeps_working_through_rolling_server_restarts(nats_cluster: NatsCluster) -> None:
    """Each server in turn is killed and restarted while events flow: a restarted server catches up,
    so losing the next one still loses nothing; a durable consumer sees every event once."""
    bus = await connect(nats_cluster)
    handled: list[str] = []
    stop = asyncio.Event()
    # Messages handed out by a server just before it is killed come again after the ack wait:
    # short here, so the wait below measures the bus, not the redelivery timer.
    spec = ConsumerSpec(
        durable="test-rolling",
        stream=CLAIMS_STREAM,
        filter_subjects=("tangram.claim.requested.>",),
        ack_wait_s=3.0,
    )

    async def handle(event: Event) -> None:
        assert isinstance(event, ClaimRequested)
        handled.append(event.uid)

    try:
        await bus.ensure_streams()
        consumer = asyncio.create_task(bus.consume(spec, handle, stop=stop))
        published: list[str] = []
        n = 0
        for victim in range(3):
            for _ in range(40):
                await bus.publish(claim(n))
                published.append(claim(n).uid)
                n += 1
            await asyncio.to_thread(nats_cluster.kill, victim)
            for _ in range(40):
                await bus.publish(claim(n))
                published.append(claim(n).uid)
                n += 1
            await asyncio.to_thread(nats_cluster.restart, victim)
        async with asyncio.timeout(60):
            while len(set(handled)) < len(published):
                await asyncio.sleep(0.05)
        stop.set()
        await consumer
        assert sorted(await stored_uids(bus)) == sorted(published)
        assert set(handled) == set(published)
    finally:
        stop.set()
        await bus.close()


def test_a_server_that_cannot_bind_its_route_port_is_a_clear_error(tmp_path: Path) -> None:
    with NatsServer(tmp_path / "taken") as holder:
        taken = holder.port  # a client port in use: as a route port it cannot be bound
        server = NatsServer(
            tmp_path / "member",
            startup_timeout=10,
            cluster=ClusterMembership("tangram", "n0", taken, (taken,)),
        )
        with pytest.raises(NatsServerError, match=r"failed to start: .*address already in use"):
            server.start()
