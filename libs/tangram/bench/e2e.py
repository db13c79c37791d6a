"""`tangram bench e2e`: claim -> CDI ready at a sustained rate, through every service.

The services run as processes on simulated nodes (`tangram.local.processes`) over a real
nats-server, as `tangram demo` runs them. Claims arrive open-loop at `--rate` per second for
`--duration` seconds: each is published as a ClaimRequested, decided by the allocator, partitioned
when it needs a MIG instance made, and prepared through the node's kubelet socket (real gRPC over
a unix socket, as kubelet calls it); once ready it departs at once (unprepared, released), so the
fleet holds only the claims in flight.

Reported: claim -> ready p50/p99/max, the achieved rate (ready claims per second of the arrival
window) and where the time goes, per claim:
- `publish_ms`: the request's publish until JetStream's acknowledgement;
- `decision_ms`: the request until its decision reaches the bench (consume, decide, publish, and
  the hop back); of it `allocator_ms` up to the decision's own timestamp;
- `partition_ms`: the decision until the node reports its MIG instance made (claims that wait
  for one);
- `prepare_rpc_ms`: the kubelet call; of it `prepare_ms` the preparer's own time (the checkpoint's
  and the spec's fsyncs included), from the node's ClaimPrepared.

`cpu_ms_per_claim` is where the machine's CPU goes: each kind of process's CPU time (all nodes'
processes of the kind together, and the bench's own client) from the first arrival until the last
claim is done, per claim; `cpu_cores_busy` is that CPU time over those seconds.

The baseline in the same run is the bus floor: the same rate of events through the same server,
each timed from its publish until a subscriber sees it (one hop; a claim makes at least four).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tangram.bench.pacing import pace
from tangram.bus import Bus, BusConfig
from tangram.demo.driver import Tracker, wait_for_cluster
from tangram.demo.scenario import mig, whole_gpus
from tangram.events import (
    ClaimAllocated,
    ClaimFailed,
    ClaimPrepared,
    ClaimReleased,
    ClaimRequested,
    Event,
    PartitionApplied,
)
from tangram.kubelet.client import ClaimHandle, KubeletClient
from tangram.local.processes import LocalCluster, SimNode
from tangram.stats import percentiles

TARGET_P99_MS = 50.0
DECISION_TIMEOUT_S = 30.0
NAMESPACE = "bench"
MIXES = ("gpu", "mig", "mixed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=float, default=200.0, help="claims arriving per second")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of arrivals")
    parser.add_argument("--nodes", type=int, default=4, help="simulated nodes")
    parser.add_argument("--machine", default="hgx-h200", help="the nodes' simulated machine")
    parser.add_argument(
        "--mix",
        choices=MIXES,
        default="gpu",
        help="gpu: one whole GPU each; mig: a 1g MIG instance each; mixed: half and half",
    )
    parser.add_argument("--seed", type=int, default=1, help="the mix's random choices")


def summary(samples_ms: Sequence[float]) -> dict[str, float | int]:
    if not samples_ms:
        return {"count": 0}
    return {"count": len(samples_ms), **percentiles(samples_ms), "max_ms": round(max(samples_ms), 3)}


@dataclass
class Timeline:
    """One claim's moments, on the monotonic clock, and the preparer's own time."""

    requested: float
    requested_at: float  # the wall clock, to compare with the decision's own timestamp
    published: float | None = None
    decided: float | None = None
    allocator_ms: float | None = None
    waits_for_partition: bool = False
    partitioned: float | None = None
    prepare_started: float | None = None
    ready: float | None = None
    prepare_ms: float | None = None


@dataclass
class Run:
    bus: Bus
    tracker: Tracker
    kubelets: dict[str, KubeletClient]
    claims: dict[str, Timeline] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)

    def watch(self, event: Event) -> None:
        now = time.monotonic()
        match event:
            case PartitionApplied(action="create", claim_uid=uid) if uid in self.claims:
                self.claims[uid].partitioned = now
            case ClaimPrepared(uid=uid, duration_ms=duration) if uid in self.claims:
                self.claims[uid].prepare_ms = duration
            case _:
                pass

    async def one_claim(self, number: int, spec: dict[str, Any]) -> None:
        uid = str(uuid.uuid4())
        name = f"claim-{number}"
        line = Timeline(requested=time.monotonic(), requested_at=time.time())
        self.claims[uid] = line
        decided: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        self.tracker.decisions[uid] = decided
        try:
            await self.bus.publish(
                ClaimRequested(key=uid, producer="bench", namespace=NAMESPACE, name=name, uid=uid, spec=spec)
            )
            line.published = time.monotonic()
            decision = await asyncio.wait_for(decided, DECISION_TIMEOUT_S)
        except TimeoutError:
            self.outcomes["undecided"] += 1
            return
        finally:
            self.tracker.decisions.pop(uid, None)
        line.decided = time.monotonic()
        if isinstance(decision, ClaimFailed):
            self.outcomes["failed"] += 1
            self.reasons[decision.reason[:120]] += 1
            return
        assert isinstance(decision, ClaimAllocated)
        # the decision's timestamp is the allocator's: from the request to it is the allocator's share
        line.allocator_ms = (decision.time.timestamp() - line.requested_at) * 1000
        line.waits_for_partition = bool(decision.partitions)
        handle = ClaimHandle(NAMESPACE, uid, name)
        kubelet = self.kubelets[decision.node]
        line.prepare_started = time.monotonic()
        # kubelet calls only once the pod is scheduled; the preparer itself waits for the partition
        answer = (await kubelet.prepare([handle]))[uid]
        if answer.error:
            self.outcomes["prepare_failed"] += 1
            self.reasons[answer.error[:120]] += 1
        else:
            line.ready = time.monotonic()
            self.outcomes["ready"] += 1
        await kubelet.unprepare([handle])
        await self.bus.publish(
            ClaimReleased(key=uid, producer="bench", namespace=NAMESPACE, name=name, uid=uid, deleted=True)
        )


def _spec(mix: str, rng: random.Random) -> dict[str, Any]:
    kind = mix if mix != "mixed" else rng.choice(["gpu", "mig"])
    return whole_gpus(1) if kind == "gpu" else mig("1g.")


async def _arrivals(run: Run, rate: float, duration_s: float, mix: str, seed: int) -> float:
    """Claims started on schedule (open loop: a slow claim never delays the next arrival); the
    seconds the arrivals took."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible mix, not a secret
    interval = 1.0 / rate
    started = time.perf_counter()
    tasks: list[asyncio.Task[None]] = []
    number = 0
    while number * interval < duration_s:
        await pace(started, number, interval)
        tasks.append(asyncio.create_task(run.one_claim(number, _spec(mix, rng))))
        number += 1
    window = time.perf_counter() - started
    await asyncio.gather(*tasks)
    return window


