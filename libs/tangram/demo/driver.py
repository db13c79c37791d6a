"""Drives the local cluster: submits claims, acts as kubelet, releases them, and counts what happened."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg

from tangram.bus import Bus, BusConfig
from tangram.demo.display import describe
from tangram.demo.scenario import DemoClaim, churn, opening
from tangram.events import (
    INVENTORY_STREAM,
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    ClaimRequested,
    Event,
    EventDecodeError,
    NodeInventory,
    PartitionApplied,
    PartitionFailed,
    PartitionRequested,
    decode,
)
from tangram.kubelet.client import ClaimHandle, KubeletClient
from tangram.local.processes import LocalCluster
from tangram.stats import percentile

DECISION_TIMEOUT_S = 30.0
SETTLE_TIMEOUT_S = 60.0  # released MIG instances destroyed, on a loaded machine
MAX_CHURN_STEPS = 400


@dataclass
class Tracker:
    """Watches every Tangram subject (core NATS sees what JetStream stores) and prints one line each."""

    started: float
    out: Callable[[str], None]
    watch: Callable[[Event], None] | None = None  # sees every event (the live fleet view)
    counts: Counter[str] = field(default_factory=Counter)
    decisions: dict[str, asyncio.Future[Event]] = field(default_factory=dict)
    inventories: dict[str, NodeInventory] = field(default_factory=dict)
    discovered: set[str] = field(default_factory=set)  # nodes whose discovery service has published
    destroy_requested: set[str] = field(default_factory=set)
    destroy_done: set[str] = field(default_factory=set)  # applied or failed
    destroys_of: Counter[str] = field(default_factory=Counter)  # claim uid -> destroy commands seen
    created: set[str] = field(default_factory=set)  # command ids of applied creates
    mig_destroyed: int = 0
    commanded: dict[str, float] = field(default_factory=dict)  # command id -> when it was seen
    command_ms: list[float] = field(default_factory=list)  # partition command -> applied
    _news: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def mig_created(self) -> int:
        return len(self.created)

    async def wait_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Whether `condition` came true within `timeout_s`; checked again after every event."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._news.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._news.wait(), remaining)
        return True

    async def on_message(self, msg: Msg) -> None:
        try:
            event = decode(msg.data)
        except EventDecodeError:
            self.counts["undecodable"] += 1
            return
        self.on_event(event)

    def on_event(self, event: Event) -> None:
        """One event, from a core subscription or from following a stream (under permissions)."""
        self.counts[event.type_name()] += 1
        if self.watch is not None:
            self.watch(event)
        now = time.monotonic()
        if isinstance(event, PartitionRequested):
            self.commanded[event.command_id] = now
        elif isinstance(event, PartitionApplied) and event.command_id in self.commanded:
            self.command_ms.append((now - self.commanded.pop(event.command_id)) * 1000)
        self.out(f"+{time.monotonic() - self.started:7.2f}s  {event.type_name():<19} {describe(event)}")
        self._record(event)
        self._news.set()

    def _record(self, event: Event) -> None:
        match event:
            case NodeInventory(hardware=hw):
                self.inventories[hw.node] = event
                if event.producer == f"discovery@{hw.node}":
                    self.discovered.add(hw.node)
            case ClaimAllocated(uid=uid) | ClaimFailed(uid=uid):
                future = self.decisions.get(uid)
                if future is not None and not future.done():
                    future.set_result(event)
            case PartitionRequested(action="destroy", command_id=command_id, claim_uid=uid):
                if command_id not in self.destroy_requested:
                    self.destroys_of[uid] += 1
                self.destroy_requested.add(command_id)
            case PartitionApplied(action="create", command_id=command_id):
                self.created.add(command_id)
            case PartitionApplied(action="destroy", command_id=command_id):
                if command_id not in self.destroy_done:
                    self.mig_destroyed += 1
                self.destroy_done.add(command_id)
            case PartitionFailed(action="destroy", command_id=command_id):
                self.destroy_done.add(command_id)
            case _:
                pass


@dataclass
class Held:
    claim: DemoClaim
    uid: str
    node: str
    mig_instances: int = 0  # each is destroyed by its node once the claim is released


@dataclass
class Driver:
    cluster: LocalCluster
    bus: Bus
    tracker: Tracker
    ready_ms: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    held: list[Held] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    decision_timeout_s: float = DECISION_TIMEOUT_S
    released_mig: dict[str, int] = field(default_factory=dict)  # released claim uid -> its MIG instances

    async def submit(self, claim: DemoClaim) -> Held | None:
        uid = str(uuid.uuid4())
        started = time.perf_counter()
        future: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        self.tracker.decisions[uid] = future
        await self.bus.publish(
            ClaimRequested(
                key=uid, producer="demo", namespace=claim.namespace, name=claim.name, uid=uid, spec=claim.spec
            )
        )
        try:
            decision = await asyncio.wait_for(future, self.decision_timeout_s)
        except TimeoutError:
            self.outcomes["undecided"] += 1
            return None
        if isinstance(decision, ClaimFailed):
            self.outcomes["failed"] += 1
            self.reasons.append(f"{claim.namespace}/{claim.name}: {decision.reason}")
            return None
        assert isinstance(decision, ClaimAllocated)
        self.outcomes["allocated"] += 1
        async with KubeletClient(self.cluster.dra_socket(decision.node)) as kubelet:
            prepared = await kubelet.prepare([ClaimHandle(claim.namespace, uid, claim.name)])
        answer = prepared[uid]
        if answer.error:
            self.outcomes["prepare_failed"] += 1
            self.reasons.append(f"{claim.namespace}/{claim.name}: prepare: {answer.error}")
        else:
            self.outcomes["ready"] += 1
            self.ready_ms.append((time.perf_counter() - started) * 1000)
        mig_instances = sum(1 for d in decision.devices if d.placement is not None and not d.admin_access)
        held = Held(claim, uid, decision.node, mig_instances)
        self.held.append(held)
        return held

    async def release(self, held: Held) -> None:
        self.held.remove(held)
        if held.mig_instances:
            self.released_mig[held.uid] = held.mig_instances
        async with KubeletClient(self.cluster.dra_socket(held.node)) as kubelet:
            await kubelet.unprepare([ClaimHandle(held.claim.namespace, held.uid, held.claim.name)])
        await self.bus.publish(
            ClaimReleased(
                key=held.uid,
                producer="demo",
                namespace=held.claim.namespace,
                name=held.claim.name,
                uid=held.uid,
                deleted=True,  # a demo claim is never asked again
            )
        )
        self.outcomes["released"] += 1

    def unsettled(self) -> int:
        """Destroys still to come: MIG instances of released claims without a destroy result."""
        tracker = self.tracker
        uncommanded = sum(max(0, n - tracker.destroys_of[uid]) for uid, n in self.released_mig.items())
        return uncommanded + len(tracker.destroy_requested - tracker.destroy_done)

    async def settle(self, timeout_s: float) -> bool:
        """Wait until every released claim's MIG instances are destroyed (or the destroy refused)."""
        return await self.tracker.wait_until(lambda: self.unsettled() == 0, timeout_s)


