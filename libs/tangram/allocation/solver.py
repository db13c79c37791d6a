"""Find devices on one node for every request of a claim: DRA semantics, then Tangram's preferences.

The search is the Kubernetes allocator's backtracking (request by request, alternatives in order,
devices one choice at a time); policies differ only in the order they offer choices: the
baselines take devices in ResourceSlice order, Tangram by topology and fragmentation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, combinations
from math import comb

from tangram.allocation.eligibility import Eligible
from tangram.allocation.node import NodeState
from tangram.allocation.requests import Alternative, ResolvedClaim, covers
from tangram.allocation.shape import SIZE_CLASSES, placement_loss
from tangram.allocation.spec import MAX_RESULTS
from tangram.dra.model import AttributeValue

SEARCH_LIMIT = 4000  # choices tried per node before giving up on it
_SCORED_SETS_LIMIT = 512  # enumerate and rank every GPU set up to this many


@dataclass(frozen=True, slots=True)
class Solution:
    picks: tuple[tuple[Alternative, tuple[int, ...]], ...]
    set_score: int  # summed over requests that span several GPUs
    ideal_set_score: int  # what the best sets of the node's GPUs would score, were all free
    best_available_set_score: int  # what the best sets of the GPUs free at decision time score

    @property
    def ideal(self) -> bool:
        return self.set_score >= self.ideal_set_score


class _Failure(Exception):
    pass


class _Search:
    def __init__(
        self,
        node: NodeState,
        claim: ResolvedClaim,
        eligible: Callable[[Alternative], Eligible],
        scored: bool,
        first: tuple[int, ...] | None = None,
    ) -> None:
        self.first = first
        self.node = node
        self.claim = claim
        self.eligible = eligible
        self.scored = scored
        self.used: set[int] = set()
        self.consumed: dict[tuple[str, str], int] = {}
        self.matched: dict[int, AttributeValue] = {}
        self.distinct: dict[int, set[AttributeValue]] = {}
        self.topology_gpus: dict[int, list[int]] = {}
        self.picks: list[tuple[Alternative, tuple[int, ...]]] = []
        self.offered: dict[int, list[int]] = {}  # depth -> free devices its last choices came from
        self.results = 0
        self.steps = 0
        self.failure = (-1, "")

    # --- reasons -------------------------------------------------------------------------------

    def fail(self, depth: int, reason: str) -> None:
        if depth > self.failure[0]:
            self.failure = (depth, reason)

    # --- search --------------------------------------------------------------------------------

    def run(self) -> bool:
        return self._request(0)

    def _request(self, depth: int) -> bool:
        if depth == len(self.claim.requests):
            return True
        for alt in self.claim.requests[depth].alternatives:
            for choice in self._choices(depth, alt):
                self.steps += 1
                if self.steps > SEARCH_LIMIT:
                    self.fail(len(self.claim.requests), "search limit reached before a solution was found")
                    raise _Failure
                undo = self._take(depth, alt, choice)
                if undo is None:
                    continue
                if self._request(depth + 1):
                    return True
                undo()
        return False

    def _choices(self, depth: int, alt: Alternative) -> Iterator[tuple[int, ...]]:
        found = self.eligible(alt)
        name = f'request "{alt.result_name}"'
        if found.reason:
            self.fail(depth, f"{name}: {found.reason}")
            return iter(())
        available = self.node.available
        if alt.all_mode:
            if not alt.admin and not all(available[d] for d in found.devices):
                self.fail(
                    depth, f"{name}: allocationMode All needs every matching device and some are in use"
                )
                return iter(())
            return iter((found.devices,))
        free = [d for d in found.devices if (alt.admin or available[d]) and d not in self.used]
        self.offered[depth] = free
        if len(free) < alt.count:
            what = f'class "{alt.class_name}"{" and selectors" if len(alt.selectors) > 1 else ""}'
            if alt.count == 1:
                self.fail(depth, f"{name}: no free device matches {what}")
            else:
                self.fail(depth, f"{name}: not enough free devices match {what} (needs {alt.count})")
            return iter(())
        if not self.scored:
            return combinations(free, alt.count)
        first = self.first
        if depth == 0 and first is not None and len(first) == alt.count and set(first) <= set(free):
            # The placement chosen is taken almost always: the rest is ranked only if it is not.
            return chain((first,), self._ranked_later(free, alt.count))
        return self._ranked(free, alt.count)

    def _take(self, depth: int, alt: Alternative, choice: tuple[int, ...]) -> Callable[[], None] | None:
        name = f'request "{alt.result_name}"'
        if any(d in self.used for d in choice) or len(set(choice)) != len(choice):
            return None
        if self.results + len(choice) > MAX_RESULTS:
            self.fail(depth, f"{name}: a claim gets at most {MAX_RESULTS} devices")
            return None
        shape = self.node.shape
        consumed: dict[tuple[str, str], int] = {}
        if not alt.admin:
            for d in choice:
                for set_name, counters in shape.devices[d].consumes:
                    remaining = self.node.remaining[set_name]
                    for counter, amount in counters:
                        key = (set_name, counter)
                        total = self.consumed.get(key, 0) + consumed.get(key, 0) + amount
                        if total > remaining.get(counter, 0):
                            self.fail(depth, f"{name}: the free devices share counters another request uses")
                            return None
                        consumed[key] = consumed.get(key, 0) + amount
        new_match: dict[int, AttributeValue] = {}
        new_distinct: dict[int, list[AttributeValue]] = {}
        for ci, constraint in enumerate(self.claim.constraints):
            if not covers(constraint.requests, alt):
                continue
            kind = "matchAttribute" if constraint.match else "distinctAttribute"
            seen = set(self.distinct.get(ci, ()))
            for d in choice:
                value = self.node.devices[d].attributes.get(constraint.attribute)
                if value is None:
                    self.fail(
                        depth, f"{name}: no free devices with attribute {constraint.attribute} ({kind})"
                    )
                    return None
                if constraint.match:
                    wanted = new_match.get(ci, self.matched.get(ci, value))
                    if value != wanted or type(value) is not type(wanted):
                        self.fail(depth, f"{name}: no free devices satisfy {kind} {constraint.attribute}")
                        return None
                    new_match[ci] = value
                else:
                    if value in seen:
                        self.fail(depth, f"{name}: no free devices satisfy {kind} {constraint.attribute}")
                        return None
                    seen.add(value)
                    new_distinct.setdefault(ci, []).append(value)
        new_gpus: dict[int, list[int]] = {}
        for ti, rule in enumerate(self.claim.topology):
            if not covers(rule.requests, alt):
                continue
            before = self.topology_gpus.get(ti, [])
            members = sorted(set(before))
            for d in choice:
                g = shape.devices[d].gpu_index
                if g in members:
                    continue
                for h in members:
                    if rule.nvlink and shape.pairs.nvlinks(g, h) == 0:
                        self.fail(depth, f"{name}: no free GPUs are NVLink-connected pairwise")
                        return None
                    if shape.pairs.bandwidth_gbps(g, h) < rule.min_bandwidth_gbps:
                        self.fail(
                            depth,
                            f"{name}: no free GPUs have >= {rule.min_bandwidth_gbps:g} GB/s "
                            "between every pair",
                        )
                        return None
                members.append(g)
            new_gpus[ti] = [shape.devices[d].gpu_index for d in choice]

        self.used.update(choice)
        for key, amount in consumed.items():
            self.consumed[key] = self.consumed.get(key, 0) + amount
        fresh_match = [ci for ci in new_match if ci not in self.matched]
        self.matched.update(new_match)
        for ci, values in new_distinct.items():
            self.distinct.setdefault(ci, set()).update(values)
        for ti, gpus in new_gpus.items():
            self.topology_gpus.setdefault(ti, []).extend(gpus)
        self.picks.append((alt, choice))
        self.results += len(choice)

        def undo() -> None:
            self.used.difference_update(choice)
            for key, amount in consumed.items():
                self.consumed[key] -= amount
            for ci in fresh_match:
                del self.matched[ci]
            for ci, values in new_distinct.items():
                self.distinct[ci].difference_update(values)
            for ti, gpus in new_gpus.items():
                del self.topology_gpus[ti][-len(gpus) :]
            self.picks.pop()
            self.results -= len(choice)

        return undo

    # --- Tangram's order -----------------------------------------------------------------------

    def _ranked_later(self, free: Sequence[int], count: int) -> Iterator[tuple[int, ...]]:
        """_ranked's order, worked out when the first choice is asked for, not before."""
        yield from self._ranked(free, count)

    def _ranked(self, free: Sequence[int], count: int) -> Iterator[tuple[int, ...]]:
        node = self.node
        shape = node.shape
        free_whole = [g for g, ok in node.whole_free.items() if ok]
        occupied = node.occupied

        def single(d: int) -> tuple[int, tuple[int, ...], int, int]:
            device = shape.devices[d]
            gpu = shape.gpus[device.gpu_index]
            if device.size:
                loss = placement_loss(gpu.placements, occupied[gpu.index], device.mask)
                size = device.size
            else:
                loss = (0,) * len(SIZE_CLASSES)
                size = SIZE_CLASSES[0]
            connected = 0
            if device.kind == "gpu":
                connected = sum(shape.pairs.score(gpu.index, h) for h in free_whole if h != gpu.index)
            return size, loss, connected, d

        ordered = sorted(free, key=single)
        if count == 1:
            return ((d,) for d in ordered)
        whole_only = all(shape.devices[d].kind == "gpu" for d in free)
        if not whole_only or comb(len(free), count) > _SCORED_SETS_LIMIT:
            return combinations(ordered, count)
        pairs = shape.pairs

        def ranked(devices: tuple[int, ...]) -> tuple[int, float, int, tuple[int, ...]]:
            gpus = [shape.devices[d].gpu_index for d in devices]
            rest = [h for h in free_whole if h not in gpus]
            outward = sum(pairs.score(g, h) for g in gpus for h in rest)
            return -pairs.set_score(gpus), -pairs.min_bandwidth_gbps(gpus), outward, devices

        return iter(sorted(combinations(sorted(free), count), key=ranked))


def solve(
    node: NodeState,
    claim: ResolvedClaim,
    eligible: Callable[[Alternative], Eligible],
    *,
    scored: bool,
    first: tuple[int, ...] | None = None,
) -> Solution | str:
    """A solution on this node, or the reason there is none; `first` is tried first for the
    first request (the placement the fleet chose), the usual order after it."""
    search = _Search(node, claim, eligible, scored, first)
    try:
        found = search.run()
    except _Failure:
        found = False
    if not found:
        return search.failure[1] or "no combination of free devices satisfies the claim"
    shape = node.shape
    set_score = ideal = best_available = 0
    for depth, (alt, choice) in enumerate(search.picks):
        if alt.admin:
            continue
        gpus = {shape.devices[d].gpu_index for d in choice}
        if len(gpus) > 1:
            score = shape.pairs.set_score(gpus)
            set_score += score
            ideal += shape.best_set_score(len(gpus))
            offered = {shape.devices[d].gpu_index for d in search.offered.get(depth, choice)}
            best_available += max(score, shape.pairs.best_set_score(offered | gpus, len(gpus)))
    return Solution(
        picks=tuple(search.picks),
        set_score=set_score,
        ideal_set_score=ideal,
        best_available_set_score=best_available,
    )
