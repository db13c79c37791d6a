"""Placing a group of pods' claims all together or not at all (pure, no I/O).

Every claim of the group is decided in a trial fleet made of one candidate set of nodes: the
fleet itself is never touched until the whole group fits, so a group that does not fit holds
nothing. The candidates are the NVLink fabric cliques (GB200 NVL racks or their partitions) for a
group that asks for one NVLink domain; else each network block (nodes whose Node carries the same
block topology label) and the fleet as a whole. Among the candidates that hold the group, the one
chosen has no tray with degraded NVLink bandwidth, keeps the group under one network block, spreads
it over the fewest nodes and leaves the fewest whole GPUs free around it (the tightest fit), so
larger cliques and blocks stay free for larger groups.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tangram.allocation.fleet import FleetState
from tangram.allocation.model import Allocated, Claim, Failed, Policy
from tangram.allocation.spec import DeviceClass
from tangram.events.catalogue import FailureCause

# When the members fail for different causes in different candidates, the group's failure is the
# one a retry can change soonest: capacity over hardware; a fault of a claim is the claim's own.
_CAUSE_ORDER: tuple[FailureCause, ...] = ("claim", "internal", "capacity", "hardware", "gang")


@dataclass(frozen=True)
class GangPlaced:
    """Each claim's decision, in the order the claims were given, and the clique they share."""

    decisions: tuple[Allocated, ...]
    clique: str | None

    @property
    def nodes(self) -> list[str]:
        return sorted({d.node for d in self.decisions})


def node_clique(fleet: FleetState, name: str) -> str | None:
    """The NVLink fabric clique all of the node's GPUs are in; None when they are in none (or not
    all in the same one)."""
    node = fleet.node(name)
    if node is None or not node.hw.gpus:
        return None
    cliques = {gpu.clique_id for gpu in node.hw.gpus}
    if len(cliques) != 1:
        return None
    return next(iter(cliques))


def _degraded(fleet: FleetState, name: str) -> bool:
    node = fleet.node(name)
    return node is not None and any(gpu.fabric_degraded for gpu in node.hw.gpus)


def domain_troubles(
    fleet: FleetState, domains: Mapping[str, tuple[str, Sequence[str]]], members: Mapping[str, Iterable[str]]
) -> dict[tuple[str, str], str]:
    """(domain, node) -> what went wrong there, for the nodes of live NVLink domains (`domains`:
    domain -> (clique, nodes); `members`: domain -> the claims holding it): the node left the fleet,
    a GPU a claim of the domain holds there is unhealthy, the node's GPUs left the domain's clique
    (a tray whose fabric registration was lost), or its NVLink bandwidth is degraded."""
    troubles: dict[tuple[str, str], str] = {}
    for domain, (clique, nodes) in sorted(domains.items()):
        held_gpus: dict[str, set[int]] = {}
        for uid in members.get(domain, ()):
            allocation = fleet.allocation(uid)
            if allocation is not None:
                held_gpus.setdefault(allocation.node, set()).update(d.gpu_index for d in allocation.devices)
        for name in nodes:
            node = fleet.node(name)
            if node is None:
                troubles[(domain, name)] = f"node {name} left the fleet"
                continue
            sick = [
                g for g in node.hw.gpus if g.index in held_gpus.get(name, set()) and g.health != "healthy"
            ]
            if sick:
                gpu = sick[0]
                why = f": {gpu.health_reason}" if gpu.health_reason else ""
                troubles[(domain, name)] = f"GPU {gpu.index} ({gpu.uuid}) of node {name} is {gpu.health}{why}"
            elif node_clique(fleet, name) != clique:
                troubles[(domain, name)] = (
                    f"the GPUs of node {name} are no longer in the domain's NVLink clique"
                )
            elif _degraded(fleet, name):
                troubles[(domain, name)] = f"the NVLink fabric reports degraded bandwidth on node {name}"
    return troubles


