"""`tangram bench rebuild`: the allocator's cold restart, its state folded again from the JetStream log.

The log is made the way production makes it: node inventories, then claim requests decided by a
live Ledger, its decisions and the claims' deletions (one request or deletion every
`--claim-event-every` seconds, so that deleted claims are forgotten as they are in production), and
on the nodes stream its partition commands, each carried out at once, all published to an embedded
nats-server. A fresh
Ledger then folds the inventory stream and the claims stream in that order (as the allocator
service's `rebuild` does). Three figures: the fold alone (events already decoded in memory),
replay + fold, and the bus floor (replay without folding). Then a restart from a ledger image taken
at `--image-at` of the claims log, as a start writes one: the image restored and only the log
after it folded (`eventlog.rebuild`). A fourth is a node's side of a restart:
its services follow the fleet's claim decisions from the start of the log (they follow, never
replay, so that they go on reading live events), against the same bus floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec

from tangram.allocation import FleetState
from tangram.allocation.image import LogMark
from tangram.allocation.ledger import Ledger
from tangram.bench.traces import FLEET_MIX, Arrival, build_fleet, churn_trace, claim_spec, mean_demand
from tangram.bus import Bus, BusConfig
from tangram.bus.declarations import node_claim_sources
from tangram.bus.replay import collector_paused
from tangram.eventlog.rebuild import (
    IMAGE_STREAMS,
    fold_read,
    image_bytes,
    rebuild_ledger,
    replay_log,
    store_image,
)
from tangram.events import (
    CLAIMS_STREAM,
    INVENTORY_STREAM,
    NODES_STREAM,
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    ClaimRequested,
    Event,
    NodeInventory,
    PartitionApplied,
    PartitionRequested,
    subject_token,
)
from tangram.local.natsserver import NatsServer

TARGET_EVENTS_PER_S = 50_000.0
LOG_START = datetime(2026, 1, 1, tzinfo=UTC)
CHUNK = 1000
FOLLOW_TIMEOUT_S = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--claims", type=int, default=20_000, help="claim requests in the log")
    parser.add_argument("--nodes", type=int, default=100, help="nodes whose inventories are in the log")
    parser.add_argument("--machine", default="hgx-h200")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--load", type=float, default=0.75, help="share of the fleet the live claims ask for")
    parser.add_argument("--nats-url", default=None, help="use this server instead of an embedded one")
    parser.add_argument(
        "--image-at",
        type=float,
        default=0.9,
        help="share of the claims log the ledger image was taken at, for the restart from it",
    )
    parser.add_argument(
        "--claim-event-every",
        type=float,
        default=30.0,
        help="seconds between two claim requests or deletions in the log (the claim source's clock: "
        "a deleted claim is forgotten an hour after its deletion)",
    )


@dataclass
class BenchLog:
    """The allocator's log as production writes it, and the live ledger that wrote it."""

    inventory: list[Event]
    claims: list[Event]  # the claims stream: requests and deletions, and the decisions on them
    nodes: list[Event]  # the nodes stream: partition commands, each answered at once by its node
    # after each event of the claims stream, how long the nodes stream was: where an image taken
    # there stands in it
    nodes_at: list[int]
    live: Ledger

    def results(self, up_to: int) -> list[tuple[int, Event]]:
        """The nodes stream's results (what the allocator reads of it) up to `up_to`, by sequence."""
        return [
            (seq, event)
            for seq, event in enumerate(self.nodes[:up_to], 1)
            if not isinstance(event, PartitionRequested)
        ]


