"""Holding what was decided elsewhere: the allocator's own decisions read back from its log, and
claims kube-scheduler allocated, learned when their node prepared them."""

from __future__ import annotations

from collections.abc import Mapping

from tangram.allocation.holdings import Holdings
from tangram.allocation.model import Allocated
from tangram.allocation.nodeindex import NodeIndex
from tangram.allocation.plans import allocated_device
from tangram.dra.sharing import share_id, share_memory, share_of
from tangram.events.catalogue import AllocatedDevice, DeviceShare


def adopt(nodes: NodeIndex, holdings: Holdings, decision: Allocated) -> None:
    """Hold the decision's devices as it recorded them (FleetState.adopt)."""
    if decision.claim_uid in holdings:
        return
    taken = tuple(d.device for d in decision.devices if not d.admin_access)
    for device in decision.devices:
        if device.partition_command and device.placement is not None and device.profile_id is not None:
            holdings.made.add((decision.node, device.gpu_index, device.profile_id, device.placement.start))
    holdings.hold(decision, taken)
    node = nodes.get(decision.node)
    if node is not None:
        node.take_held(decision.claim_uid, decision.devices, taken)
        nodes.changed(node.name)


def adopt_prepared(
    nodes: NodeIndex,
    holdings: Holdings,
    claim_uid: str,
    node_name: str,
    devices: list[tuple[str, str]],
    *,
    driver: str,
    shares: Mapping[str, DeviceShare] | None = None,
) -> list[str]:
    """Hold the devices of a claim allocated outside the allocator (FleetState.adopt_prepared);
    returns the names of devices another claim already held. A share host is held as a share:
    the one in `shares`, else the default share of the device."""
    if claim_uid in holdings:
        return []
    node = nodes.get(node_name)
    allocated: list[AllocatedDevice] = []
    taken: list[str] = []
    conflicts: list[str] = []
    for request, name in devices:
        index = node.shape.index_by_name.get(name) if node is not None else None
        if node is None or index is None:
            # Not advertised now: recorded, and taken when the node's inventory brings it back.
            allocated.append(
                AllocatedDevice(
                    request=request,
                    driver=driver,
                    pool=node_name,
                    device=name,
                    gpu_index=-1,
                    gpu_uuid="",
                )
            )
            taken.append(name)
            continue
        shared = node.shape.devices[index].shared
        if not shared and index in node.allocated and node.allocated[index] != claim_uid:
            conflicts.append(name)
            continue
        share = None
        if shared:
            share = (shares or {}).get(name) or share_of(
                share_id(claim_uid, name), None, memory=share_memory(None, None)
            )
        allocated.append(
            allocated_device(node.devices[index], request=request, driver=driver, pool=node.pool, share=share)
        )
        taken.append(name)
    decision = Allocated(claim_uid=claim_uid, node=node_name, devices=allocated)
    holdings.hold(decision, tuple(taken))
    if conflicts:
        holdings.contested[claim_uid] = [(r, n) for r, n in devices if n in conflicts]
    if node is not None:
        node.take_held(claim_uid, allocated, taken)
        nodes.changed(node.name)
    return conflicts


def hand_over(nodes: NodeIndex, holdings: Holdings, node_name: str, *, driver: str) -> None:
    """Devices freed on the node go to the claims prepared on them while another claim held them:
    their pods run there, and the device is theirs until their node unprepares them. Handed over
    in uid order, the same whether a rebuild reads the prepare before the release or after it."""
    if not holdings.contested:
        return  # the common case, at every release: nothing was ever given out twice
    node = nodes.get(node_name)
    if node is None:
        return
    for uid in sorted(u for u in holdings.contested if holdings.held[u].node == node_name):
        waiting = holdings.contested[uid]
        still: list[tuple[str, str]] = []
        taken: list[AllocatedDevice] = []
        for request, name in waiting:
            index = node.shape.index_by_name.get(name)
            if index is None or index in node.allocated:
                still.append((request, name))
                continue
            device = allocated_device(node.devices[index], request=request, driver=driver, pool=node.pool)
            node.take_held(uid, [device], [name])
            taken.append(device)
        if taken:
            holdings.take_more(uid, taken)
            nodes.changed(node_name)
        if still:
            holdings.contested[uid] = still
        else:
            del holdings.contested[uid]
