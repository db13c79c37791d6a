"""Placing a share: a claim of shared.gpu.tangram.dev joins a share host that has room, or opens one.

A share host is a device several claims may hold at once (a whole GPU, or a MIG placement), each
claim holding a share of its memory and, when asked, of its compute (MPS active thread
percentage). One strategy per host: MPS shares never meet time-sliced ones on one device.

Tangram's order, facts of hardware and state only:
1. join a host already carrying shares, the one left fullest (best fit by memory, then compute),
   so that shares pack onto GPUs already shared;
2. else open a fresh host, preferring one that takes no whole GPU away (a MIG placement on a GPU
   already cut, the smallest that fits, spoiling the fewest larger placements), then one whose
   GPU has no free NVLink peer (NVLink sets stay whole for exclusive claims); on a GPU still
   whole of a node running MIG, the smallest instance that fits, on a node without MIG the whole
   GPU (it holds more shares than any instance cut from it); then the fullest node.
First-fit takes the first host that fits in node and device order; best-fit takes the fullest
host that fits, open or not, the smallest when opening.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from tangram.allocation.eligibility import Eligible, NodeEligibility
from tangram.allocation.holdings import Holdings
from tangram.allocation.model import Allocated, Claim, Decision, Failed, PartitionPlan, Policy
from tangram.allocation.node import NodeState
from tangram.allocation.nodeindex import NodeIndex
from tangram.allocation.plans import allocated_device, disable_mig_plan, mig_plan
from tangram.allocation.requests import Alternative, ClaimError, ResolvedClaim
from tangram.allocation.shape import DeviceShape, NodeShape, placement_loss
from tangram.dra.sharing import counted_compute, share_id, share_memory, share_of
from tangram.events.catalogue import DeviceShare

_REASONS_LISTED = 4  # nodes named in a failure's reason


def gib(value: int) -> str:
    return f"{value / 2**30:.4g}"


def describe(share: DeviceShare) -> str:
    text = f"{gib(share.memory_bytes)} GiB"
    if counted_compute(share):
        text += f", {share.compute_percent}% compute"
    return f"{text} ({share.strategy})"


def share_asked(resolved: ResolvedClaim, alt: Alternative, driver: str) -> DeviceShare:
    """The share the request asks for (its id is set when the device is chosen)."""
    config = resolved.sharing_for(alt)
    memory = share_memory(dict(alt.capacity).get(f"{driver}/memory"), config)
    return share_of("", config, memory=memory)


def share_requests(resolved: ResolvedClaim, nodes: Iterable[NodeState], eligibility: NodeEligibility) -> bool:
    """Whether the claim asks for shares: its requests select share hosts (on the first node whose
    shape has any device they select). Raises ClaimError for a claim mixing shares and devices of
    its own, or asking for a share in a way Tangram does not place."""
    alts = [alt for request in resolved.requests for alt in request.alternatives]
    kinds: dict[str, bool] = {}
    seen: set[str] = set()
    for node in nodes:
        if node.shape.signature in seen:
            continue
        seen.add(node.shape.signature)
        for alt in alts:
            if alt.result_name in kinds:
                continue
            found = eligibility.on(node, alt)
            if found.devices:
                kinds[alt.result_name] = all(node.shape.devices[d].shared for d in found.devices)
        if len(kinds) == len(alts):
            break
    shared = [name for name, is_shared in kinds.items() if is_shared]
    if not shared:
        if resolved.sharing:
            raise ClaimError(
                "a SharingConfig applies only to requests of shared devices (device class "
                '"shared.gpu.tangram.dev"); no request of this claim selects one'
            )
        return False
    if len(shared) != len(alts) or len(resolved.requests) != 1:
        raise ClaimError(
            "a claim of shared devices asks for exactly one share in one request (without "
            f"firstAvailable alternatives of other kinds); this one has {len(alts)} alternatives in "
            f"{len(resolved.requests)} requests"
        )
    alt = alts[0]
    if alt.count != 1 or alt.all_mode or alt.admin:
        raise ClaimError(
            f'request "{alt.result_name}": a share is one device (count 1, allocationMode '
            "ExactCount, no admin access)"
        )
    if resolved.constraints or resolved.topology:
        raise ClaimError("constraints and TopologyConfig do not apply to a share of one device")
    return True


@dataclass(frozen=True, slots=True)
class _Pick:
    rank: tuple[Any, ...]
    node: NodeState
    device: DeviceShape
    opens: bool


def place_share(
    claim: Claim,
    resolved: ResolvedClaim,
    policy: Policy,
    *,
    driver: str,
    nodes: NodeIndex,
    eligibility: NodeEligibility,
    holdings: Holdings,
    explain: bool,
) -> Decision:
    alt = resolved.requests[0].alternatives[0]
    ask = share_asked(resolved, alt, driver)
    best: _Pick | None = None
    refusals: list[tuple[tuple[Any, ...], str]] = []
    candidates = 0
    selected: dict[int, tuple[Eligible, _Hosts]] = {}  # by the eligible set (one per shape), kept alive
    for node, opens in _candidates(nodes):
        eligible = eligibility.for_claim(node, alt)
        found = selected.get(id(eligible))
        if found is None:
            found = selected[id(eligible)] = (eligible, _Hosts.of(node.shape, eligible))
        hosts = found[1]
        if not hosts.devices:
            continue
        candidates += 1
        picks = list(_picks(node, hosts, ask, policy, opens=opens))
        if not picks:
            refusals.append(_refusal(node, hosts, ask))
            continue
        if policy == "first-fit":
            best = min(picks, key=lambda p: p.device.index)
            break
        pick = min(picks, key=lambda p: p.rank)
        if best is None or pick.rank < best.rank:
            best = pick
    if best is None:
        refusals.sort()
        listed = "; ".join(text for _, text in refusals[:_REASONS_LISTED])
        more = len(refusals) - _REASONS_LISTED
        reason = (
            f"no shared device has room for a share of {describe(ask)}"
            + (f": {listed}" if listed else "")
            + (f"; and {more} more nodes" if more > 0 else "")
        )
        if not candidates:
            reason = f'request "{alt.result_name}": no node has a shared device the request selects'
        return Failed(
            claim_uid=claim.uid,
            reason=reason,
            cause="capacity" if candidates else "hardware",
            explanation=[text for _, text in refusals] if explain else [],
        )
    return _commit(
        claim, resolved, alt, ask, best, driver=driver, nodes=nodes, holdings=holdings, explain=explain
    )


@dataclass(frozen=True, slots=True)
class _Hosts:
    """The share hosts a request may take on nodes of one shape."""

    devices: tuple[DeviceShape, ...]
    indexes: frozenset[int]
    largest: int  # bytes: the most memory one of them has

    @classmethod
    def of(cls, shape: NodeShape, eligible: Eligible) -> _Hosts:
        devices = tuple(shape.devices[d] for d in eligible.devices if shape.devices[d].shared)
        return cls(devices, frozenset(d.index for d in devices), max((d.memory for d in devices), default=0))


def _candidates(nodes: NodeIndex) -> list[tuple[NodeState, bool]]:
    """The nodes a share could go to, in name order, and whether a host may be opened there.

    A share joins an open host, so every node carrying shares is a candidate for joining. Opening
    one depends on nothing but the node's state, which nodes of one group (NodeState.group_key:
    hardware and what is taken on it) share: the group's first node in name order stands for the
    others. That keeps a decision at a few dozen nodes on a fleet of thousands, and first-fit still
    finds the first node in name order with room (a node's group comes no later than itself).
    """
    nodes.reindex_changed()
    chosen: dict[str, bool] = {}
    for members in nodes.demand.groups.values():
        node = nodes.by_name.get(members[0])
        if node is not None and node.shape.has_share_hosts:
            chosen[node.name] = True
    for name, node in nodes.by_name.items():
        if node.hosts:
            chosen.setdefault(name, False)
    return [(nodes.by_name[name], chosen[name]) for name in sorted(chosen)]


def _picks(
    node: NodeState, hosts: _Hosts, ask: DeviceShare, policy: Policy, *, opens: bool
) -> Iterable[_Pick]:
    free_whole = sum(node.whole_free.values())
    memory, compute = ask.memory_bytes, counted_compute(ask)
    for index, host in node.hosts.items():
        if index not in hosts.indexes or host.strategy != ask.strategy:
            continue
        device = node.shape.devices[index]
        memory_left = device.memory - host.memory_used - memory
        compute_left = 100 - host.compute_used - compute
        if memory_left < 0 or compute_left < 0:
            continue
        rank: tuple[Any, ...] = (0, memory_left, compute_left, device.memory, free_whole, device.index)
        yield _Pick(rank, node, device, opens=False)
    if not opens:
        return
    for device in hosts.devices:
        if device.memory >= memory and node.openable(device):
            yield _Pick(_open_rank(node, device, free_whole, policy), node, device, opens=True)


def _open_rank(node: NodeState, device: DeviceShape, free_whole: int, policy: Policy) -> tuple[Any, ...]:
    if policy != "tangram":
        return (1, device.memory, free_whole, device.index)
    gpu = device.gpu_index
    takes_whole = node.whole_free.get(gpu, False)
    nvlink_peer = takes_whole and any(
        other != gpu and free and node.shape.pairs.nvlinks(gpu, other) > 0
        for other, free in node.whole_free.items()
    )
    spoiled: tuple[int, ...] = ()
    if device.kind == "mig":
        placements = node.shape.gpus[gpu].placements
        spoiled = placement_loss(placements, node.occupied.get(gpu, 0), device.mask)
    # A GPU still whole is lost to whole-GPU claims whichever host opens on it. On a node that runs
    # no MIG, the largest host (the whole GPU) then holds the most shares, where MIG instances would
    # leave a memory slice unused and split the rest. On a node that runs MIG, and on a GPU already
    # cut, the smallest placement that fits leaves the rest of the GPU to MIG claims and to more
    # shares: a 2g instance shared by three rerankers rather than a whole H200.
    carves = not takes_whole or node.mig_mode != 0 or any(node.existing.values())
    size = device.memory if carves else -device.memory
    return (1, takes_whole, nvlink_peer, size, spoiled, free_whole, device.index)


def _refusal(node: NodeState, hosts: _Hosts, ask: DeviceShare) -> tuple[tuple[Any, ...], str]:
    """Why the node has no room: the most memory left on a host of the same strategy, the compute
    left there, and whether a fresh host could be opened."""
    devices = node.shape.devices
    open_hosts = [(devices[i], h) for i, h in node.hosts.items() if i in hosts.indexes]
    same = [(d, h) for d, h in open_hosts if h.strategy == ask.strategy]
    parts: list[str] = []
    if same:
        device, host = max(same, key=lambda dh: (dh[0].memory - dh[1].memory_used, -dh[0].index))
        parts.append(
            f"{device.name} has {gib(device.memory - host.memory_used)} GiB of memory and "
            f"{100 - host.compute_used}% compute left"
        )
    others = len(open_hosts) - len(same)
    if others:
        plural = others != 1
        devices_text = f"{others} shared device{'s' if plural else ''}"
        parts.append(f"{devices_text} run{'' if plural else 's'} another strategy")
    if hosts.largest < ask.memory_bytes:
        parts.append(f"its largest shared device has {gib(hosts.largest)} GiB")
    else:
        parts.append("no shared device is free to open")
    left = max((d.memory - h.memory_used for d, h in same), default=0)
    return (-left, node.name), f"{node.name}: " + ", ".join(parts)


def _commit(
    claim: Claim,
    resolved: ResolvedClaim,
    alt: Alternative,
    ask: DeviceShare,
    pick: _Pick,
    *,
    driver: str,
    nodes: NodeIndex,
    holdings: Holdings,
    explain: bool,
) -> Allocated:
    node, shape = pick.node, pick.device
    device = node.devices[shape.index]
    partitions: list[PartitionPlan] = []
    if pick.opens and device.placement is None and node.mig_enabled(device.gpu_index):
        partitions.append(disable_mig_plan(node, device.gpu_index, device.gpu_uuid))
    creates = (
        pick.opens
        and device.placement is not None
        and device.profile_id is not None
        and node.instance_for(shape) is None
    )
    if creates:
        partitions.append(mig_plan(device))
    allocated = allocated_device(
        device,
        request=alt.result_name,
        driver=driver,
        pool=node.pool,
        share=msgspec.structs.replace(ask, id=share_id(claim.uid, device.name)),
    )
    notes: list[str] = []
    if explain:
        host = node.hosts.get(shape.index)
        used = host.memory_used if host else 0
        notes.append(
            f"chosen {node.name} {device.name}: "
            + ("opens it" if pick.opens else f"joins {len(host.shares) if host else 0} shares")
            + f", {gib(shape.memory - used - ask.memory_bytes)} GiB left after"
        )
    decision = Allocated(
        claim_uid=claim.uid,
        node=node.name,
        devices=[allocated],
        partitions=partitions,
        config=list(resolved.config),
        explanation=notes,
    )
    if creates and device.placement is not None and device.profile_id is not None:
        holdings.made.add((node.name, device.gpu_index, device.profile_id, device.placement.start))
    node.take_share(
        shape.index, claim.uid, strategy=ask.strategy, memory=ask.memory_bytes, compute=counted_compute(ask)
    )
    nodes.reindex(node)
    holdings.hold(decision, (device.name,))
    return decision