def cliques_of(fleet: FleetState, *, fenced: Iterable[str] = ()) -> dict[str, list[str]]:
    """Fabric clique -> its nodes (less those fenced), for the nodes that are in one."""
    left_out = set(fenced)
    found: dict[str, list[str]] = {}
    for name in fleet.node_names:
        clique = node_clique(fleet, name)
        if clique is not None and name not in left_out:
            found.setdefault(clique, []).append(name)
    return {clique: sorted(nodes) for clique, nodes in sorted(found.items())}


def blocks_of(fleet: FleetState, *, fenced: Iterable[str] = ()) -> dict[str, list[str]]:
    """Network block -> its nodes (less those fenced), for the nodes labelled with one."""
    left_out = set(fenced)
    found: dict[str, list[str]] = {}
    for name in fleet.node_names:
        node = fleet.node(name)
        if node is not None and node.hw.network_block and name not in left_out:
            found.setdefault(node.hw.network_block, []).append(name)
    return {block: sorted(nodes) for block, nodes in sorted(found.items())}


def spans_blocks(fleet: FleetState, used: Iterable[str]) -> bool:
    """Whether a placement on these nodes leaves one network block: a node without a block label
    is a block of its own."""
    blocks = {(node.hw.network_block or name) if (node := fleet.node(name)) else name for name in used}
    return len(blocks) > 1


def candidates_for(
    fleet: FleetState, *, nvlink_domain: bool, fenced: set[str]
) -> list[tuple[str, list[str]]]:
    """(what the candidate is called in a reason, its nodes): the cliques for a domain, else each
    network block and then the whole fleet."""
    if nvlink_domain:
        return [(f"clique {c}", nodes) for c, nodes in cliques_of(fleet, fenced=fenced).items()]
    blocks = [(f"network block {b}", nodes) for b, nodes in blocks_of(fleet, fenced=fenced).items()]
    return [*blocks, ("", [n for n in fleet.node_names if n not in fenced])]


def place_gang(
    fleet: FleetState,
    claims: Sequence[Claim],
    classes: Mapping[str, DeviceClass],
    policy: Policy = "tangram",
    *,
    group: str,
    nvlink_domain: bool = False,
    fenced: Iterable[str] = (),
    within: str | None = None,
) -> GangPlaced | Failed:
    """Every claim placed, or a failure naming why the group does not fit; the fleet unchanged.

    `within`: the clique the group's claims already hold (a member decided again after its
    allocation was undone) is the only one it may join."""
    left_out = set(fenced)
    first = claims[0].uid if claims else ""
    candidates = candidates_for(fleet, nvlink_domain=nvlink_domain, fenced=left_out)
    if nvlink_domain:
        if within is not None:
            candidates = [(label, nodes) for label, nodes in candidates if label == f"clique {within}"]
        if not candidates and cliques_of(fleet):
            return Failed(
                claim_uid=first,
                reason=(
                    f"group {group} asks for one NVLink domain, and every node of the fleet's NVLink "
                    "fabric cliques serves another group's domain or is reserved for a preemption; "
                    "none of its claims is allocated"
                ),
                cause="capacity",
            )
        if not candidates:
            return Failed(
                claim_uid=first,
                reason=(
                    f"group {group} asks for one NVLink domain, and no node of the fleet is in an "
                    "NVLink fabric clique (GB200 NVL racks); none of its claims is allocated"
                ),
                cause="hardware",
            )
    best: tuple[tuple[int, int, int, int, int], GangPlaced] | None = None
    failures: list[tuple[str, Failed]] = []
    for order, (label, nodes) in enumerate(candidates):
        if best is not None and not label and not spans_blocks(fleet, best[1].nodes):
            break  # the fleet as a whole is tried only for what no one block holds
        outcome = placed_in(fleet, nodes, claims, classes, policy)
        if isinstance(outcome, Failed):
            failures.append((label, outcome))
            if outcome.cause == "claim":
                break  # the claim is at fault wherever it is tried
            continue
        trial, decisions = outcome
        used = {d.node for d in decisions}
        left_free = whole_free(trial, nodes)
        degraded = any(_degraded(fleet, n) for n in nodes)
        rank = (int(degraded), int(spans_blocks(fleet, used)), len(used), left_free, order)
        if best is None or rank < best[0]:
            clique = label.removeprefix("clique ") if nvlink_domain else None
            best = (rank, GangPlaced(decisions=decisions, clique=clique))
    if best is not None:
        return best[1]
    names = {c.uid: f"{c.namespace}/{c.name}" for c in claims}
    return _failed(group, names, first, failures, nvlink_domain=nvlink_domain)


