"""The search for a claim's node: candidates in policy order, each solved, the best committed.

Tangram's policy first places a claim of a kind the demand mix models where it costs expected
demand least (placement.DemandIndex), destroying free MIG instances when nothing fits otherwise;
every other claim, and every policy, goes through the general search over the node index.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from tangram.allocation.demand import ClaimKind
from tangram.allocation.eligibility import Eligible, NodeEligibility
from tangram.allocation.holdings import Holdings
from tangram.allocation.model import Allocated, Claim, Decision, Explanation, Failed, PartitionPlan, Policy
from tangram.allocation.node import NodeState
from tangram.allocation.nodeindex import NodeIndex
from tangram.allocation.placement import Choice, DemandIndex
from tangram.allocation.plans import commit, destroy_plan, reconfiguration
from tangram.allocation.requests import Alternative, ResolvedClaim, covers
from tangram.allocation.solver import Solution
from tangram.events.catalogue import FailureCause

EXPLAINED_CANDIDATES = 5  # groups of nodes listed, best first, in an explanation
TANGRAM_NODES_COMPARED = 16  # feasible nodes Tangram compares when none has the ideal GPU set
_FILTERED = "not enough free GPUs or MIG slices"


class Solver(Protocol):
    """solver.solve's signature: a solution on the node, or the reason there is none."""

    def __call__(
        self,
        node: NodeState,
        claim: ResolvedClaim,
        eligible: Callable[[Alternative], Eligible],
        *,
        scored: bool,
        first: tuple[int, ...] | None = None,
    ) -> Solution | str: ...