def make_log(
    machine: str, nodes: int, claims: int, seed: int, load: float, *, every_s: float = 30.0
) -> BenchLog:
    """The log of a churn of `claims` claims on `nodes` nodes of `machine`, deleted when they end,
    one request or deletion every `every_s` seconds; every partition command is carried out."""
    from tangram.bench.traces import shipped_classes  # noqa: PLC0415

    hardware = build_fleet([(machine, nodes)])
    inventory: list[Event] = [
        NodeInventory(key=subject_token(hw.node), producer="discovery", hardware=hw, generation=1)
        for hw in hardware
    ]
    live = Ledger(FleetState(), shipped_classes())
    for inventory_event in inventory:
        live.observe(inventory_event)
    gpus = sum(len(hw.gpus) for hw in hardware)
    log = BenchLog(inventory=inventory, claims=[], nodes=[], nodes_at=[], live=live)
    specs: dict[str, dict[str, Any]] = {}
    made = 0
    for n, op in enumerate(churn_trace(seed, claims, load * gpus / mean_demand(FLEET_MIX), FLEET_MIX)):
        at = LOG_START + timedelta(seconds=n * every_s)
        if isinstance(op, Arrival):
            spec = specs.setdefault(op.shape.label, claim_spec(op.shape))
            event: Event = ClaimRequested(
                key=op.uid, producer="controller", namespace="bench", name=op.uid, uid=op.uid,
                spec=spec, time=at,
            )  # fmt: skip
        else:
            event = ClaimReleased(
                key=op.uid, producer="controller", namespace="bench", name=op.uid, uid=op.uid,
                deleted=True, time=at,
            )  # fmt: skip
        outputs = live.apply(event)
        for decided in [event, *(e for e in outputs if e.stream == CLAIMS_STREAM)]:
            log.claims.append(decided)
            log.nodes_at.append(len(log.nodes))
        commands = [e for e in outputs if isinstance(e, PartitionRequested)]
        log.nodes.extend(commands)
        for command in commands:
            made += command.action == "create"
            result = _carried_out(command, f"MIG-bench-{made}" if command.action == "create" else "")
            log.nodes.append(result)
            live.folded(NODES_STREAM, len(log.nodes))
            live.apply(result)
    return log


def _carried_out(command: PartitionRequested, made: str) -> PartitionApplied:
    """The node's answer: the command done (a create naming the instance it made)."""
    return PartitionApplied(
        key=command.key, producer="partitioner", command_id=command.command_id, node=command.node,
        action=command.action, gpu_uuid=command.gpu_uuid, gpu_index=command.gpu_index,
        profile=command.profile, placement=command.placement, claim_uid=command.claim_uid,
        mig_uuid=made or command.mig_uuid,
    )  # fmt: skip


def _kept(event: Event) -> Event:
    """The event as a source that never deletes its claims would have sent it."""
    return msgspec.structs.replace(event, deleted=False) if isinstance(event, ClaimReleased) else event


def fold(ledger: Ledger, events: list[Event]) -> None:
    """The fold of the allocator's replay (`replay_into`), on events already decoded."""
    with collector_paused():
        for event in events:
            ledger.apply(event, live=False)


async def _replay(bus: Bus, each: Callable[[Event], object]) -> int:
    """The allocator's own start-up replay of the whole log (`eventlog.rebuild.replay_log`)."""
    return await replay_log(bus, each)


async def _follow_decisions(bus: Bus, decisions: int) -> int:
    """A node's services catching up on the claims stream: they follow what `node_claim_sources`
    names there, until every decision in the log has been handed to them."""
    (stream, subjects), *_ = node_claim_sources("bench")
    seen = 0
    stop = asyncio.Event()

    def each(_: Event) -> None:
        nonlocal seen
        seen += 1
        if seen >= decisions:
            stop.set()

    follow = bus.follow(stream, subjects, each, stop=stop)
    try:
        await asyncio.wait_for(follow, FOLLOW_TIMEOUT_S)
    except TimeoutError:
        raise ValueError(
            f"following the decisions stalled: {seen} of {decisions} in {FOLLOW_TIMEOUT_S:g} s"
        ) from None
    return seen


def _rate(events: int, seconds: float) -> float:
    return round(events / seconds, 1) if seconds > 0 else 0.0


def _folded_in_order(log: BenchLog, claims: int, nodes: int, *, keep_every_claim: bool = False) -> Ledger:
    """A ledger of the inventories and the first `claims` and `nodes` events of the two streams,
    folded in the rebuild's order: what a start that rebuilt there held."""
    from tangram.bench.traces import shipped_classes  # noqa: PLC0415

    ledger = Ledger(FleetState(), shipped_classes())
    fold(ledger, log.inventory)
    claims_read = [(seq, _kept(e) if keep_every_claim else e) for seq, e in enumerate(log.claims[:claims], 1)]
    asyncio.run(fold_read(ledger, claims_read, log.results(nodes)))
    return ledger


