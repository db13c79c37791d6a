"""Placement outcomes never depend on node names or on the order GPUs are listed in."""

from __future__ import annotations

import random

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram.allocation import Allocated, Claim, FleetState
from tangram.bench.traces import (
    BENCH_MIX,
    FLEET_MIX,
    Arrival,
    Op,
    build_fleet,
    churn_trace,
    claim_spec,
    fleet_gpus,
    mean_demand,
    saturating_trace,
    shipped_classes,
)
from tangram.events.inventory import NodeHardware, renamed_machine

CLASSES = shipped_classes()
FLEET = build_fleet([("hgx-h200", 1), ("h100-nvl-4x2", 1), ("l40s-8", 1)])
OPS = {
    seed: saturating_trace(seed, fleet_gpus(FLEET), churn_claims=20, saturation=1.2, mix=BENCH_MIX)
    for seed in range(3)
}


def admitted(nodes: list[NodeHardware], ops: list[Op]) -> int:
    state = FleetState()
    for hw in nodes:
        state.apply_inventory(hw)
    count = 0
    for op in ops:
        if not isinstance(op, Arrival):
            state.release(op.uid)
            continue
        claim = Claim(namespace="t", name=op.uid, uid=op.uid, spec=claim_spec(op.shape))
        count += isinstance(state.allocate(claim, CLASSES), Allocated)
    return count


BASELINE = {seed: admitted(FLEET, ops) for seed, ops in OPS.items()}


@settings(max_examples=8, deadline=None)
@given(seed=st.sampled_from(sorted(OPS)), shuffle=st.randoms(use_true_random=False))
def test_renaming_nodes_and_reordering_gpus_admit_the_same_claims(seed: int, shuffle: random.Random) -> None:
    names = [f"n{shuffle.getrandbits(24):06x}-{i}" for i in range(len(FLEET))]
    nodes = []
    for hw, name in zip(FLEET, names, strict=True):
        gpus = list(hw.gpus)
        shuffle.shuffle(gpus)
        nodes.append(renamed_machine(msgspec.structs.replace(hw, gpus=gpus), name))
    shuffle.shuffle(nodes)
    assert admitted(nodes, OPS[seed]) == BASELINE[seed]


KINDS = ("hgx-h200", "h100-nvl-4x2", "l40s-8")
# two of each kind: ties between nodes alike, and between nodes unlike that names could break
KIND_FLEET = build_fleet([(kind, 2) for kind in KINDS])
CHURN = {
    seed: churn_trace(seed, 120, 1.2 * fleet_gpus(KIND_FLEET) / mean_demand(FLEET_MIX), FLEET_MIX)
    for seed in range(3)
}


CHURN_BASELINE = {seed: admitted(KIND_FLEET, ops) for seed, ops in CHURN.items()}


@settings(max_examples=10, deadline=None)
@given(
    seed=st.sampled_from(sorted(CHURN)),
    order=st.permutations(KINDS),
    shuffle=st.randoms(use_true_random=False),
)
def test_names_that_sort_the_kinds_in_any_order_admit_the_same_churn(
    seed: int, order: list[str], shuffle: random.Random
) -> None:
    """Names sorting the H200 nodes first, last or between the L40S and H100 NVL nodes: a tie
    between nodes that are not alike broken by name would admit a different count."""
    nodes = []
    for i, hw in enumerate(KIND_FLEET):
        rank = order.index(hw.node.rsplit("-", 1)[0])
        gpus = list(hw.gpus)
        shuffle.shuffle(gpus)
        name = f"{'abc'[rank]}{shuffle.getrandbits(16):04x}-{i}"
        nodes.append(renamed_machine(msgspec.structs.replace(hw, gpus=gpus), name))
    assert admitted(nodes, CHURN[seed]) == CHURN_BASELINE[seed]
