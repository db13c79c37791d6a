"""Nodes at the bound of 128 GPUs: decisions complete and keep their NVLink promises.

The node is generated (tests/support/machinegen.py): GPUs 0-63 on one NVSwitch fabric, 64-127 in bridged
pairs. Whether a chosen set is NVLink-connected is computed from that description, not from the
allocator's own tables.
"""

from __future__ import annotations

import random
from itertools import combinations

import pytest

from tangram.allocation import FleetState
from tangram.allocation.capacity import _exact_sets, _sets, cliques_in_order
from tangram.allocation.links import PairTable
from tangram.events.inventory import GpuLink, NodeHardware
from tangram.hardware.machines import MAX_GPUS_PER_MACHINE, parse_machine
from tangram.nvml.inventory import read_node_hardware
from tangram.nvml.sim.backend import SimNvml
from tests.allocation.machines import CLASSES, claim, index_is, nvlink_config, request
from tests.support.fleets import gpus_of, reason_of
from tests.support.machinegen import machine

DOC = machine(MAX_GPUS_PER_MACHINE, "half", name="big")
SWITCHED = set(DOC["nvlink"]["switch"]["gpus"])
BRIDGES = {frozenset(pair) for pair in DOC["nvlink"]["bridges"]}


def nvlinked(a: int, b: int) -> bool:
    return (a in SWITCHED and b in SWITCHED) or frozenset((a, b)) in BRIDGES


@pytest.fixture(scope="module")
def hardware() -> NodeHardware:
    nvml = SimNvml(parse_machine(DOC, source="big.yaml"))
    nvml.nvmlInit()
    return read_node_hardware(nvml, "big")


@pytest.mark.timeout(60)
def test_nvlink_claims_on_a_128_gpu_node_get_connected_sets(hardware: NodeHardware) -> None:
    assert len(hardware.gpus) == 128
    fleet = FleetState()
    fleet.apply_inventory(hardware)
    chosen: list[list[int]] = []
    for name, count, selectors in [
        ("one", 1, ()),
        ("two", 2, ()),
        ("eight", 8, ()),
        ("bridged", 2, (index_is(*range(64, 128)),)),
        ("four", 4, ()),
    ]:
        config = nvlink_config("gpus") if count > 1 else []
        spec = claim(name, request(count=count, selectors=selectors), config=config)
        gpus = gpus_of(fleet.allocate(spec, CLASSES, "tangram"))
        assert len(set(gpus)) == count
        assert all(nvlinked(a, b) for a, b in combinations(gpus, 2)), (name, gpus)
        chosen.append(gpus)
    assert all(g >= 64 for g in chosen[3]) and frozenset(chosen[3]) in BRIDGES
    every = [g for gpus in chosen for g in gpus]
    assert len(every) == len(set(every))  # no GPU handed out twice


@pytest.mark.timeout(60)
def test_more_gpus_than_the_largest_nvlink_set_are_refused_with_the_reason() -> None:
    nvml = SimNvml(parse_machine(machine(MAX_GPUS_PER_MACHINE, "bridges"), source="pairs.yaml"))
    nvml.nvmlInit()
    fleet = FleetState()
    fleet.apply_inventory(read_node_hardware(nvml, "pairs"))
    decision = fleet.allocate(
        claim("four", request(count=4), config=nvlink_config("gpus")), CLASSES, "tangram"
    )
    assert "at most 2 GPUs of this hardware are NVLink-connected pairwise" in reason_of(decision)
    gpus = gpus_of(
        fleet.allocate(claim("two", request(count=2), config=nvlink_config("gpus")), CLASSES, "tangram")
    )
    assert gpus[0] % 2 == 0 and gpus[1] == gpus[0] + 1  # a bridged pair


def random_graph(rng: random.Random, n: int) -> tuple[int, ...]:
    """A symmetric compatibility relation on n GPUs: cliques, pairs and a few stray edges."""
    compatible = [0] * n
    order = list(range(n))
    rng.shuffle(order)
    while order:
        size = rng.choice((1, 2, 3, 4, 5))
        group, order = order[:size], order[size:]
        for a, b in combinations(group, 2):
            compatible[a] |= 1 << b
            compatible[b] |= 1 << a
    for _ in range(rng.randrange(3) if n > 1 else 0):
        a, b = rng.sample(range(n), 2)
        compatible[a] |= 1 << b
        compatible[b] |= 1 << a
    return tuple(compatible)


def test_counting_by_component_is_the_exact_count() -> None:
    rng = random.Random(20)
    for _ in range(300):
        n = rng.randrange(2, 11)
        compatible = random_graph(rng, n)
        bits = rng.randrange(1 << n)
        for k in range(1, 5):
            assert _sets(bits, k, compatible) == _exact_sets(bits, k, compatible), (bits, k, compatible)


def test_compatible_sets_come_in_the_order_of_combinations() -> None:
    rng = random.Random(21)
    for _ in range(200):
        n = rng.randrange(2, 11)
        compatible = random_graph(rng, n)
        free = sorted(rng.sample(range(n), rng.randrange(1, n + 1)))
        k = rng.randrange(1, 5)
        expected = [
            sum(1 << g for g in c)
            for c in combinations(free, k)
            if all(compatible[a] >> b & 1 for a, b in combinations(c, 2))
        ]
        assert list(cliques_in_order(sum(1 << g for g in free), k, compatible)) == expected


def test_largest_nvlink_set_is_the_largest_clique() -> None:
    rng = random.Random(22)
    for _ in range(200):
        n = rng.randrange(1, 11)
        compatible = random_graph(rng, n)
        links = [
            GpuLink(a=a, b=b, nvlinks=1 if compatible[a] >> b & 1 else 0, bandwidth_gbps=0.0, pcie_level=50)
            for a, b in combinations(range(n), 2)
        ]
        brute = max(
            (
                len(c)
                for size in range(1, n + 1)
                for c in combinations(range(n), size)
                if all(compatible[a] >> b & 1 for a, b in combinations(c, 2))
            ),
            default=0,
        )
        assert PairTable(range(n), links).largest_nvlink_set(range(n)) == brute