async def _from_image(bus: Bus, log: BenchLog, image_at: float) -> dict[str, Any]:
    """A restart from the image a start wrote when the log was `image_at` of what it is now: the
    image's ledger is the fold of the log up to there, as that start rebuilt it."""
    from tangram.bench.traces import shipped_classes  # noqa: PLC0415

    classes = shipped_classes()
    taken = int(len(log.claims) * image_at)
    nodes = log.nodes_at[taken - 1] if taken else 0
    # folded apart from the event loop, as the allocator takes its image
    imaged = await asyncio.to_thread(_folded_in_order, log, taken, nodes)
    marks = {}
    for stream in IMAGE_STREAMS:
        extent = await bus.stream_extent(stream)
        sequence = {CLAIMS_STREAM: taken, NODES_STREAM: nodes}.get(stream, extent.last_seq)
        marks[stream] = LogMark(sequence=sequence, created=extent.created)
    started = time.perf_counter()
    data = image_bytes(imaged, marks)
    take_s = time.perf_counter() - started
    # the same image had the ledger kept every claim it ever decided (none of them deleted)
    keeping = await asyncio.to_thread(_folded_in_order, log, taken, nodes, keep_every_claim=True)
    kept_bytes = len(image_bytes(keeping, marks))
    started = time.perf_counter()
    await store_image(bus, data)
    write_s = time.perf_counter() - started
    started = time.perf_counter()
    rebuilt = await rebuild_ledger(bus, lambda: Ledger(FleetState(), classes))
    rebuild_s = time.perf_counter() - started
    if not rebuilt.from_image:
        raise ValueError(f"the image was not restored: {rebuilt.set_aside}")
    results = len(log.results(len(log.nodes)))
    total = len(log.inventory) + len(log.claims) + results
    return {
        "image_at": image_at,
        "image_bytes": len(data),
        "claims_remembered": len(imaged.decided),
        "image_bytes_keeping_every_claim": kept_bytes,
        "claims_remembered_keeping_every_claim": len(keeping.decided),
        "image_ratio_to_keeping": round(len(data) / kept_bytes, 3) if kept_bytes else None,
        "take_seconds": round(take_s, 3),
        "store_seconds": round(write_s, 3),
        "rebuild_seconds": round(rebuild_s, 3),
        "events_folded": rebuilt.events,
        # what the log holds after the image, the inventories folded whole besides
        "log_after_image": {
            "claims": len(log.claims) - taken,
            "node_results": results - len(log.results(nodes)),
        },
        "log_events_per_s": _rate(total, rebuild_s),
        "state_matches_live": rebuilt.ledger.fleet.snapshot() == log.live.fleet.snapshot()
        and rebuilt.ledger.decided == log.live.decided,
    }


