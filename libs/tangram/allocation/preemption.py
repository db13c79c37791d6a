"""Which claims of lower priority to preempt, and where, so that a claim or a group of pods' claims
fits (pure).

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

Groups of pods are preempted whole: a claim of a group is a victim only when every claim of its
group may be preempted, and preempting it preempts them all, on whichever nodes they are (its
`companions`): the pods left of a group are useless and would hold their GPUs for nothing. A group
that does not fit preempts as one too (`plan_gang_preemption`): in each candidate set of nodes the
group may take (its NVLink clique, a network block, the fleet), every claim of lower priority
is taken away, then reprieved group by group as above, and the candidates are compared by the same
cost, then by keeping the group under one block, on the fewest nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tangram.allocation.fleet import FleetState
from tangram.allocation.gangs import candidates_for, placed_in, spans_blocks, whole_free
from tangram.allocation.model import Allocated, Claim, Failed, Policy
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
    companions: Mapping[str, Collection[str]] | None = None,
) -> Preemption | None:
    """The cheapest preemption that lets `claim` (of `priority`) fit; None when there is none.

    Only claims whose priority is known and lower than `priority` are victims, never those
    `protected` (a disruption budget forbids evicting their pods), never on nodes `fenced` for
    another claim's preemption; a claim of a group only with its `companions` (uid -> the other
    claims its group holds), which are then victims too.
    """
    rules = _Rules(priority, priorities, protected, companions or {})
    candidates: list[tuple[int, int, str, list[str]]] = []
    for name in fleet.node_names:
        if name in fenced:
            continue
        lower = rules.lower(fleet, [name])
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

        def fits(kept: list[str], name: str = name) -> bool:
            return _placed(fleet, name, kept, claim, classes=classes, policy=FEASIBILITY) is not None

        victims = rules.reprieved(fleet, lower, fits)
        left = _placed(fleet, name, victims, claim, classes=classes, policy=policy)
        if left is None:  # pragma: no cover - the reprieves only ever keep a fitting set
            continue
        preempted = rules.with_companions(victims)
        ranks = [priorities.get(v, 0) for v in preempted]
        cost = (max(ranks), sum(ranks), len(preempted), -left.free_gpus, left.stranded_gpus)
        if best is None or (cost, name) < (best.cost, best.node):
            best = Preemption(node=name, victims=rules.ordered(preempted), cost=cost)
        compared += 1
        if compared >= NODES_COMPARED:
            break
    return best


@dataclass(frozen=True, slots=True)
class GangPreemption:
    """Where each claim of a group goes once `victims` (claim uids, most important first) are gone."""

    decisions: tuple[Allocated, ...]
    victims: tuple[str, ...]
    # (highest victim priority, sum of victim priorities, victims, spans blocks, nodes, whole GPUs left free)
    cost: tuple[float, ...]

    @property
    def nodes(self) -> list[str]:
        return sorted({d.node for d in self.decisions})


def plan_gang_preemption(
    fleet: FleetState,
    claims: Sequence[Claim],
    classes: Mapping[str, DeviceClass],
    policy: Policy,
    *,
    nvlink_domain: bool,
    priority: int,
    priorities: Mapping[str, int],
    protected: Collection[str] = (),
    fenced: Collection[str] = (),
    companions: Mapping[str, Collection[str]] | None = None,
) -> GangPreemption | None:
    """The cheapest preemption after which every claim of the group fits; None when there is none.

    Victims as for `plan_preemption`. The fleet as a whole is a candidate only where no clique or
    block is, and then on the fewest nodes that would hold the group once freed: those with the
    most whole GPUs free or held by claims of lower priority first, in doubling prefixes."""
    trial = _GangTrial(fleet, claims, classes, _Rules(priority, priorities, protected, companions or {}))
    best: GangPreemption | None = None
    for label, nodes in candidates_for(fleet, nvlink_domain=nvlink_domain, fenced=set(fenced)):
        if not label and best is not None:
            break
        plan = trial.plan(nodes if label else trial.fewest_freed(nodes), policy)
        if plan is not None and (best is None or plan.cost < best.cost):
            best = plan
    return best


@dataclass(frozen=True)
class _Rules:
    """Who may be preempted for a claim of `priority`, and how victims are chosen among them."""

    priority: int
    priorities: Mapping[str, int]
    protected: Collection[str]
    companions: Mapping[str, Collection[str]]

    def may_go(self, uid: str) -> bool:
        return uid not in self.protected and self.priorities.get(uid, self.priority) < self.priority

    def lower(self, fleet: FleetState, nodes: Iterable[str]) -> list[str]:
        """The claims on these nodes that may be preempted: known and lower, not protected, and so
        is every claim of its group."""
        return [
            uid
            for name in nodes
            for uid in fleet.holders(name)
            if self.may_go(uid) and all(self.may_go(c) for c in self.companions.get(uid, ()))
        ]

    def reprieved(self, fleet: FleetState, lower: list[str], fits: Callable[[list[str]], bool]) -> list[str]:
        """The victims left once each group of them (a claim alone, or the claims of one group of
        pods) is reprieved in turn, the most important first, when the claims still fit without it."""
        units: dict[str, list[str]] = {}
        for uid in lower:
            units.setdefault(min((uid, *self.companions.get(uid, ()))), []).append(uid)

        def importance(key: str) -> tuple[int, int, str]:
            members = units[key]
            top = max(self.priorities.get(u, 0) for u in members)
            return (-top, sum(_weight(fleet, u) for u in members), key)

        victims = list(lower)
        for key in sorted(units, key=importance):
            kept = [v for v in victims if v not in units[key]]
            if kept and fits(kept):
                victims = kept
        return victims

    def with_companions(self, victims: list[str]) -> list[str]:
        return list(dict.fromkeys(u for v in victims for u in (v, *sorted(self.companions.get(v, ())))))

    def ordered(self, victims: list[str]) -> tuple[str, ...]:
        return tuple(sorted(victims, key=lambda u: (-self.priorities.get(u, 0), u)))


@dataclass(frozen=True)
class _GangTrial:
    """A group's claims tried on sets of nodes with claims of lower priority taken away."""

    fleet: FleetState
    claims: Sequence[Claim]
    classes: Mapping[str, DeviceClass]
    rules: _Rules

    def fits(self, nodes: list[str], without: list[str]) -> bool:
        outcome = placed_in(self.fleet, nodes, self.claims, self.classes, FEASIBILITY, without=without)
        return not isinstance(outcome, Failed)

    def plan(self, nodes: list[str], policy: Policy) -> GangPreemption | None:
        fleet, rules = self.fleet, self.rules
        lower = rules.lower(fleet, nodes)
        if not lower or not self.fits(nodes, lower):
            return None
        victims = rules.reprieved(fleet, lower, lambda kept: self.fits(nodes, kept))
        outcome = placed_in(fleet, nodes, self.claims, self.classes, policy, without=victims)
        if isinstance(outcome, Failed):  # pragma: no cover - the reprieves only ever keep a fitting set
            return None
        trial, decisions = outcome
        preempted = rules.with_companions(victims)
        ranks = [rules.priorities.get(v, 0) for v in preempted]
        used = {d.node for d in decisions}
        cost = (
            max(ranks),
            sum(ranks),
            len(preempted),
            int(spans_blocks(fleet, used)),
            len(used),
            whole_free(trial, nodes),
        )
        return GangPreemption(decisions=decisions, victims=rules.ordered(preempted), cost=cost)

    def fewest_freed(self, nodes: list[str]) -> list[str]:
        """The first prefix (doubling) of the nodes, those that would free the most whole GPUs
        first, that holds the group once every claim of lower priority there is gone; all the nodes
        when none does."""
        fleet, rules = self.fleet, self.rules

        def freeable(name: str) -> int:
            held = sum(_whole_gpus(fleet, uid) for uid in rules.lower(fleet, [name]))
            return whole_free(fleet, [name]) + held

        ordered = sorted(nodes, key=lambda n: (-freeable(n), n))
        size = 1
        while size < len(ordered):
            prefix = ordered[:size]
            if self.fits(prefix, rules.lower(fleet, prefix)):
                return prefix
            size *= 2
        return ordered


def _whole_gpus(fleet: FleetState, uid: str) -> int:
    held = fleet.allocation(uid)
    if held is None:
        return 0
    return sum(1 for d in held.devices if d.placement is None and d.share is None)


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
