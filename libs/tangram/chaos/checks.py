"""The checks after a chaos run: the logs settled, the invariants (`tangram.chaos.invariants`)
applied to them, to the nodes and to the allocator's state, and the run's report."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from typing import Any

import nats.errors
import nats.js.errors

from tangram.allocation import DeviceClass, FleetState
from tangram.allocation.ledger import Ledger
from tangram.bus import Bus, allocator_consumer, allocator_results_consumer
from tangram.chaos.config import ChaosConfig
from tangram.chaos.faults import FAULT_KINDS
from tangram.chaos.invariants import (
    claim_stories,
    dead_lettered_ids,
    leaked_instances,
    live_claims,
    overlapping_allocations,
    settle_claims,
    state_differences,
    unanswered_commands,
    undead_lettered,
)
from tangram.chaos.nodes import NodeView
from tangram.chaos.workload import Observed
from tangram.eventlog.rebuild import rebuild_ledger
from tangram.events import CLAIMS_STREAM, DEADLETTER_STREAM, NODES_STREAM, Event
from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes
from tangram.local.processes import LocalCluster


class ChaosChecks:
    """What a run left, checked: `instances_before` are the MIG instances each node had when the
    claims began."""

    def __init__(
        self,
        cluster: LocalCluster,
        config: ChaosConfig,
        bus: Bus,
        *,
        seen: Observed,
        nodes: NodeView,
        instances_before: dict[str, set[str]],
    ) -> None:
        self.cluster = cluster
        self.config = config
        self.bus = bus
        self.seen = seen
        self.nodes = nodes
        self.instances_before = instances_before

    async def report(self, *, completed: bool) -> dict[str, Any]:
        """The report of the run; `completed`: every claim asked for was begun."""
        letters = await self._settled_dead_letters()
        refused = dead_lettered_ids(letters)
        node_log = await self._settled_node_log(refused)
        log = [event async for _, event in self.bus.replay(CLAIMS_STREAM)]
        stories = claim_stories(log)
        driven = self.seen.driven
        outcomes, problems = settle_claims(
            stories, driven=driven, prepared=self.seen.prepared, held=self.seen.held
        )
        for kind, lines in self.seen.problems.items():
            problems.setdefault(kind, []).extend(lines)
        problems["slice_held_twice"] = overlapping_allocations(log)
        problems["partition_unanswered"] = unanswered_commands(node_log, refused)
        present = {node.name: self.nodes.mig_uuids(node) for node in self.config.nodes}
        live = live_claims(stories)
        leaked, missing = leaked_instances(
            present, self.instances_before, node_log, live, warm={}, reused=self.nodes.reused_instances(live)
        )
        problems["instance_leaked"] = leaked
        problems["live_instance_missing"] = missing
        on_disk = {uid for node in self.config.nodes for uid in self.nodes.cdi_uids(node.name)}
        problems["cdi_mismatch"] = [
            f"spec without prepared claim: {u}" for u in sorted(on_disk - self.seen.held)
        ] + [f"prepared claim without spec: {u}" for u in sorted(self.seen.held - on_disk)]
        problems["allocator_state_differs_from_replay"] = await self._compare_allocator()
        stored_ids = {event.event_id for event in log} | {event.event_id for event in node_log}
        problems["acknowledged_lost"] = [
            what for event_id, what in self.seen.acked.items() if event_id not in stored_ids
        ]
        problems["malformed_not_dead_lettered"] = undead_lettered(self.seen.must_dead_letter, letters)
        problems["service_died"] = list(dict.fromkeys(self.seen.dead_services))
        violations = {kind: len(lines) for kind, lines in sorted(problems.items()) if lines}
        return {
            "claims": len(driven),
            "seed": self.config.seed,
            "completed": completed,
            "nodes": {node.name: node.machine for node in self.config.nodes},
            "nats_servers": self.config.nats_servers,
            "stream_replicas": self.cluster.stream_replicas,
            "outcomes": dict(sorted(outcomes.items())),
            "faults": {kind: self.seen.faults[kind] for kind in FAULT_KINDS},
            "violations": violations,
            "violation_examples": {kind: problems[kind][:5] for kind in violations},
            "dead_letters": len(letters),
            "events": {"claims_log": len(log), "nodes_log": len(node_log)},
        }

    async def _settled_dead_letters(self, timeout_s: float = 60.0) -> list[Event]:
        """The dead letters once every injected bad message has one (or the time is up): the last
        fault may land just before the checks, on a consumer a kill had just restarted."""
        deadline = time.monotonic() + timeout_s
        while True:
            letters = [event async for _, event in self.bus.replay(DEADLETTER_STREAM)]
            if not undead_lettered(self.seen.must_dead_letter, letters) or time.monotonic() > deadline:
                return letters
            await asyncio.sleep(0.5)

    async def _allocator_drained(self, timeout_s: float) -> None:
        """Until the allocator has acknowledged every claim event and partition result (or the time
        is up): a release it must act on may still wait for redelivery to a restarted allocator."""
        deadline = time.monotonic() + timeout_s
        specs = (allocator_consumer(), allocator_results_consumer())
        while time.monotonic() < deadline:
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, TimeoutError):
                infos = [await self.bus.jetstream.consumer_info(spec.stream, spec.durable) for spec in specs]
                if all(info.num_pending == 0 and info.num_ack_pending == 0 for info in infos):
                    return
            await asyncio.sleep(0.5)

    async def _settled_node_log(self, refused: set[str], timeout_s: float = 180.0) -> list[Event]:
        """The node log once the allocator has acted on everything and every partition command has
        its result (or the time is up)."""
        deadline = time.monotonic() + timeout_s
        await self._allocator_drained(timeout_s)
        while True:
            node_log = [event async for _, event in self.bus.replay(NODES_STREAM)]
            if not unanswered_commands(node_log, refused) or time.monotonic() > deadline:
                return node_log
            await asyncio.sleep(0.5)

    async def _compare_allocator(self, timeout_s: float = 60.0) -> list[str]:
        """The leader's state, read from its /state, against a ledger rebuilt from the log here;
        asked again while they differ, as the leader may still be folding the last events."""
        deadline = time.monotonic() + timeout_s
        while True:
            replayed = await self._replayed_ledger()
            try:
                live = await asyncio.to_thread(get_json, f"http://127.0.0.1:{self._allocator_port()}/state")
                differences = state_differences(live, json.loads(json.dumps(replayed)))
            except (OSError, ValueError) as exc:
                differences = [f"the allocator's state cannot be read: {exc}"]
            if not differences or time.monotonic() > deadline:
                return differences
            await asyncio.sleep(1.0)

    async def _replayed_ledger(self) -> dict[str, Any]:
        rebuilt = await rebuild_ledger(
            self.bus, lambda: Ledger(fleet=FleetState(), classes=device_classes()), use_image=False
        )
        return rebuilt.ledger.snapshot()

    def _allocator_port(self) -> int:
        port = None
        for line in self.cluster.service("allocator").log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("message") == "service starting":
                    port = int(record["health_port"])
        if port is None:
            raise ValueError("the allocator has not logged its health port")
        return port


def device_classes() -> dict[str, DeviceClass]:
    classes = (DeviceClass.from_manifest(m) for m in load_shipped_device_classes())
    return {device_class.name: device_class for device_class in classes}


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - a loopback URL built here
        return json.loads(response.read())