async def _measure(bus: Bus, log: BenchLog) -> dict[str, Any]:
    from tangram.bench.traces import shipped_classes  # noqa: PLC0415

    live = log.live
    started = time.perf_counter()
    for events in (log.inventory, log.claims, log.nodes):
        for offset in range(0, len(events), CHUNK):
            await bus.publish_batch(events[offset : offset + CHUNK])
    publish_s = time.perf_counter() - started

    classes = shipped_classes()
    started = time.perf_counter()
    floor_events = await _replay(bus, lambda _: None)
    floor_s = time.perf_counter() - started

    rebuilt = Ledger(FleetState(), classes)
    started = time.perf_counter()
    replay_events = await _replay(bus, lambda e: rebuilt.apply(e, live=False))
    replay_fold_s = time.perf_counter() - started

    decoded: list[Event] = []
    await _replay(bus, decoded.append)
    alone = Ledger(FleetState(), classes)
    started = time.perf_counter()
    fold(alone, [e for e in decoded if e.stream == INVENTORY_STREAM])
    inventory_fold_s = time.perf_counter() - started
    started = time.perf_counter()
    fold(alone, [e for e in decoded if e.stream != INVENTORY_STREAM])  # in the rebuild's order
    claims_fold_s = time.perf_counter() - started
    fold_s = inventory_fold_s + claims_fold_s

    decisions = sum(isinstance(e, ClaimAllocated | ClaimFailed | ClaimReleased) for e in log.claims)
    started = time.perf_counter()
    followed = await _follow_decisions(bus, decisions)
    follow_s = time.perf_counter() - started

    total = replay_events
    follow_rate = _rate(followed, follow_s)
    fold_rate = _rate(total, fold_s)
    replay_rate = _rate(replay_events, replay_fold_s)
    floor_rate = _rate(floor_events, floor_s)
    return {
        "published_events_per_s": _rate(len(log.inventory) + len(log.claims) + len(log.nodes), publish_s),
        "replayed_events": replay_events,
        "fold": {
            "events_per_s": fold_rate,
            "seconds": round(fold_s, 3),
            "inventory_events_per_s": _rate(len(log.inventory), inventory_fold_s),
            "claims_events_per_s": _rate(total - len(log.inventory), claims_fold_s),
        },
        "replay_and_fold": {"events_per_s": replay_rate, "seconds": round(replay_fold_s, 3)},
        "bus_floor": {"events_per_s": floor_rate, "seconds": round(floor_s, 3)},
        "node_follows_decisions": {
            "events": followed,
            "events_per_s": follow_rate,
            "seconds": round(follow_s, 3),
        },
        "ratios": {
            "node_follows_decisions/bus_floor": round(follow_rate / floor_rate, 3) if floor_rate else None,
            "replay_and_fold/bus_floor": round(replay_rate / floor_rate, 3) if floor_rate else None,
            "fold/bus_floor": round(fold_rate / floor_rate, 3) if floor_rate else None,
        },
        "state_matches_live": rebuilt.fleet.snapshot() == live.fleet.snapshot()
        and alone.fleet.snapshot() == live.fleet.snapshot()
        and rebuilt.decided == live.decided,
        "meets_target": replay_rate >= TARGET_EVENTS_PER_S,
    }


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    log = make_log(
        args.machine, args.nodes, args.claims, args.seed, args.load, every_s=args.claim_event_every
    )
    counts = {
        kind.__name__: sum(isinstance(e, kind) for e in log.claims)
        for kind in (ClaimRequested, ClaimAllocated, ClaimFailed, ClaimReleased)
    }
    nodes_counts = {
        kind.__name__: sum(isinstance(e, kind) for e in log.nodes)
        for kind in (PartitionRequested, PartitionApplied)
    }
    with tempfile.TemporaryDirectory(prefix="tangram-bench-") as store:
        server = None if args.nats_url else NatsServer(Path(store)).start()
        url = args.nats_url or server.url  # type: ignore[union-attr]  # one of the two is set
        try:
            bus = await Bus.connect(BusConfig(servers=(url,), name="bench-rebuild", producer="allocator"))
            try:
                await bus.ensure_streams()
                figures = await _measure(bus, log)
                figures["from_image"] = await _from_image(bus, log, args.image_at)
            finally:
                await bus.close()
        finally:
            if server is not None:
                server.stop()
    return {
        "benchmark": "rebuild",
        "machine": args.machine,
        "nodes": args.nodes,
        "claims": args.claims,
        "seed": args.seed,
        "claim_event_every_s": args.claim_event_every,
        "events": {
            "NodeInventory": len(log.inventory),
            **counts,
            **nodes_counts,
            # what the allocator replays: all but the partition commands, which it sends and never reads
            "total": len(log.inventory) + len(log.claims) + nodes_counts["PartitionApplied"],
        },
        "target_events_per_s": TARGET_EVENTS_PER_S,
        **figures,
    }


def run(args: argparse.Namespace) -> int:
    if (
        args.claims < 1
        or args.nodes < 1
        or not 0 < args.load <= 2
        or not 0 <= args.image_at <= 1
        or args.claim_event_every <= 0
    ):
        print(
            "tangram bench rebuild: --claims, --nodes and --claim-event-every must be positive, "
            "--load in (0, 2], --image-at in [0, 1]",
            file=sys.stderr,
        )
        return 2
    try:
        result = asyncio.run(_run(args))
    except (ValueError, OSError) as error:
        print(f"tangram bench rebuild: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0