def _listening(path: Path) -> bool:
    """A unix socket someone accepts on (a killed plugin leaves its socket file behind)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _discovery_has_published(cluster: LocalCluster, node: str) -> bool:
    """Discovery's own log says so: its inventory may already be replaced by the partitioner's."""
    try:
        log_text = cluster.service(f"discovery@{node}").log_path.read_text(errors="replace")
    except (StopIteration, OSError):
        return False
    return '"inventory published"' in log_text


async def wait_for_cluster(
    cluster: LocalCluster, bus: Bus, tracker: Tracker, timeout_s: float = 60.0
) -> None:
    """Every node's discovery has published its inventory and every kubelet plugin is listening.

    Inventories are read from the stream (last value per node), not only from what the tracker
    saw: a node may have published before the tracker subscribed. The partitioner publishes
    inventories too, so an inventory alone does not say that discovery is up; a run that ended
    before discovery were up would stop it before it could take SIGTERM gracefully.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        dead = cluster.dead()
        if dead:
            raise RuntimeError("a service died at start: " + "; ".join(dead))
        async for _, event in bus.replay(INVENTORY_STREAM):
            if isinstance(event, NodeInventory):
                tracker.inventories.setdefault(event.hardware.node, event)
                if event.producer == f"discovery@{event.hardware.node}":
                    tracker.discovered.add(event.hardware.node)
        for node in cluster.nodes:
            if node.name not in tracker.discovered and _discovery_has_published(cluster, node.name):
                tracker.discovered.add(node.name)
        missing = [n.name for n in cluster.nodes if n.name not in tracker.discovered]
        silent = [n.name for n in cluster.nodes if not _listening(cluster.dra_socket(n.name))]
        if not missing and not silent:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"cluster not ready after {timeout_s:g}s: no discovery inventory from {missing or 'none'}, "
                f"no kubelet plugin socket on {silent or 'none'}"
            )
        await asyncio.sleep(0.2)