def nodes_to_hold(
    fleet: FleetState,
    claims: Sequence[Claim],
    classes: Mapping[str, DeviceClass],
    policy: Policy = "tangram",
    *,
    nvlink_domain: bool,
    fenced: Iterable[str] = (),
) -> list[str]:
    """The nodes a waiting group is kept: where it would be placed were the claims there gone,
    choosing the clique (for a domain), the network block, or else the nodes with the most whole
    GPUs free now, so it fills soonest; none when the group could never be held.

    Without them a group waits for a moment when enough is free at once, and smaller claims asked
    after it take every GPU freed before that moment comes."""
    left_out = set(fenced)

    def placed_when_emptied(nodes: list[str]) -> list[str] | None:
        outcome = placed_in(
            fleet, nodes, claims, classes, policy, without=[u for n in nodes for u in fleet.holders(n)]
        )
        return None if isinstance(outcome, Failed) else sorted({d.node for d in outcome[1]})

    # a clique (or, for a group of no domain, a network block) that would hold it: the one with
    # the most whole GPUs free now
    within = [c for c in candidates_for(fleet, nvlink_domain=nvlink_domain, fenced=left_out) if c[0]]
    for _, nodes in sorted(within, key=lambda c: (-whole_free(fleet, c[1]), c[0])):
        found = placed_when_emptied(nodes)
        if found is not None:
            return found
    if nvlink_domain:
        return []
    ordered = sorted(
        (n for n in fleet.node_names if n not in left_out), key=lambda n: (-whole_free(fleet, [n]), n)
    )
    size = 1
    while True:
        found = placed_when_emptied(ordered[:size])
        if found is not None:
            return found
        if size >= len(ordered):
            return []
        size = min(size * 2, len(ordered))


def whole_free(fleet: FleetState, names: Iterable[str]) -> int:
    """Whole GPUs free on these nodes of the fleet."""
    return sum(sum(node.whole_free.values()) for name in names if (node := fleet.node(name)))


def placed_in(
    fleet: FleetState,
    nodes: list[str],
    claims: Sequence[Claim],
    classes: Mapping[str, DeviceClass],
    policy: Policy,
    *,
    without: Iterable[str] = (),
) -> tuple[FleetState, tuple[Allocated, ...]] | Failed:
    """Every claim decided in a trial of `nodes` (less the claims `without`), or the first failure."""
    trial = fleet.trial_of(nodes, without=without)
    decisions: list[Allocated] = []
    for claim in claims:
        decision = trial.allocate(claim, classes, policy)
        if not isinstance(decision, Allocated):
            return decision
        decisions.append(decision)
    return trial, tuple(decisions)


def _failed(
    group: str, names: dict[str, str], first: str, failures: list[tuple[str, Failed]], *, nvlink_domain: bool
) -> Failed:
    causes = [f.cause for _, f in failures]
    cause: FailureCause = min(causes, key=_CAUSE_ORDER.index) if causes else "capacity"
    where = "in any NVLink fabric clique" if nvlink_domain else "on the fleet"
    shown = [f for f in failures if f[1].cause == cause][:3]
    details = "; ".join(
        f"{label + ': ' if label else ''}claim {names.get(f.claim_uid, f.claim_uid)}: {f.reason}"
        for label, f in shown
    )
    more = f" (and {len(failures) - len(shown)} more)" if len(failures) > len(shown) else ""
    return Failed(
        claim_uid=first,
        reason=(
            f"group {group}: its {len(names)} claims do not all fit {where} at once, so none is "
            f"allocated: {details}{more}"
        ),
        cause=cause,
    )
