"""Which claims of lower priority to preempt, and on which node, so that a claim fits (pure).

kube-scheduler's preemption of pods, applied to devices. On each node, every claim of lower
priority that may be preempted is taken away; when the claim then fits, the victims are reprieved
one at a time, the most important first (highest priority, then the smallest holding), each kept
when the claim still fits without it. The nodes are then compared by what preempting there costs:
the victims' highest priority, the sum of their priorities, how many they are, and what the
placement leaves on the node (more free whole GPUs, fewer stranded slices). Nodes are tried in
order of the lowest priority they could free, and no further once none left could beat the best
found (or `NODES_COMPARED` were compared); a node's name decides only between nodes that cost the
same.

"Fits" is asked of a trial fleet of the node (`FleetState.trial`): the victims released and their
MIG instances destroyed, exactly what the node will be once they are gone, so a claim may reuse
the victims' MIG instances' slices or have the GPU reconfigured.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from tangram.allocation.fleet import FleetState
from tangram.allocation.model import Allocated, Claim, Policy
from tangram.allocation.spec import DeviceClass

# Nodes where preemption makes room, compared in full for one claim, those whose claims of lowest
# priority come first: a bound on a decision's cost at thousands of nodes.
NODES_COMPARED = 16
# Whether the claim fits is asked with first-fit, the cheapest search (any fit answers it); the
# placement whose leftovers are compared is the allocator's own policy's.
FEASIBILITY: Policy = "first-fit"
# What a whole GPU weighs against a MIG slice when victims are reprieved smallest first.
WHOLE_GPU_WEIGHT = 8


@dataclass(frozen=True, slots=True)
class Preemption:
    node: str
    victims: tuple[str, ...]  # claim uids, most important first
    # (highest victim priority, sum of victim priorities, victims, -free whole GPUs left, stranded)
    cost: tuple[float, ...]


def plan_preemption(
    fleet: FleetState,
    claim: Claim,
    classes: Mapping[str, DeviceClass],
    policy: Policy,
    *,
    priority: int,
    priorities: Mapping[str, int],
    protected: Collection[str] = (),
    fenced: Collection[str] = (),
) -> Preemption | None:
    """The cheapest preemption that lets `claim` (of `priority`) fit; None when there is none.

    Only claims whose priority is known and lower than `priority` are victims, never those
    `protected` (a disruption budget forbids evicting their pods), never on nodes `fenced` for
    another claim's preemption.
    """
    candidates: list[tuple[int, int, str, list[str]]] = []
    for name in fleet.node_names:
        if name in fenced:
            continue
        lower = [
            uid
            for uid in fleet.holders(name)
            if uid not in protected and priorities.get(uid, priority) < priority
        ]
        if lower:
            # the victims' highest priority is at least the lowest of these: the bound below
            candidates.append((min(priorities[u] for u in lower), -len(lower), name, lower))
    best: Preemption | None = None
    compared = 0
    for lowest, _, name, lower in sorted(candidates):
        if best is not None and lowest > best.cost[0]:
            break  # no node left can preempt lower priorities than the best found
        if _placed(fleet, name, lower, claim, classes=classes, policy=FEASIBILITY) is None:
            continue
        victims = list(lower)
        for uid in sorted(lower, key=lambda u: (-priorities[u], _weight(fleet, u), u)):
            kept = [v for v in victims if v != uid]
            if kept and _placed(fleet, name, kept, claim, classes=classes, policy=FEASIBILITY) is not None:
                victims = kept
        left = _placed(fleet, name, victims, claim, classes=classes, policy=policy)
        if left is None:  # pragma: no cover - the reprieves only ever keep a fitting set
            continue
        ranks = [priorities[v] for v in victims]
        cost = (max(ranks), sum(ranks), len(victims), -left.free_gpus, left.stranded_gpus)
        chosen = tuple(sorted(victims, key=lambda u: (-priorities[u], u)))
        if best is None or (cost, name) < (best.cost, best.node):
            best = Preemption(node=name, victims=chosen, cost=cost)
        compared += 1
        if compared >= NODES_COMPARED:
            break
    return best


def _placed(
    fleet: FleetState,
    node: str,
    victims: list[str],
    claim: Claim,
    *,
    classes: Mapping[str, DeviceClass],
    policy: Policy,
) -> _Left | None:
    trial = fleet.trial(node, without=victims)
    if trial is None or not isinstance(trial.allocate(claim, classes, policy), Allocated):
        return None
    metrics = trial.metrics()
    return _Left(free_gpus=metrics.free_gpus, stranded_gpus=metrics.stranded_gpus)


@dataclass(frozen=True, slots=True)
class _Left:
    free_gpus: int
    stranded_gpus: float


def _weight(fleet: FleetState, uid: str) -> int:
    held = fleet.allocation(uid)
    if held is None:
        return 0
    return sum(
        d.placement.size if d.placement is not None else 0 if d.share is not None else WHOLE_GPU_WEIGHT
        for d in held.devices
    )