async def churn_until(driver: Driver, rng: random.Random, *, until: float, want_mig: bool) -> dict[str, int]:
    """Random arrivals and departures until the monotonic clock reads `until`.

    With `want_mig` (a fleet that partitions at all), the churn also goes on until it has itself
    had a MIG instance created and one destroyed: the story a short demo must still tell on a
    slow machine. MAX_CHURN_STEPS bounds it where the fleet cannot tell that story.
    """
    tracker = driver.tracker
    created, destroyed = tracker.mig_created, tracker.mig_destroyed

    def told() -> bool:
        return not want_mig or (tracker.mig_created > created and tracker.mig_destroyed > destroyed)

    steps = claims = releases = 0
    while steps < MAX_CHURN_STEPS and (time.monotonic() < until or not told()):
        steps += 1
        releasable = [h for h in driver.held if not h.claim.hold]
        if releasable and (len(releasable) > 6 or rng.random() < 0.4):
            await driver.release(rng.choice(releasable))
            releases += 1
        else:
            await driver.submit(churn(rng, steps))
            claims += 1
    return {
        "claims": claims,
        "releases": releases,
        "mig_created": tracker.mig_created - created,
        "mig_destroyed": tracker.mig_destroyed - destroyed,
    }


async def drive(
    cluster: LocalCluster,
    *,
    duration_s: float,
    seed: int,
    out: Callable[[str], None],
    watch: Callable[[Event], None] | None = None,
) -> dict[str, Any]:
    """Opening, churn for `duration_s` counted from the first claim, release of everything."""
    started = time.monotonic()
    tracker = Tracker(started=started, out=out, watch=watch)
    bus = await Bus.connect(BusConfig(servers=(cluster.url,), name="demo", producer="demo"), wait_s=10)
    subscription = await bus.nats.subscribe("tangram.>", cb=tracker.on_message)
    drained = False
    try:
        await bus.ensure_streams()
        await wait_for_cluster(cluster, bus, tracker)
        first_claim = time.monotonic()
        out(f"+{first_claim - started:7.2f}s  cluster ready; {duration_s:g} s of claims start now")
        driver = Driver(cluster, bus, tracker)
        for claim in opening():
            await driver.submit(claim)
        rng = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
        churned = await churn_until(
            driver, rng, until=first_claim + duration_s, want_mig=tracker.mig_created > 0
        )
        for held in list(driver.held):
            await driver.release(held)
        await driver.settle(SETTLE_TIMEOUT_S)
        # Everything the services published until now reaches the tracker before it is read.
        await subscription.drain()  # type: ignore[no-untyped-call]  # nats-py leaves it unannotated
        drained = True
    finally:
        if not drained:
            await subscription.unsubscribe()
        await bus.close()
    ready = sorted(driver.ready_ms)
    commands = sorted(tracker.command_ms)
    return {
        "nodes": {node.name: node.machine for node in cluster.nodes},
        "claims": sum(driver.outcomes[k] for k in ("allocated", "failed", "undecided")),
        "allocated": driver.outcomes["allocated"],
        "failed": driver.outcomes["failed"],
        "undecided": driver.outcomes["undecided"],
        "ready": driver.outcomes["ready"],
        "prepare_failed": driver.outcomes["prepare_failed"],
        "released": driver.outcomes["released"],
        "mig_created": tracker.mig_created,
        "mig_destroyed": tracker.mig_destroyed,
        "mig_destroy_refused": len(tracker.destroy_done) - tracker.mig_destroyed,
        "mig_destroy_pending": driver.unsettled(),
        "churn": churned,
        "claim_to_ready_ms": percentiles(ready),
        "partition_command_to_applied_ms": percentiles(commands),
        "events": dict(sorted(tracker.counts.items())),
        "failure_reasons": driver.reasons,
        "startup_s": round(first_claim - started, 2),
        "claims_s": round(time.monotonic() - first_claim, 2),
        "duration_s": round(time.monotonic() - started, 2),
    }


def percentiles(ordered: list[float]) -> dict[str, float | None]:
    if not ordered:
        return {"p50": None, "p99": None}
    return {
        "p50": round(percentile(ordered, 0.5), 2),
        "p99": round(percentile(ordered, 0.99), 2),
    }
