"""Pair facts between a node's GPUs as dense lookups: classic score, NVLink count, bandwidth."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from itertools import combinations
from math import comb

from tangram.events.inventory import GpuLink

# NVIDIA's device-plugin pair score per NVML topology level (same board 60 ... SYS 10); +100 per NVLink.
_LEVEL_SCORE: dict[int, int] = {0: 60, 10: 50, 20: 40, 30: 30, 40: 20, 50: 10}
_NVLINK_SCORE = 100
_EXHAUSTIVE_SETS = 4096
_CLIQUE_STEPS = 100_000  # search steps for the largest NVLink set of a component that is no clique


class PairTable:
    """Lookups by GPU index; a pair with no link facts counts as SYS without NVLink."""

    __slots__ = ("_bandwidth", "_nvlinks", "_score", "indexes")

    def __init__(self, indexes: Sequence[int], links: Iterable[GpuLink]) -> None:
        self.indexes = tuple(sorted(indexes))
        self._score: dict[tuple[int, int], int] = {}
        self._nvlinks: dict[tuple[int, int], int] = {}
        self._bandwidth: dict[tuple[int, int], float] = {}
        for link in links:
            score = _LEVEL_SCORE.get(link.pcie_level, _LEVEL_SCORE[50]) + _NVLINK_SCORE * link.nvlinks
            for key in ((link.a, link.b), (link.b, link.a)):
                self._score[key] = score
                self._nvlinks[key] = link.nvlinks
                self._bandwidth[key] = link.bandwidth_gbps

    def score(self, a: int, b: int) -> int:
        return self._score.get((a, b), _LEVEL_SCORE[50])

    def nvlinks(self, a: int, b: int) -> int:
        return self._nvlinks.get((a, b), 0)

    def bandwidth_gbps(self, a: int, b: int) -> float:
        return self._bandwidth.get((a, b), 0.0)

    def set_score(self, gpus: Iterable[int]) -> int:
        members = sorted(set(gpus))
        return sum(self.score(a, b) for a, b in combinations(members, 2))

    def min_bandwidth_gbps(self, gpus: Iterable[int]) -> float:
        members = sorted(set(gpus))
        return min((self.bandwidth_gbps(a, b) for a, b in combinations(members, 2)), default=0.0)

    def best_set_score(self, gpus: Iterable[int], k: int) -> int:
        """The highest set score of any k of these GPUs.

        Exhaustive up to _EXHAUSTIVE_SETS sets (every node of the catalogue: 8 GPUs is at most 70
        sets per k); beyond that an upper bound, the smaller of two: the k(k-1)/2 best pair scores,
        and half the k largest sums of a GPU's k-1 best pair scores (a set's score counts every
        pair once from each end). Both take time quadratic in the GPUs, never exponential.
        """
        members = sorted(set(gpus))
        if k < 2 or len(members) < k:
            return 0
        if comb(len(members), k) <= _EXHAUSTIVE_SETS:
            return max(self.set_score(c) for c in combinations(members, k))
        score = self.score
        best_pairs = heapq.nlargest(k * (k - 1) // 2, (score(a, b) for a, b in combinations(members, 2)))
        per_gpu = [sum(heapq.nlargest(k - 1, (score(g, h) for h in members if h != g))) for g in members]
        return min(sum(best_pairs), sum(heapq.nlargest(k, per_gpu)) // 2)

    def largest_nvlink_set(self, gpus: Iterable[int]) -> int:
        """The most of these GPUs that are NVLink-connected pairwise (1 when no pair is).

        Per connected component of the NVLink graph: a component that is a clique (an NVSwitch
        fabric, a bridged pair) counts whole; any other is searched, in at most _CLIQUE_STEPS steps
        (past them its size stands in: an answer never smaller than the truth).
        """
        members = sorted(set(gpus))
        if not members:
            return 0
        peers = {g: {h for h in members if h != g and self.nvlinks(g, h) > 0} for g in members}
        best = 1
        for component in _components(members, peers):
            if len(component) <= best:
                continue
            if all(len(peers[g] & component) == len(component) - 1 for g in component):
                best = len(component)
            else:
                best = max(best, _max_clique(component, peers, best))
        return best


def _components(members: list[int], peers: dict[int, set[int]]) -> list[set[int]]:
    seen: set[int] = set()
    out: list[set[int]] = []
    for start in members:
        if start in seen:
            continue
        component = {start}
        stack = [start]
        while stack:
            for h in peers[stack.pop()]:
                if h not in component:
                    component.add(h)
                    stack.append(h)
        seen |= component
        out.append(component)
    return out


def _max_clique(component: set[int], peers: dict[int, set[int]], floor: int) -> int:
    """The largest clique of the component (Bron-Kerbosch with pivots), or its size when the
    search takes more than _CLIQUE_STEPS steps."""
    best = floor
    steps = 0

    def expand(size: int, candidates: set[int], excluded: set[int]) -> None:
        nonlocal best, steps
        steps += 1
        if steps > _CLIQUE_STEPS:
            raise TimeoutError
        if not candidates and not excluded:
            best = max(best, size)
            return
        if size + len(candidates) <= best:
            return
        pivot = max(candidates | excluded, key=lambda g: len(peers[g] & candidates))
        for g in sorted(candidates - peers[pivot]):
            expand(size + 1, candidates & peers[g], excluded & peers[g])
            candidates = candidates - {g}
            excluded = excluded | {g}

    try:
        expand(0, set(component), set())
    except TimeoutError:
        return len(component)
    return best
