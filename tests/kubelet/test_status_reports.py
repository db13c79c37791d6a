"""When the plugin reports what it prepared (in Kubernetes, the claim's status.devices): after each
prepare and unprepare, under the claim's lock, again when the node's GPU health changes, and
never at the cost of the prepare itself."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tangram.cdi.devices import ClaimRef, ResolvedAllocation
from tangram.kubelet import KubeletPlugin, build_plugin
from tests.kubelet.fakes import NODE, TestKubelet, WatchedSource, inventory, whole_gpu_allocation
from tests.support.polling import until

UID = "0b6f6c55-3f0e-4c4e-9a59-2d3f2c1f7a01"


@dataclass
class Reports:
    """What the plugin reported, in order; `fail` makes each report raise instead."""

    seen: list[tuple[str, str]] = field(default_factory=list)
    allocations: list[ResolvedAllocation] = field(default_factory=list)
    fail: bool = False
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.gate.set()

    async def prepared(self, allocation: ResolvedAllocation) -> str:
        await self.gate.wait()
        self.seen.append(("prepared", allocation.claim.uid))
        self.allocations.append(allocation)
        if self.fail:
            raise RuntimeError("the API server is on fire")
        return "written"

    async def unprepared(self, claim: ClaimRef) -> str:
        self.seen.append(("unprepared", claim.uid))
        if self.fail:
            raise RuntimeError("the API server is on fire")
        return "written"


@dataclass
class Node:
    plugin: KubeletPlugin
    source: WatchedSource
    kubelet: TestKubelet
    reports: Reports

    @property
    def endpoint(self) -> str:
        return str(self.plugin.config.dra_socket)


@pytest.fixture
async def node(
    no_leaked_tasks: None, make_config: Callable[..., Any], kubelet_root: Path
) -> AsyncIterator[Node]:
    source = WatchedSource(NODE)
    source.observe(inventory())
    reports = Reports()
    plugin = await build_plugin(make_config(), source, status=reports)
    plugin.health.update(inventory().hardware)
    kubelet = TestKubelet(kubelet_root)
    await plugin.start()
    try:
        yield Node(plugin, source, kubelet, reports)
    finally:
        await kubelet.close()
        await plugin.stop()


async def test_each_prepare_and_unprepare_is_reported(node: Node) -> None:
    node.source.observe(whole_gpu_allocation(UID, gpu=1))
    ref = [("default", "train", UID)]
    assert (await node.kubelet.prepare(node.endpoint, ref))[UID].error == ""
    # a prepare kubelet repeats (after its restart, say) reports again: the status is made right
    assert (await node.kubelet.prepare(node.endpoint, ref))[UID].error == ""
    assert await node.kubelet.unprepare(node.endpoint, ref) == {UID: ""}
    assert node.reports.seen == [("prepared", UID), ("prepared", UID), ("unprepared", UID)]
    assert [d.device for d in node.reports.allocations[0].devices] == ["gpu-1"]


async def test_an_unprepare_waits_for_the_report_of_its_prepare(node: Node) -> None:
    # the removal must come after the write, or a claim would keep entries of devices let go
    node.source.observe(whole_gpu_allocation(UID, gpu=1))
    ref = [("default", "train", UID)]
    node.reports.gate.clear()
    preparing = asyncio.create_task(node.kubelet.prepare(node.endpoint, ref))
    await until("the prepare reporting", lambda: node.plugin.preparer.prepared_claims)
    unpreparing = asyncio.create_task(node.kubelet.unprepare(node.endpoint, ref))

    def both_at_the_claims_lock() -> bool:
        entry = node.plugin.preparer._locks.get(UID)
        return entry is not None and entry.users == 2

    # the unprepare waits at the claim's lock, which the prepare holds while it reports
    await until("the unprepare waiting for the prepare", both_at_the_claims_lock)
    assert node.reports.seen == []
    node.reports.gate.set()
    assert (await preparing)[UID].error == ""
    assert await unpreparing == {UID: ""}
    assert node.reports.seen == [("prepared", UID), ("unprepared", UID)]


async def test_a_report_that_fails_does_not_fail_the_prepare(node: Node) -> None:
    node.reports.fail = True
    node.source.observe(whole_gpu_allocation(UID, gpu=1))
    ref = [("default", "train", UID)]
    answer = (await node.kubelet.prepare(node.endpoint, ref))[UID]
    assert answer.error == "" and [d[2] for d in answer.devices] == ["gpu-1"]
    assert await node.kubelet.unprepare(node.endpoint, ref) == {UID: ""}
    assert node.reports.seen == [("prepared", UID), ("unprepared", UID)]


async def test_a_gpu_health_change_reports_the_prepared_claims_again(node: Node) -> None:
    node.source.observe(whole_gpu_allocation(UID, gpu=1))
    assert (await node.kubelet.prepare(node.endpoint, [("default", "train", UID)]))[UID].error == ""
    reported = len(node.reports.seen)
    hardware = inventory().hardware
    gpus = [msgspec.structs.replace(g, health="unhealthy") if g.index == 1 else g for g in hardware.gpus]
    assert node.plugin.health.update(msgspec.structs.replace(hardware, gpus=gpus))
    await until("the claim reported again", lambda: len(node.reports.seen) > reported)
    assert node.reports.seen[-1] == ("prepared", UID)
