"""Placement outcomes never depend on node names or on the order GPUs are listed in."""

from __future__ import annotations

import random

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram.allocation import Allocated, Claim, FleetState
from tangram.bench.traces import (
    BENCH_MIX,
    Arrival,
    build_fleet,
    claim_spec,
    fleet_gpus,
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


def admitted(nodes: list[NodeHardware], seed: int) -> int:
    state = FleetState()
    for hw in nodes:
        state.apply_inventory(hw)
    count = 0
    for op in OPS[seed]:
        if not isinstance(op, Arrival):
            state.release(op.uid)
            continue
        claim = Claim(namespace="t", name=op.uid, uid=op.uid, spec=claim_spec(op.shape))
        count += isinstance(state.allocate(claim, CLASSES), Allocated)
    return count


BASELINE = {seed: admitted(FLEET, seed) for seed in OPS}


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
    assert admitted(nodes, seed) == BASELINE[seed]
