"""kill -9 of services in the middle of work: nothing allocated twice, nothing leaked, nothing lost.

The services run as separate processes on simulated GPUs with a real nats-server, as in the demo.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import time

from tangram.bus import Bus, BusConfig
from tangram.chaos.invariants import overlapping_allocations
from tangram.demo.cluster import LocalCluster, SimNode
from tangram.demo.driver import Driver, Held, Tracker, wait_for_cluster
from tangram.demo.scenario import DemoClaim, churn, mig, whole_gpus
from tangram.events import (
    CLAIMS_STREAM,
    ClaimAllocated,
    ClaimFailed,
    ClaimRequested,
)
from tangram.nvml import SimNvml

NODES = [SimNode("node-a", "hgx-h200"), SimNode("node-b", "dgx-h100")]


def mig_uuids(cluster: LocalCluster, node: SimNode) -> set[str]:
    nvml = SimNvml.from_machine(node.machine, state_file=cluster.state_file(node.name))
    nvml.nvmlInit()
    found = set()
    for index in range(nvml.nvmlDeviceGetCount()):
        device = nvml.nvmlDeviceGetHandleByIndex(index)
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(device)):
            try:
                found.add(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, slot)))
            except Exception:
                continue
    return found


async def submit_all(driver: Driver, claims: list[DemoClaim]) -> list[Held | None]:
    return await asyncio.gather(*(driver.submit(claim) for claim in claims))


async def test_kill_9_of_allocator_partitioner_and_cdi_loses_nothing() -> None:
    cluster = LocalCluster(NODES)
    tracker = Tracker(started=time.monotonic(), out=lambda line: None)
    cluster.start()
    bus = await Bus.connect(BusConfig(servers=(cluster.url,), name="chaos", producer="chaos"), wait_s=10)
    subscription = await bus.nats.subscribe("tangram.>", cb=tracker.on_message)
    rng = random.Random(11)
    try:
        await bus.ensure_streams()
        await wait_for_cluster(cluster, bus, tracker)
        made_before = {node.name: mig_uuids(cluster, node) for node in NODES}
        driver = Driver(cluster, bus, tracker)
        await submit_all(driver, [churn(rng, n) for n in range(8)])

        # The allocator dies holding its lease; claims keep arriving while it is down.
        cluster.crash("allocator")
        arriving = asyncio.gather(*(driver.submit(churn(rng, n)) for n in range(8, 14)))
        await asyncio.sleep(0.5)
        cluster.restart("allocator")
        await arriving

        # A partitioner dies with MIG work queued: releases (destroys) and new MIG claims.
        cluster.crash("partitioner@node-a")
        for held in [h for h in driver.held if h.node == "node-a"][:3]:
            await driver.release(held)
        queued = asyncio.gather(*(driver.submit(DemoClaim("ml", f"mig-{n}", mig("1g."))) for n in range(3)))
        await asyncio.sleep(0.5)
        cluster.restart("partitioner@node-a")
        await queued

        # The kubelet plugin dies between calls; prepared claims survive, a second prepare agrees.
        cluster.crash("cdi@node-a")
        cluster.restart("cdi@node-a")
        await wait_for_cluster(cluster, bus, tracker)
        await submit_all(driver, [DemoClaim("ml", "after", whole_gpus(1))])

        for held in list(driver.held):
            await driver.release(held)
        deadline = time.monotonic() + 30
        while tracker.destroy_requested - tracker.destroy_done and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        log = [event async for _, event in bus.replay(CLAIMS_STREAM)]
    finally:
        await subscription.unsubscribe()
        await bus.close()
        codes = cluster.stop()

    requested = {e.uid for e in log if isinstance(e, ClaimRequested)}
    decided = [e.uid for e in log if isinstance(e, ClaimAllocated | ClaimFailed)]
    assert driver.outcomes["undecided"] == 0 and driver.outcomes["prepare_failed"] == 0, driver.reasons
    assert sorted(decided) == sorted(requested)  # every claim decided exactly once
    assert overlapping_allocations(log) == []
    assert tracker.destroy_requested == tracker.destroy_done
    for node in NODES:
        assert mig_uuids(cluster, node) <= made_before[node.name]  # no instance Tangram made is left
        assert list(cluster.cdi_dir(node.name).glob("*.json")) == []  # no spec without a prepared claim
    assert all(code == 0 for code in codes.values()), codes
    shutil.rmtree(cluster.workdir, ignore_errors=True)
