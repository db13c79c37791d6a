"""What must hold of a chaos run on Kubernetes, judged from what the API server and the log say (pure)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from tangram.events import ClaimAllocated, ClaimFailed, ClaimPreempting, ClaimReleased, ClaimRequested, Event
from tangram.kubernetes.objects.claimbridge import allocation_of, held_devices


def _name(claim: Mapping[str, Any]) -> str:
    metadata = claim.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def live(claim: Mapping[str, Any], pods: Collection[str] | None = None) -> bool:
    """A claim whose allocation holds its devices: not being deleted, or still reserved for a pod
    that exists (uids in `pods`, when given). A claim being deleted that no pod uses any more holds
    nothing: its node has unprepared it, and a reservation left for a pod already gone (the claim
    controller not caught up) keeps nothing on the node."""
    if not (claim.get("metadata") or {}).get("deletionTimestamp"):
        return True
    reserved = [str(r.get("uid", "")) for r in (claim.get("status") or {}).get("reservedFor") or []]
    return bool(reserved) and (pods is None or any(uid in pods for uid in reserved))


def devices_held_twice(claims: Iterable[Mapping[str, Any]], pods: Collection[str] | None = None) -> list[str]:
    """A device in the allocations of two live claims at once (one listing: one moment; `pods`,
    the uids of the pods that exist, listed right after)."""
    holder: dict[Any, str] = {}
    twice: list[str] = []
    for claim in claims:
        allocation = allocation_of(claim)
        if allocation is None or not live(claim, pods):
            continue
        for device in sorted(held_devices(allocation), key=str):
            other = holder.setdefault(device, _name(claim))
            if other != _name(claim):
                twice.append(f"device {device[1]}/{device[2]} allocated to {other} and {_name(claim)}")
    return twice


def mig_devices_by_node(claims: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The MIG devices the live claims' allocations hold, by node (Tangram's pools are its nodes),
    each once per claim that holds it."""
    held: dict[str, list[str]] = {}
    for claim in claims:
        allocation = (allocation_of(claim) if live(claim) else None) or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            device = str(result.get("device", ""))
            if "-mig-" in device and not result.get("adminAccess"):
                held.setdefault(str(result.get("pool", "")), []).append(device)
    return {pool: sorted(devices) for pool, devices in held.items()}


def mig_instances_differ(node: str, made: Mapping[str, str], held: Iterable[str]) -> str | None:
    """The line saying how a node's MIG instances Tangram made (uuid -> device name) differ from
    those its live claims hold, naming each one on only one side; None when they agree in number."""
    held = list(held)
    if len(made) == len(held):
        return None
    unheld = sorted(f"{name} ({uuid})" for uuid, name in made.items() if name not in held)
    unmade = sorted(set(held) - set(made.values()))
    return (
        f"node {node}: {len(made)} MIG instances made by Tangram, {len(held)} allocated; "
        f"made but held by no live claim: {', '.join(unheld) or 'none'}; "
        f"held but not made: {', '.join(unmade) or 'none'}"
    )


def allocated_by_uid(claims: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """uid -> the node of every live allocated claim."""
    found: dict[str, str] = {}
    for claim in claims:
        allocation = allocation_of(claim)
        results = ((allocation or {}).get("devices") or {}).get("results") or []
        if allocation is not None and results and live(claim):
            found[str((claim.get("metadata") or {}).get("uid", ""))] = str(results[0].get("pool", ""))
    return found


def reserved_nodes_taken(log: Iterable[Event]) -> list[str]:
    """A claim allocated on a node while that node stood reserved for another claim's preemption,
    when the claim's priority is not above the preemptor's: what preemption frees is the
    preemptor's alone. The reservation stands from the ClaimPreempting until the preemptor is
    allocated (on that node, or elsewhere once capacity freed there first) or released, or a
    failure of the preemptor names no reserved node (it was given up); a failure naming another
    node moves it. A group of pods preempts for all its claims: a claim of the preemptor's own
    group takes what is reserved for it."""
    priority: dict[str, int] = {}
    group: dict[str, tuple[str, str]] = {}
    reserved: dict[str, tuple[str, int, str]] = {}  # preemptor uid -> node, its priority, its name
    taken: list[str] = []
    for event in log:
        if isinstance(event, ClaimRequested):
            priority[event.uid] = event.priority
            if event.gang is not None:
                group[event.uid] = (event.namespace, event.gang.group)
        elif isinstance(event, ClaimPreempting):
            reserved[event.uid] = (event.node, event.priority, f"{event.namespace}/{event.name}")
        elif isinstance(event, ClaimFailed) and event.uid in reserved:
            if event.reserved_node:
                _, at, name = reserved[event.uid]
                reserved[event.uid] = (event.reserved_node, at, name)
            else:
                del reserved[event.uid]
        elif isinstance(event, ClaimAllocated):
            reserved.pop(event.uid, None)
            own = priority.get(event.uid)
            ours = group.get(event.uid)
            for uid, (node, at, preemptor) in reserved.items():
                if ours is not None and group.get(uid) == ours:
                    continue
                if node == event.node and (own is None or own <= at):
                    taken.append(
                        f"claim {event.namespace}/{event.name} (priority {own}) allocated on node "
                        f"{node}, reserved for {preemptor} (priority {at})"
                    )
        elif isinstance(event, ClaimReleased):
            reserved.pop(event.uid, None)
    return taken
