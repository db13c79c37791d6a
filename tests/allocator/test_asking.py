"""Claims are asked of the allocator fairly across namespaces, a bounded number unanswered at a time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from services.allocator.asking import FairAsker
from services.allocator.clusterview import ClusterView
from services.allocator.requester import ClaimRequester
from tangram.allocation import FleetState
from tangram.allocation.ledger import Ledger
from tangram.events import ClaimRequested, Event
from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes

from .helpers import gpus, inventory, request

NAMESPACE_OF: dict[str, str] = {}


class Recorder:
    def __init__(self) -> None:
        self.published: list[str] = []
        self.changed = asyncio.Event()

    async def publish(self, event: Event) -> None:
        assert isinstance(event, ClaimRequested)
        self.published.append(event.uid)
        self.changed.set()

    async def until(self, count: int) -> None:
        while len(self.published) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 10)


def ask(n: int, namespace: str) -> str:
    made = request(n, gpus(1), namespace=namespace)
    NAMESPACE_OF[made.uid] = namespace
    return made.uid


def build(uid: str) -> ClaimRequested | None:
    n = int(uid.rsplit("-", 1)[1])
    return request(n, gpus(1), namespace=NAMESPACE_OF[uid])


@asynccontextmanager
async def running(asker: FairAsker) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(asker.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_at_most_max_in_flight_are_asked_before_answers_come() -> None:
    recorder = Recorder()
    asker = FairAsker(recorder.publish, build, max_in_flight=3)
    flood = [ask(n, "flood") for n in range(100)]
    for uid in flood:
        asker.enqueue("flood", uid)
    async with running(asker):
        await recorder.until(3)
        await asyncio.sleep(0)  # the loop had its chance to ask a fourth
        assert recorder.published == flood[:3]
        assert asker.in_flight == 3
        asker.answered(flood[0])
        await recorder.until(4)
        assert recorder.published == flood[:4]


async def test_a_claim_behind_a_flood_is_asked_after_at_most_one_more_of_the_flood() -> None:
    recorder = Recorder()
    asker = FairAsker(recorder.publish, build, max_in_flight=4)
    flood = [ask(n, "flood") for n in range(5000)]
    for uid in flood:
        asker.enqueue("flood", uid)
    async with running(asker):
        await recorder.until(4)
        quiet = ask(9999, "quiet")
        asker.enqueue("quiet", quiet)
        for answered in range(2):
            asker.answered(recorder.published[answered])
        await recorder.until(6)
        # One more of the flood (its turn came first), then the quiet namespace's claim: it waited
        # for two answers, not for the 4,995 flood claims still in line.
        assert recorder.published[4:6] == [flood[4], quiet]


async def test_a_claim_deleted_while_it_waited_is_not_asked() -> None:
    recorder = Recorder()
    gone = ask(1, "team")
    kept = ask(2, "team")

    def build_unless_gone(uid: str) -> ClaimRequested | None:
        return None if uid == gone else build(uid)

    asker = FairAsker(recorder.publish, build_unless_gone, max_in_flight=1)
    asker.enqueue("team", gone)
    asker.enqueue("team", kept)
    async with running(asker):
        await recorder.until(1)
        assert recorder.published == [kept]


async def test_an_answer_that_never_comes_gives_its_place_back() -> None:
    recorder = Recorder()
    asker = FairAsker(recorder.publish, build, max_in_flight=1, expiry_s=0.05)
    first, second = ask(1, "team"), ask(2, "team")
    asker.enqueue("team", first)
    asker.enqueue("team", second)
    async with running(asker):
        await recorder.until(2)  # never answered, the first one's place expired
        assert recorder.published == [first, second]


async def test_the_requester_counts_claims_in_line_asked_and_waiting_for_capacity() -> None:
    """What `tangram_allocator_kubernetes_claims` reports: a claim waits in line, is asked, then
    (failed for want of capacity) waits for capacity, or (allocated) is counted no more."""
    view = ClusterView()
    view.classes = {m["metadata"]["name"]: m for m in load_shipped_device_classes()}
    recorder = Recorder()
    requester = ClaimRequester(
        view, Ledger(FleetState(), {}), recorder.publish, producer="test", max_in_flight=1
    )
    claims = []
    for n in range(2):
        claim = {
            "metadata": {"namespace": "team", "name": f"c{n}", "uid": f"u{n}"},
            "spec": gpus(1),
            "status": {},
        }
        view.claims[("team", f"c{n}")] = claim
        claims.append(claim)
        requester.ask(claim)
    assert requester.counts() == {"waiting": 2, "asked": 0, "unplaceable": 0}
    async with running(requester.asker):
        await recorder.until(1)
        assert requester.counts() == {"waiting": 1, "asked": 1, "unplaceable": 0}
        requester.failed("u0", "capacity")
        requester.asker.answered("u0")
        await recorder.until(2)
        assert requester.counts() == {"waiting": 0, "asked": 1, "unplaceable": 1}
        requester.allocated("u1")
        requester.asker.answered("u1")
        assert requester.counts() == {"waiting": 0, "asked": 0, "unplaceable": 1}
        requester.failed("u1", "hardware")  # no node could ever hold it
        assert requester.counts()["unplaceable"] == 2


def test_claims_waiting_for_capacity_are_asked_again_when_the_fleets_nodes_change_only() -> None:
    """An inventory from the nodes already known asks nothing again, even the first one after a
    claim failed; a node that joins asks again every claim that waits."""
    view = ClusterView()
    view.classes = {m["metadata"]["name"]: m for m in load_shipped_device_classes()}
    ledger = Ledger(FleetState(), {})
    ledger.apply(inventory("l40s-8", "n1"), live=False)
    requester = ClaimRequester(view, ledger, Recorder().publish, producer="test", max_in_flight=1)
    claim = {"metadata": {"namespace": "team", "name": "c0", "uid": "u0"}, "spec": gpus(1), "status": {}}
    view.claims[("team", "c0")] = claim
    requester.ask(claim)
    requester.asker.discard("u0")  # asked and answered: it failed for want of capacity
    requester.failed("u0", "capacity")
    assert requester.counts() == {"waiting": 0, "asked": 0, "unplaceable": 1}
    ledger.apply(inventory("l40s-8", "n1"), live=False)
    requester.nodes_seen()
    assert requester.counts()["waiting"] == 0
    ledger.apply(inventory("l40s-8", "n2"), live=False)
    requester.nodes_seen()
    assert requester.counts()["waiting"] == 1
    asked = requester.request_for("u0")
    assert asked is not None and asked.attempt == 1
