"""How a node's GPUs are connected: links, NVLink domains and the classic pair/set scores.

Pure: built from facts already read (by the NVML inventory, or from a machine description).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from tangram.events.inventory import GpuInfo, GpuLink, NodeHardware
from tangram.hardware.catalogue import PRODUCTS

# NVML topology levels (nvmlGpuTopologyLevel_t) and nvidia-smi's names for them.
LEVEL_INTERNAL = 0  # same board
LEVEL_SINGLE = 10  # PIX
LEVEL_MULTIPLE = 20  # PXB
LEVEL_HOSTBRIDGE = 30  # PHB
LEVEL_NODE = 40  # NODE
LEVEL_SYSTEM = 50  # SYS

LEVEL_NAMES: dict[int, str] = {0: "BOARD", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

# The score NVIDIA's device-plugin allocator (and HAMi) gives each PCIe level; +100 per NVLink.
PCIE_LEVEL_SCORE: dict[int, int] = {0: 60, 10: 50, 20: 40, 30: 30, 40: 20, 50: 10}
NVLINK_SCORE = 100


@dataclass(frozen=True, slots=True)
class PairFacts:
    """What was observed between GPUs a and b (a < b)."""

    a: int
    b: int
    nvlinks: int
    pcie_level: int
    p2p: bool = True


def pair_score(pcie_level: int, nvlinks: int) -> int:
    if pcie_level not in PCIE_LEVEL_SCORE:
        raise ValueError(
            f"unknown PCIe topology level {pcie_level}; expected one of {sorted(PCIE_LEVEL_SCORE)}"
        )
    return PCIE_LEVEL_SCORE[pcie_level] + NVLINK_SCORE * nvlinks


def link_gbps(products: Iterable[str]) -> float:
    """Per-link NVLink bandwidth between GPUs of these products: the slowest end sets it."""
    rates = []
    for key in products:
        spec = PRODUCTS[key].nvlink if key in PRODUCTS else None
        if spec is None:
            return 0.0
        rates.append(spec.gbps_per_link)
    return min(rates) if rates else 0.0


def compute_links(gpus: Sequence[GpuInfo], facts: Iterable[PairFacts]) -> list[GpuLink]:
    by_index = {g.index: g for g in gpus}
    links: list[GpuLink] = []
    for f in sorted(facts, key=lambda f: (min(f.a, f.b), max(f.a, f.b))):
        a, b = min(f.a, f.b), max(f.a, f.b)
        gbps = f.nvlinks * link_gbps((by_index[a].product, by_index[b].product)) if f.nvlinks else 0.0
        links.append(
            GpuLink(a=a, b=b, nvlinks=f.nvlinks, bandwidth_gbps=gbps, pcie_level=f.pcie_level, p2p=f.p2p)
        )
    return links


def nvlink_domains(
    node: str,
    indexes: Sequence[int],
    links: Iterable[GpuLink],
    *,
    switch_groups: Mapping[int, str] | None = None,
    cliques: Mapping[int, str] | None = None,
) -> dict[int, str | None]:
    """One domain value per set of GPUs that are pairwise NVLink-connected.

    switch_groups: GPU index -> an id of the NVSwitch set its links end at (HGX/DGX); cliques:
    GPU index -> fabric clique ("<cluster uuid>.<clique>"), which spans nodes (GB200 NVL).
    Other GPUs are grouped by direct links (bridged pairs); a group that is not a full clique
    gets no domain, since a shared value promises every pair is connected.
    """
    domains: dict[int, str | None] = dict.fromkeys(indexes)
    for index, clique in (cliques or {}).items():
        domains[index] = f"clique-{clique}"
    for index, group in (switch_groups or {}).items():
        if domains.get(index) is None:
            domains[index] = f"{node}/nvswitch-{group}"
    connected: dict[int, set[int]] = {i: set() for i in indexes}
    for link in links:
        if link.nvlinks > 0:
            connected[link.a].add(link.b)
            connected[link.b].add(link.a)
    seen: set[int] = set()
    for start in indexes:
        if start in seen or domains[start] is not None or not connected[start]:
            continue
        component, stack = {start}, [start]
        while stack:
            for peer in connected[stack.pop()]:
                if peer not in component and domains[peer] is None:
                    component.add(peer)
                    stack.append(peer)
        seen |= component
        if all(connected[x] >= component - {x} for x in component):
            name = f"{node}/nvlink-" + "-".join(str(i) for i in sorted(component))
            for member in component:
                domains[member] = name
    return domains


class Topology:
    """Pair lookups in O(1) for the allocator; built once per node inventory."""

    __slots__ = ("_links", "indexes")

    def __init__(self, indexes: Sequence[int], links: Iterable[GpuLink]) -> None:
        self.indexes = tuple(indexes)
        self._links: dict[tuple[int, int], GpuLink] = {}
        for link in links:
            self._links[(link.a, link.b)] = link
            self._links[(link.b, link.a)] = link

    @classmethod
    def from_hardware(cls, hw: NodeHardware) -> Topology:
        return cls([g.index for g in hw.gpus], hw.links)

    def link(self, a: int, b: int) -> GpuLink:
        try:
            return self._links[(a, b)]
        except KeyError:
            raise KeyError(f"no link facts between GPU {a} and GPU {b}") from None

    def nvlinks(self, a: int, b: int) -> int:
        return self.link(a, b).nvlinks

    def bandwidth_gbps(self, a: int, b: int) -> float:
        return self.link(a, b).bandwidth_gbps

    def pair_score(self, a: int, b: int) -> int:
        link = self.link(a, b)
        return pair_score(link.pcie_level, link.nvlinks)

    def set_score(self, indexes: Iterable[int]) -> int:
        members = sorted(set(indexes))
        return sum(self.pair_score(a, b) for a, b in combinations(members, 2))

    def min_bandwidth_gbps(self, indexes: Iterable[int]) -> float:
        """The weakest pair's NVLink bandwidth; 0 for a set with a pair not on NVLink."""
        members = sorted(set(indexes))
        pairs = list(combinations(members, 2))
        return min((self.bandwidth_gbps(a, b) for a, b in pairs), default=0.0)