async def _bus_floor(bus: Bus, rate: float, count: int) -> list[float]:
    """Publish -> seen by a core subscriber, at the same rate, on the same server."""
    seen: dict[str, float] = {}
    arrived = asyncio.Event()

    async def on_message(msg: Any) -> None:
        seen[msg.header.get("Nats-Msg-Id", "") if msg.header else ""] = time.monotonic()
        if len(seen) >= count:
            arrived.set()

    subject = f"bench.floor.{uuid.uuid4().hex}"
    subscription = await bus.nats.subscribe(subject, cb=on_message)
    sent: dict[str, float] = {}
    started = time.perf_counter()
    for n in range(count):
        await pace(started, n, 1.0 / rate)
        key = f"{n}"
        sent[key] = time.monotonic()
        await bus.nats.publish(subject, b"{}", headers={"Nats-Msg-Id": key})
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(arrived.wait(), 30)
    await subscription.unsubscribe()
    return [(seen[key] - sent[key]) * 1000 for key in sent if key in seen]


def _stages(claims: Sequence[Timeline]) -> dict[str, Any]:
    def ms(pairs: Sequence[tuple[float | None, float | None]]) -> list[float]:
        return [(end - start) * 1000 for start, end in pairs if start is not None and end is not None]

    return {
        "publish_ms": summary(ms([(c.requested, c.published) for c in claims])),
        "decision_ms": summary(ms([(c.requested, c.decided) for c in claims])),
        "allocator_ms": summary([c.allocator_ms for c in claims if c.allocator_ms is not None]),
        "partition_ms": summary(ms([(c.decided, c.partitioned) for c in claims if c.waits_for_partition])),
        "prepare_rpc_ms": summary(ms([(c.prepare_started, c.ready) for c in claims])),
        "prepare_ms": summary([c.prepare_ms for c in claims if c.prepare_ms is not None and c.ready]),
    }


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    nodes = [SimNode(f"node-{n + 1}", args.machine) for n in range(args.nodes)]
    cluster = LocalCluster(nodes)
    try:
        cluster.start()
        tracker = Tracker(started=time.monotonic(), out=lambda _: None)
        bus = await Bus.connect(
            BusConfig(servers=(cluster.url,), name="bench-e2e", producer="bench"), wait_s=10
        )
        subscription = await bus.nats.subscribe("tangram.>", cb=tracker.on_message)
        try:
            await bus.ensure_streams()
            await wait_for_cluster(cluster, bus, tracker)
            kubelets = {node.name: KubeletClient(cluster.dra_socket(node.name)) for node in nodes}
            run = Run(bus, tracker, kubelets)
            tracker.watch = run.watch
            load_before = os.getloadavg()[0]
            cpu_before, began = _cpu_seconds(cluster), time.perf_counter()
            window = await _arrivals(run, args.rate, args.duration, args.mix, args.seed)
            cpu, busy_s = _cpu_used(cpu_before, _cpu_seconds(cluster)), time.perf_counter() - began
            load_after = os.getloadavg()[0]
            floor = await _bus_floor(bus, args.rate, min(len(run.claims), int(args.rate * 10)))
            for kubelet in kubelets.values():
                await kubelet.close()
        finally:
            await subscription.unsubscribe()
            await bus.close()
        dead = cluster.dead()
    finally:
        cluster.stop()
        shutil.rmtree(cluster.workdir, ignore_errors=True)
    claims = list(run.claims.values())
    ready = [(c.ready - c.requested) * 1000 for c in claims if c.ready is not None]
    latency = summary(ready)
    floor_summary = summary(floor)
    result: dict[str, Any] = {
        "benchmark": "e2e",
        "rate": args.rate,
        "duration_s": args.duration,
        "nodes": args.nodes,
        "machine": args.machine,
        "mix": args.mix,
        "claims": len(claims),
        "outcomes": dict(run.outcomes),
        "waited_for_a_partition": sum(1 for c in claims if c.waits_for_partition),
        "achieved_rate": round(len(ready) / window, 2) if window else 0.0,
        "claim_to_ready": latency,
        "stages": _stages(claims),
        "bus_floor": floor_summary,
        "target_p99_ms": TARGET_P99_MS,
        "load_average": {"before": round(load_before, 2), "after": round(load_after, 2)},
        "cpu_ms_per_claim": {
            kind: round(seconds * 1000 / len(claims), 3) if claims else 0.0 for kind, seconds in cpu.items()
        },
        "cpu_cores_busy": round(cpu["total"] / busy_s, 2),
    }
    if ready and floor:
        result["p50_over_bus_floor"] = round(float(latency["p50_ms"]) / float(floor_summary["p50_ms"]), 1)
    if run.reasons:
        result["reasons"] = dict(run.reasons.most_common(5))
    if dead:
        result["services_died"] = dead
    return result


def _cpu_seconds(cluster: LocalCluster) -> dict[str, float]:
    return cluster.cpu_seconds() | {"bench": time.process_time()}


def _cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds per kind of process between two readings, and their total."""
    used = {kind: max(0.0, after[kind] - before.get(kind, 0.0)) for kind in sorted(after)}
    return used | {"total": sum(used.values())}


def run(args: argparse.Namespace) -> int:
    if args.rate <= 0 or args.duration <= 0 or args.nodes < 1:
        raise SystemExit("tangram bench e2e: --rate, --duration and --nodes must be positive")
    print(json.dumps(asyncio.run(_bench(args))))
    return 0
