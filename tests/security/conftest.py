"""One Tangram under the generated NATS permissions, every service its own OS process, and the
tools of someone holding node-b's credentials."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest

from tangram.bus import Bus, BusConfig
from tangram.bus.declarations import CLAIM_DECISION_SUBJECTS
from tangram.demo.driver import Driver, Tracker, wait_for_cluster
from tangram.events import CLAIMS_STREAM, DEADLETTER_STREAM, DeadLetter, Event, NodeInventory
from tangram.local.processes import LocalCluster, SimNode
from tangram.natsauth.permissions import ADMIN_USER, ALLOCATOR_USER, inbox, node_user
from tests.support.refusals import RefusalRecorder

# node-a has 8 NVSwitch-connected H200s, node-b 4 A100s: an 8-GPU claim fits only node-a.
NODE_A = SimNode("node-a", "hgx-h200")
NODE_B = SimNode("node-b", "a100-pcie-2x2")
USER_B = node_user(NODE_B.name)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster([NODE_A, NODE_B], auth=True)
    cluster.start()
    try:
        yield cluster
    finally:
        codes = cluster.stop()
        shutil.rmtree(cluster.workdir, ignore_errors=True)
        assert all(code == 0 for code in codes.values()), codes


@pytest.fixture(scope="module")
def inventories() -> dict[str, NodeInventory]:
    """The last good inventory of each node, as first read: the attacks overwrite node-b's stored
    one with refused messages (the allocator keeps its own last good copy; so do the tests)."""
    return {}


@dataclass
class ClaimSource:
    """Kubernetes' part: submits claims (as the allocator user, whose watcher does it in
    production), acts as kubelet over the real DRA sockets, and watches the decisions."""

    bus: Bus
    driver: Driver
    tracker: Tracker


@pytest.fixture
async def source(cluster: LocalCluster, inventories: dict[str, NodeInventory]) -> AsyncIterator[ClaimSource]:
    bus = await _bus(cluster, ALLOCATOR_USER)
    tracker = Tracker(started=time.monotonic(), out=lambda line: None, inventories=inventories)
    stop = asyncio.Event()
    caught_up = asyncio.Event()
    follow = asyncio.create_task(
        bus.follow(CLAIMS_STREAM, CLAIM_DECISION_SUBJECTS, tracker.on_event, stop=stop, caught_up=caught_up)
    )
    try:
        await asyncio.wait_for(caught_up.wait(), 30)
        await wait_for_cluster(cluster, bus, tracker)
        yield ClaimSource(bus, Driver(cluster, bus, tracker), tracker)
    finally:
        stop.set()
        await follow
        await bus.close()


async def _bus(cluster: LocalCluster, user: str) -> Bus:
    config = BusConfig(servers=(cluster.url_for(user),), name=user, producer=user, publish_retry_s=5.0)
    return await Bus.connect(config, wait_s=10)


@pytest.fixture
async def admin(cluster: LocalCluster) -> AsyncIterator[Bus]:
    bus = await _bus(cluster, ADMIN_USER)
    try:
        yield bus
    finally:
        await bus.close()


@pytest.fixture
async def attacker(cluster: LocalCluster) -> AsyncIterator[RefusalRecorder]:
    """A plain NATS connection with node-b's credentials."""
    attacker = await RefusalRecorder().connect(cluster.url_for(USER_B), inbox_prefix=inbox(USER_B))
    try:
        yield attacker
    finally:
        await attacker.nc.close()


async def dead_letters(admin: Bus, consumer: str, original_subject: str) -> list[DeadLetter]:
    letters: list[Event] = [e async for _, e in admin.replay(DEADLETTER_STREAM)]
    return [
        letter
        for letter in letters
        if isinstance(letter, DeadLetter)
        and letter.consumer == consumer
        and letter.original_subject == original_subject
    ]


async def eventually_dead_lettered(
    admin: Bus, consumer: str, original_subject: str, *, count: int = 1, timeout_s: float = 30.0
) -> list[DeadLetter]:
    """The dead letters of `consumer` for `original_subject`, once there are `count` (or the time is up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        letters = await dead_letters(admin, consumer, original_subject)
        if len(letters) >= count or time.monotonic() > deadline:
            return letters
        await asyncio.sleep(0.2)
