"""Pair facts between a node's GPUs as dense lookups: classic score, NVLink count, bandwidth."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import combinations
from math import comb

from tangram.events.inventory import GpuLink

# NVIDIA's device-plugin pair score per NVML topology level (same board 60 ... SYS 10); +100 per NVLink.
_LEVEL_SCORE: dict[int, int] = {0: 60, 10: 50, 20: 40, 30: 30, 40: 20, 50: 10}
_NVLINK_SCORE = 100
_EXHAUSTIVE_SETS = 4096


class PairTable:
    """Lookups by GPU index; a pair with no link facts counts as SYS without NVLink."""

    __slots__ = ("_bandwidth", "_nvlinks", "_score", "indexes")

    def __init__(self, indexes: Sequence[int], links: Iterable[GpuLink]) -> None:
        self.indexes = tuple(sorted(indexes))
        self._score: dict[tuple[int, int], int] = {}
        self._nvlinks: dict[tuple[int, int], int] = {}
        self._bandwidth: dict[tuple[int, int], float] = {}
        for a, b in combinations(self.indexes, 2):
            self._score[(a, b)] = self._score[(b, a)] = _LEVEL_SCORE[50]
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
        sets per k); beyond that an upper bound, the k(k-1)/2 best pair scores.
        """
        members = sorted(set(gpus))
        if k < 2 or len(members) < k:
            return 0
        if comb(len(members), k) <= _EXHAUSTIVE_SETS:
            return max(self.set_score(c) for c in combinations(members, k))
        best_pairs = sorted((self.score(a, b) for a, b in combinations(members, 2)), reverse=True)
        return sum(best_pairs[: k * (k - 1) // 2])

    def best_set_scores(self, gpus: Sequence[int]) -> dict[int, int]:
        """k -> the highest set score of any k of these GPUs (exhaustive: 8 GPUs is at most 70 sets per k)."""
        best: dict[int, int] = {}
        for k in range(2, len(gpus) + 1):
            best[k] = max(self.set_score(c) for c in combinations(gpus, k))
        return best
