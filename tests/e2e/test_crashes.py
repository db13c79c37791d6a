"""kill -9 of services in the middle of work: nothing allocated twice, nothing leaked, nothing lost.

The services run as separate processes on simulated GPUs with a real nats-server, as in the demo.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import time

import pytest

from tangram.bus import Bus, BusConfig
from tangram.chaos.invariants import overlapping_allocations
from tangram.demo.driver import Driver, Held, Tracker, wait_for_cluster
from tangram.demo.scenario import DemoClaim, churn, mig, whole_gpus
from tangram.events import (
    CLAIMS_STREAM,
    ClaimAllocated,
    ClaimFailed,
    ClaimRequested,
)
from tangram.local.processes import LocalCluster, SimNode
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


def decided(tracker: Tracker) -> int:
    return tracker.counts["claim.allocated"] + tracker.counts["claim.failed"]


# The restarted allocator waits for its killed predecessor's lease to expire (10 s), then rebuilds:
# on a loaded 2-core machine a decision can take several times that.
DECISION_TIMEOUT_S = 120.0
SIGNAL_TIMEOUT_S = 120.0


@pytest.mark.timeout(600)
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
        driver = Driver(cluster, bus, tracker, decision_timeout_s=DECISION_TIMEOUT_S)
        # Only node-a has H200s: these two hold MIG instances there for the partitioner's part.
        on_a = [DemoClaim("ml", "h200-1g", mig("1g.18gb")), DemoClaim("ml", "h200-2g", mig("2g.35gb"))]
        await submit_all(driver, [churn(rng, n) for n in range(8)] + on_a)

        # The allocator dies holding its lease; claims keep arriving while it is down.
        cluster.crash("allocator")
        requested, decided_before = tracker.counts["claim.requested"], decided(tracker)
        arriving = asyncio.gather(*(driver.submit(churn(rng, n)) for n in range(8, 14)))
        assert await tracker.wait_until(lambda: tracker.counts["claim.requested"] >= requested + 6, 30)
        assert decided(tracker) == decided_before  # none of them decided: no allocator is running
        cluster.restart("allocator")
        await arriving

        # A partitioner dies with MIG work queued: releases (destroys) and new MIG claims.
        cluster.crash("partitioner@node-a")
        releasing = [h for h in driver.held if h.node == "node-a" and h.mig_instances][:3]
        assert releasing
        for held in releasing:
            await driver.release(held)
        before = decided(tracker)
        queued = asyncio.gather(
            *(driver.submit(DemoClaim("ml", f"mig-{n}", mig("1g.18gb"))) for n in range(3))
        )
        # Restart only once the work is on node-a's queue: the three decided, the destroys commanded.
        assert await tracker.wait_until(
            lambda: (
                decided(tracker) >= before + 3
                and all(tracker.destroys_of[h.uid] >= h.mig_instances for h in releasing)
            ),
            SIGNAL_TIMEOUT_S,
        )
        assert tracker.destroy_requested - tracker.destroy_done  # nobody on node-a to carry them out
        cluster.restart("partitioner@node-a")
        await queued

        # The kubelet plugin dies between calls; prepared claims survive, a second prepare agrees.
        cluster.crash("cdi@node-a")
        cluster.restart("cdi@node-a")
        await wait_for_cluster(cluster, bus, tracker)
        await submit_all(driver, [DemoClaim("ml", "after", whole_gpus(1))])

        for held in list(driver.held):
            await driver.release(held)
        settled = await driver.settle(SIGNAL_TIMEOUT_S)
        log = [event async for _, event in bus.replay(CLAIMS_STREAM)]
    finally:
        await subscription.unsubscribe()
        await bus.close()
        codes = cluster.stop()

    requested_uids = {e.uid for e in log if isinstance(e, ClaimRequested)}
    decided_uids = [e.uid for e in log if isinstance(e, ClaimAllocated | ClaimFailed)]
    assert driver.outcomes["undecided"] == 0 and driver.outcomes["prepare_failed"] == 0, driver.reasons
    assert sorted(decided_uids) == sorted(requested_uids)  # every claim decided exactly once
    assert overlapping_allocations(log) == []
    assert settled, f"{driver.unsettled()} MIG instances of released claims not destroyed"
    assert tracker.destroy_requested == tracker.destroy_done
    for node in NODES:
        assert mig_uuids(cluster, node) <= made_before[node.name]  # no instance Tangram made is left
        assert list(cluster.cdi_dir(node.name).glob("*.json")) == []  # no spec without a prepared claim
    assert all(code == 0 for code in codes.values()), codes
    shutil.rmtree(cluster.workdir, ignore_errors=True)
