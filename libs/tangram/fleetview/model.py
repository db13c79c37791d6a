"""The fleet as the bus tells it: nodes, each GPU's MIG instances and who holds them, claims and their states.

Pure: a fold over events, order-tolerant across streams (the inventory, claim and node streams are
followed separately), so it serves a one-off status read and a live view alike.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any, Literal

import msgspec

from tangram.events import (
    AllocatedDevice,
    ClaimAllocated,
    ClaimFailed,
    ClaimPrepared,
    ClaimReleased,
    ClaimRequested,
    ClaimUnprepared,
    DeadLetter,
    DeviceHealthChanged,
    Event,
    NodeInventory,
    PartitionApplied,
    PartitionFailed,
    PartitionRequested,
)
from tangram.events.inventory import GpuInfo, NodeHardware

ClaimState = Literal["pending", "allocated", "ready", "failed", "released"]
CLAIM_STATES: tuple[ClaimState, ...] = ("pending", "allocated", "ready", "failed", "released")


class ClaimView(msgspec.Struct, kw_only=True):
    uid: str
    namespace: str = ""
    name: str = ""
    state: ClaimState = "pending"
    node: str | None = None
    devices: list[AllocatedDevice] = []
    partitions: list[str] = []  # command ids the allocation waits for
    reason: str | None = None
    requested_at: datetime | None = None
    decided_at: datetime | None = None
    partition_applied_at: datetime | None = None  # the last of its commands applied
    prepared_at: datetime | None = None
    released_at: datetime | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.name else self.uid


class GpuUse(msgspec.Struct, frozen=True, kw_only=True):
    """Who holds what on one GPU: the whole GPU, or MIG instances by their first memory slice."""

    whole: str | None = None  # the claim holding the whole GPU
    instances: dict[int, str] = {}  # placement start -> claim holding the instance there
    warm: list[int] = []  # starts of instances that exist with no claim (kept warm or leaking)


class ServiceHealth(msgspec.Struct, frozen=True):
    name: str
    state: str  # ok | stale | down | unknown
    detail: str


class NodeView(msgspec.Struct, kw_only=True):
    hardware: NodeHardware
    inventory_at: datetime
    unhealthy: dict[str, str] = {}  # GPU uuid -> reason, from health events


class FleetView:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeView] = {}
        self.claims: dict[str, ClaimView] = {}
        self.commands: dict[str, PartitionRequested] = {}
        self.results: dict[str, PartitionApplied | PartitionFailed] = {}
        self.dead_letters: Counter[str] = Counter()  # consumer -> messages dead-lettered
        self.events = 0
        self.last_event_at: datetime | None = None

    def claim(self, uid: str) -> ClaimView:
        view = self.claims.get(uid)
        if view is None:
            view = self.claims[uid] = ClaimView(uid=uid)
        return view

    def apply(self, event: Event) -> None:
        self.events += 1
        if self.last_event_at is None or event.time > self.last_event_at:
            self.last_event_at = event.time
        match event:
            case NodeInventory(hardware=hw):
                old = self.nodes.get(hw.node)
                if old is None or event.time >= old.inventory_at:
                    self.nodes[hw.node] = NodeView(
                        hardware=hw, inventory_at=event.time, unhealthy=old.unhealthy if old else {}
                    )
            case ClaimRequested():
                view = self._named(event.uid, event.namespace, event.name)
                view.requested_at = event.time
            case ClaimAllocated():
                view = self._named(event.uid, event.namespace, event.name)
                view.node, view.devices, view.partitions = event.node, list(event.devices), event.partitions
                view.decided_at = event.time
                if view.state == "pending":
                    view.state = "allocated"
                self._partition_progress(view)
            case ClaimFailed():
                view = self._named(event.uid, event.namespace, event.name)
                view.reason = event.reason
                view.decided_at = view.decided_at or event.time
                if view.state != "released":
                    view.state = "failed"
            case ClaimReleased():
                view = self._named(event.uid, event.namespace, event.name)
                view.state, view.released_at = "released", event.time
            case ClaimPrepared():
                view = self._named(event.uid, event.namespace, event.name)
                view.prepared_at = event.time
                if view.state in ("pending", "allocated"):
                    view.state = "ready"
            case ClaimUnprepared():
                view = self._named(event.uid, event.namespace, event.name)
                if view.state == "ready":
                    view.state = "allocated"
            case PartitionRequested():
                self.commands[event.command_id] = event
            case PartitionApplied() | PartitionFailed():
                self.results[event.command_id] = event
                if event.claim_uid in self.claims:
                    self._partition_progress(self.claims[event.claim_uid])
            case DeviceHealthChanged():
                node = self.nodes.get(event.node)
                if node is not None:
                    if event.healthy:
                        node.unhealthy.pop(event.gpu_uuid, None)
                    else:
                        node.unhealthy[event.gpu_uuid] = event.reason or "unhealthy"
            case DeadLetter():
                self.dead_letters[event.consumer] += 1
            case _:
                pass

    def _named(self, uid: str, namespace: str, name: str) -> ClaimView:
        view = self.claim(uid)
        view.namespace, view.name = namespace, name
        return view

    def _partition_progress(self, view: ClaimView) -> None:
        applied = [self.results.get(c) for c in view.partitions]
        if view.partitions and all(isinstance(r, PartitionApplied) for r in applied):
            view.partition_applied_at = max(r.time for r in applied if r is not None)

    # --- queries ----------------------------------------------------------------------------------

    def live_claims(self) -> list[ClaimView]:
        """Claims that hold devices now (allocated or ready), by name."""
        return sorted(
            (c for c in self.claims.values() if c.state in ("allocated", "ready") and c.node),
            key=lambda c: c.key,
        )

    def counts(self) -> dict[str, int]:
        tally = Counter(c.state for c in self.claims.values())
        return {state: tally.get(state, 0) for state in CLAIM_STATES}

    def uses(self, node: str) -> dict[int, GpuUse]:
        """Per GPU index of the node: the claims holding it or its instances, and unheld instances."""
        view = self.nodes.get(node)
        whole: dict[int, str] = {}
        instances: dict[int, dict[int, str]] = {}
        for claim in self.live_claims():
            if claim.node != node:
                continue
            for device in claim.devices:
                if device.placement is None:
                    whole[device.gpu_index] = claim.key
                else:
                    instances.setdefault(device.gpu_index, {})[device.placement.start] = claim.key
        result: dict[int, GpuUse] = {}
        gpus = view.hardware.gpus if view is not None else []
        for gpu in gpus:
            held = instances.get(gpu.index, {})
            warm = sorted(m.placement.start for m in gpu.mig_instances if m.placement.start not in held)
            result[gpu.index] = GpuUse(whole=whole.get(gpu.index), instances=held, warm=warm)
        return result

    def to_builtins(self) -> dict[str, Any]:
        """The whole picture as JSON-ready data: what `status --json` prints and the web view draws."""
        nodes = []
        for name, node in sorted(self.nodes.items()):
            uses = self.uses(name)
            nodes.append(
                {
                    "name": name,
                    "inventory_at": node.inventory_at.isoformat(),
                    "driver_version": node.hardware.driver_version,
                    "gpus": [
                        _gpu(g, uses.get(g.index, GpuUse()), node.unhealthy) for g in node.hardware.gpus
                    ],
                    "links": [msgspec.to_builtins(link) for link in node.hardware.links],
                    "nvlink_domains": nvlink_domains(node.hardware),
                }
            )
        claims = [
            {
                "uid": c.uid,
                "claim": c.key,
                "state": c.state,
                "node": c.node,
                "devices": [d.device for d in c.devices],
                "reason": c.reason,
            }
            for c in sorted(self.claims.values(), key=lambda c: (CLAIM_STATES.index(c.state), c.key))
        ]
        return {
            "nodes": nodes,
            "claims": claims,
            "counts": self.counts(),
            "dead_letters": dict(sorted(self.dead_letters.items())),
            "events": self.events,
            "last_event_at": self.last_event_at.isoformat() if self.last_event_at else None,
        }


def nvlink_domains(hw: NodeHardware) -> dict[str, list[int]]:
    """GPU indexes per NVLink domain (GPUs in one domain are pairwise NVLink-connected)."""
    domains: dict[str, list[int]] = {}
    for gpu in hw.gpus:
        if gpu.nvlink_domain:
            domains.setdefault(gpu.nvlink_domain, []).append(gpu.index)
    return domains


def _gpu(gpu: GpuInfo, use: GpuUse, unhealthy: dict[str, str]) -> dict[str, Any]:
    instances = [
        {
            "profile": m.profile,
            "start": m.placement.start,
            "size": m.placement.size,
            "uuid": m.uuid,
            "claim": use.instances.get(m.placement.start),
            "warm": m.placement.start in use.warm,
        }
        for m in sorted(gpu.mig_instances, key=lambda m: m.placement.start)
    ]
    # Instances the allocator decided on but the inventory does not show yet (being created).
    shown = {m.placement.start for m in gpu.mig_instances}
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "product": gpu.product,
        "memory_mib": gpu.memory_mib,
        "mig_capable": gpu.mig_capable,
        "mig_enabled": gpu.mig_enabled,
        "memory_slices": gpu.memory_slices,
        "nvlink_domain": gpu.nvlink_domain,
        "whole_claim": use.whole,
        "instances": instances,
        "creating": sorted(start for start in use.instances if start not in shown),
        "health": "unhealthy" if gpu.uuid in unhealthy or gpu.health == "unhealthy" else "healthy",
    }
