"""A placement made real: the decision committed, the MIG instances it creates or destroys, and
where destroying free instances would make room for a claim that fits nowhere as things stand."""

from __future__ import annotations

from typing import Any

from tangram.allocation.demand import ClaimKind
from tangram.allocation.holdings import Holdings, MadeInstance
from tangram.allocation.model import Allocated, Claim, Explanation, PartitionPlan
from tangram.allocation.node import ExistingInstance, NodeState
from tangram.allocation.nodeindex import NodeIndex
from tangram.allocation.options import fit_state, options_on
from tangram.allocation.placement import Choice, DemandIndex
from tangram.allocation.requests import ResolvedClaim
from tangram.allocation.solver import Solution
from tangram.dra.model import Device
from tangram.events.catalogue import AllocatedDevice, DeviceShare
from tangram.events.inventory import MigPlacement

Reconfiguration = tuple[Choice, list[tuple[int, ExistingInstance]]]


def commit(
    claim: Claim,
    resolved: ResolvedClaim,
    node: NodeState,
    solution: Solution,
    notes: list[str],
    *,
    driver: str,
    nodes: NodeIndex,
    holdings: Holdings,
    why: Explanation | None = None,
    destroy: list[PartitionPlan] | None = None,
) -> Allocated:
    """The claim allocated the solution's devices on the node: the decision, held."""
    shape = node.shape
    devices: list[AllocatedDevice] = []
    partitions: list[PartitionPlan] = list(destroy or ())
    taken: list[int] = []
    made: list[MadeInstance] = []
    for alt, choice in solution.picks:
        for d in choice:
            device = node.devices[d]
            devices.append(
                allocated_device(
                    device, request=alt.result_name, driver=driver, pool=node.pool, admin=alt.admin
                )
            )
            if alt.admin:
                continue
            taken.append(d)
            if device.placement is None and node.mig_enabled(device.gpu_index):
                partitions.append(disable_mig_plan(node, device.gpu_index, device.gpu_uuid))
            if (
                device.placement is not None
                and device.profile is not None
                and device.profile_id is not None
                and node.instance_for(shape.devices[d]) is None
            ):
                partitions.append(mig_plan(device))
                made.append((node.name, device.gpu_index, device.profile_id, device.placement.start))
    decision = Allocated(
        claim_uid=claim.uid,
        node=node.name,
        devices=devices,
        partitions=partitions,
        config=list(resolved.config),
        set_score=solution.set_score,
        ideal_set_score=solution.ideal_set_score,
        best_available_set_score=solution.best_available_set_score,
        explanation=notes,
        why=why,
    )
    # State changes come last, after everything that could fail: a claim that fails to be
    # decided leaves the fleet as it found it.
    holdings.made.update(made)
    node.take(taken, claim.uid)
    nodes.reindex(node)
    holdings.hold(decision, tuple(shape.devices[d].name for d in taken))
    return decision


def allocated_device(
    device: Device,
    *,
    request: str,
    driver: str,
    pool: str,
    admin: bool = False,
    share: DeviceShare | None = None,
) -> AllocatedDevice:
    """A device of the node as a decision records it (a share when `share` is given)."""
    return AllocatedDevice(
        request=request,
        driver=driver,
        pool=pool,
        device=device.name,
        gpu_index=device.gpu_index,
        gpu_uuid=device.gpu_uuid,
        profile=device.profile,
        profile_id=device.profile_id,
        placement=device.placement,
        admin_access=admin,
        share=share,
    )


def reconfiguration(
    demand: DemandIndex,
    nodes: NodeIndex,
    made: set[MadeInstance],
    kind: ClaimKind,
    ranked: list[Choice] | None,
    *,
    foreign: bool,
) -> Reconfiguration | None:
    """Where destroying free MIG instances lets the claim fit: fewest destroyed, then least loss.

    Only instances Tangram created (in `made`) are destroyed, unless `foreign`; an instance in
    use, claimed or already being destroyed is never touched.
    """
    best: tuple[tuple[Any, ...], Choice, list[tuple[int, ExistingInstance]]] | None = None
    weights = demand.weights()
    for key, members in list(demand.groups.items()):
        if not key[4]:
            continue
        node = nodes.by_name[members[0]]
        want = demand.want(key[0], kind)
        if want is None:
            continue
        free = [
            (g, inst)
            for g, live in sorted(node.existing.items())
            for inst in live
            if (g, inst.profile_id, inst.start, False, False) in key[4]
            and (foreign or (node.name, g, inst.profile_id, inst.start) in made)
        ]
        if not free:
            continue
        saved = set(node.destroying)
        node.set_destroying(saved | {(g, inst.profile_id, inst.start) for g, inst in free})
        try:
            options = options_on(node, node.group_key(), kind, want)
        finally:
            node.set_destroying(saved)
        before = fit_state(key)
        for option in options:
            needed = [
                (g, inst)
                for g, inst in free
                if any(
                    node.shape.devices[d].gpu_index == g
                    and (node.shape.devices[d].kind == "gpu" or node.shape.devices[d].mask & inst.mask)
                    for d in option.devices
                )
            ]
            loss = 0.0
            for i, lost in demand.delta(before, option):
                loss += weights[i] * lost
            rank = (
                len(needed),
                loss,
                -option.quality,
                option.mode_changes,
                option.creates,
                option.leaves,
                key,
                option.devices,
            )
            choice = Choice(key, node, option, rank[1:], loss)
            if ranked is not None:
                ranked.append(choice)
            if best is None or rank < best[0]:
                best = (rank, choice, needed)
    return None if best is None else (best[1], best[2])


def mig_plan(device: Device | AllocatedDevice, *, mig_uuid: str = "") -> PartitionPlan:
    """The MIG instance a device stands for: to create when allocated, to destroy when released."""
    assert device.profile is not None and device.profile_id is not None and device.placement is not None
    return PartitionPlan(
        gpu_index=device.gpu_index,
        gpu_uuid=device.gpu_uuid,
        profile=device.profile,
        profile_id=device.profile_id,
        placement=device.placement,
        mig_uuid=mig_uuid,
    )


def destroy_plan(node: NodeState, gpu_index: int, inst: ExistingInstance) -> PartitionPlan:
    """A free instance destroyed so that the claim's devices fit where it was."""
    return PartitionPlan(
        gpu_index=gpu_index,
        gpu_uuid=node.gpu_uuid.get(gpu_index, ""),
        profile=inst.profile,
        profile_id=inst.profile_id,
        placement=MigPlacement(start=inst.start, size=inst.size),
        mig_uuid=inst.uuid,
        action="destroy",
    )


def disable_mig_plan(node: NodeState, gpu_index: int, gpu_uuid: str) -> PartitionPlan:
    """A whole GPU handed out while still in MIG mode: the partitioner turns MIG off first."""
    slices = max(node.memory_slices(gpu_index), 1)
    return PartitionPlan(
        gpu_index=gpu_index,
        gpu_uuid=gpu_uuid,
        profile="",
        profile_id=-1,
        placement=MigPlacement(start=0, size=slices),
        action="disable-mig",
    )