@dataclass(frozen=True, slots=True)
class Search:
    """One decision's search over the fleet's state; commits the claim where it is placed."""

    driver: str
    nodes: NodeIndex
    demand: DemandIndex
    eligibility: NodeEligibility
    holdings: Holdings
    reconfigure_foreign_instances: bool
    solve: Solver

    def place(
        self, claim: Claim, resolved: ResolvedClaim, policy: Policy, explain: bool, kind: ClaimKind | None
    ) -> Decision:
        if policy == "tangram" and kind is not None and not resolved.spread:
            decided = self._place_by_demand(claim, resolved, kind, explain)
            if decided is not None:
                return decided
        rejected: Counter[str] = Counter()
        hardware: set[str] = set()
        notes: list[str] = []
        best: tuple[NodeState, Solution] | None = None
        feasible = 0
        for node in self._candidates(resolved, policy, rejected, hardware):
            outcome = self.solve(
                node, resolved, partial(self.eligibility.for_claim, node), scored=policy == "tangram"
            )
            if isinstance(outcome, str):
                rejected[outcome] += 1
                if explain:
                    notes.append(f"{node.name}: {outcome}")
                continue
            feasible += 1
            if explain:
                notes.append(
                    f"{node.name}: fits (GPU set score {outcome.set_score}, best {outcome.ideal_set_score})"
                )
            if best is None or outcome.set_score > best[1].set_score:
                best = (node, outcome)
            if policy != "tangram" or outcome.ideal or feasible >= TANGRAM_NODES_COMPARED:
                break
        if best is None:
            summary = "; ".join(
                f"{count} node{'s' if count != 1 else ''}: {reason}"
                for reason, count in sorted(rejected.items(), key=lambda item: (-item[1], item[0]))
            )
            reason = f"0/{len(self.nodes.by_name)} nodes fit" + (f": {summary}" if summary else "")
            if explain:
                notes.extend(f"{count} nodes: {reason}" for reason, count in sorted(rejected.items()))
            # Every node turned down for what its hardware is (or no node at all): freed
            # capacity cannot help, a new node might.
            cause: FailureCause = "hardware" if set(rejected) <= hardware else "capacity"
            return Failed(claim_uid=claim.uid, reason=reason, explanation=notes, cause=cause)
        if explain:
            notes.append(f"chosen {best[0].name}")
            notes.extend(f"{count} nodes: {reason}" for reason, count in sorted(rejected.items()))
        return commit(
            claim,
            resolved,
            best[0],
            best[1],
            notes,
            driver=self.driver,
            nodes=self.nodes,
            holdings=self.holdings,
        )

    def _candidates(
        self, claim: ResolvedClaim, policy: Policy, rejected: Counter[str], hardware: set[str]
    ) -> Iterator[NodeState]:
        """Nodes that may fit the claim, in policy order. Reasons for the others go to `rejected`;
        those that no state of the node's hardware could change are also put in `hardware`."""
        self.nodes.reindex_changed()
        streams: list[Iterator[tuple[Any, ...]]] = []
        spread = policy == "tangram" and claim.spread
        for signature in sorted(self.nodes.buckets):
            buckets = {k: v for k, v in self.nodes.buckets[signature].items() if v}
            if not buckets:
                continue
            sample = self.nodes.by_name[buckets[next(iter(buckets))][0]]
            need_whole = 0
            need_slices = 0
            shape_reason = ""
            for request in claim.requests:
                sizes: list[int] = []
                reasons: list[str] = []
                for alt in request.alternatives:
                    found = None if alt.node_scoped else self.eligibility.for_claim(sample, alt)
                    if found is not None and found.reason:
                        reasons.append(f'request "{alt.result_name}": {found.reason}')
                    sizes.append(-1 if found is None else len(found.devices))
                if reasons and len(reasons) == len(request.alternatives):
                    shape_reason = reasons[0]
                    break
                if len(request.alternatives) != 1:
                    continue
                alt = request.alternatives[0]
                if alt.node_scoped or alt.admin or alt.all_mode:
                    continue
                if alt.count > sample.shape.largest_nvlink_set and any(
                    rule.nvlink and covers(rule.requests, alt) for rule in claim.topology
                ):
                    shape_reason = (
                        f'request "{alt.result_name}": at most {sample.shape.largest_nvlink_set} GPUs '
                        "of this hardware are NVLink-connected pairwise"
                    )
                    break
                matching = len(self.eligibility.on(sample, alt).devices)
                if matching < alt.count:
                    shape_reason = (
                        f'request "{alt.result_name}": only {matching} device'
                        f"{'s' if matching != 1 else ''} of this hardware match (needs {alt.count})"
                    )
                    break
                kinds = {sample.shape.devices[d].kind for d in self.eligibility.on(sample, alt).devices}
                if kinds == {"gpu"}:
                    need_whole += alt.count
                elif kinds == {"mig"}:
                    smallest = min(
                        sample.shape.devices[d].size for d in self.eligibility.on(sample, alt).devices
                    )
                    need_slices = max(need_slices, smallest)
            members = sum(len(v) for v in buckets.values())
            if shape_reason:
                rejected[shape_reason] += members
                hardware.add(shape_reason)
                continue
            for (free_whole, run), names in buckets.items():
                fits = free_whole >= need_whole and (
                    need_slices == 0 or run >= need_slices or free_whole >= 1
                )
                if not fits:
                    rejected[_FILTERED] += len(names)
                    continue
                if policy == "first-fit":
                    streams.append(_keyed((), names))
                elif spread:
                    streams.append(_keyed((-free_whole, -run), names))
                else:
                    streams.append(_keyed((free_whole, run), names))
        for entry in heapq.merge(*streams):
            yield self.nodes.by_name[entry[-1]]

    def _place_by_demand(
        self, claim: Claim, resolved: ResolvedClaim, kind: ClaimKind, explain: bool
    ) -> Decision | None:
        """Tangram's placement for a claim of a kind the demand mix models; None hands the claim
        to the general search (which also words the failure when nothing fits)."""
        self.nodes.reindex_changed()
        rejected: dict[str, int] = {}
        ranked: list[Choice] | None = [] if explain else None
        choice = self.demand.choose(kind, self.nodes.by_name, rejected, ranked)
        destroy: list[PartitionPlan] = []
        saved: set[tuple[int, int, int]] | None = None
        if choice is None:
            found = reconfiguration(
                self.demand,
                self.nodes,
                self.holdings.made,
                kind,
                ranked,
                foreign=self.reconfigure_foreign_instances,
            )
            if found is None:
                return None
            choice, needed = found
            saved = set(choice.node.destroying)
            choice.node.set_destroying(saved | {(g, inst.profile_id, inst.start) for g, inst in needed})
            destroy = [destroy_plan(choice.node, g, inst) for g, inst in needed]
        decided: Allocated | None = None
        try:
            decided = self._settle(
                claim,
                resolved,
                choice,
                kind=kind,
                explain=explain,
                destroy=destroy,
                ranked=ranked,
                rejected=rejected,
            )
        finally:
            # Not placed there (or failed on the way): the instances marked are not destroyed.
            if decided is None and saved is not None:
                choice.node.set_destroying(saved)
        return decided

    def _settle(
        self,
        claim: Claim,
        resolved: ResolvedClaim,
        choice: Choice,
        *,
        kind: ClaimKind,
        explain: bool,
        destroy: list[PartitionPlan],
        ranked: list[Choice] | None,
        rejected: dict[str, int],
    ) -> Allocated | None:
        """The claim's devices on the chosen node, committed; None when they cannot be found there."""
        node = choice.node
        outcome = self.solve(
            node,
            resolved,
            partial(self.eligibility.for_claim, node),
            scored=True,
            first=choice.option.devices,
        )
        if isinstance(outcome, str):
            return None
        why: Explanation | None = None
        notes: list[str] = []
        if explain:
            alike = len(self.demand.groups.get(choice.group, ())) or 1
            chosen = self.demand.score(choice, alike, len(destroy))
            best_per_group: dict[tuple[Any, ...], Choice] = {}
            for candidate in sorted(ranked or [], key=lambda c: c.rank):
                best_per_group.setdefault(candidate.group, candidate)
            why = Explanation(
                policy="tangram",
                claim_kind=kind.label,
                chosen=chosen,
                terms=self.demand.explain(choice),
                candidates=[
                    self.demand.score(c, len(self.demand.groups.get(c.group, ())) or 1)
                    for c in list(best_per_group.values())[:EXPLAINED_CANDIDATES]
                ],
                rejected=dict(sorted(rejected.items())),
            )
            notes.append(
                f"chosen {node.name} (demand-weighted loss {choice.loss:g}, "
                f"{alike} node{'s' if alike != 1 else ''} in the same state)"
            )
            notes.extend(
                f"{term.kind}: fits {term.fits_before} -> {term.fits_after}, weight {term.weight:g} "
                f"(demand {term.demand:g} / supply {term.supply}), loss {term.loss:g}"
                for term in why.terms
            )
            notes.extend(f"{count} nodes: {reason}" for reason, count in sorted(rejected.items()))
        return commit(
            claim,
            resolved,
            node,
            outcome,
            notes,
            driver=self.driver,
            nodes=self.nodes,
            holdings=self.holdings,
            why=why,
            destroy=destroy,
        )


def _keyed(prefix: tuple[int, ...], names: list[str]) -> Iterator[tuple[Any, ...]]:
    for name in names:
        yield (*prefix, name)
