"""Invariants over random arrivals and departures: nothing over-committed, constraints kept, deterministic."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram.allocation import Allocated, FleetState
from tangram.events.inventory import NodeHardware
from tests.allocation.machines import CLASSES
from tests.allocation.traces import NODES, NUMA, make_claim, steps


def replay(order: list[NodeHardware], plan: list[tuple[Any, ...]]) -> tuple[FleetState, list[Any]]:
    state = FleetState()
    for hw in order:
        state.apply_inventory(hw)
    decisions: list[Any] = []
    live: list[str] = []
    for i, step in enumerate(plan):
        if step[0] == "release":
            decisions.append(state.release(live.pop(step[1] % len(live))) if live else None)
            continue
        decision = state.allocate(make_claim(i, step), CLASSES, step[3])
        decisions.append(decision)
        if isinstance(decision, Allocated):
            live.append(decision.claim_uid)
        check_invariants(state)
    return state, decisions


def check_invariants(state: FleetState) -> None:
    for name in state.node_names:
        node = state.node(name)
        assert node is not None
        shape = node.shape
        used: Counter[tuple[str, str]] = Counter()
        slices: dict[int, int] = {}
        for d in node.allocated:
            device = shape.devices[d]
            for set_name, counters in device.consumes:
                for counter, amount in counters:
                    used[(set_name, counter)] += amount
            if device.mask and device.size:
                assert slices.get(device.gpu_index, 0) & device.mask == 0, (
                    f"{name}: slices overlap on {device.name}"
                )
                slices[device.gpu_index] = slices.get(device.gpu_index, 0) | device.mask
        for (set_name, counter), amount in used.items():
            assert amount <= shape.counter_sets[set_name][counter], (
                f"{name}: {set_name}/{counter} over-committed"
            )
            assert node.remaining[set_name][counter] == shape.counter_sets[set_name][counter] - amount
    owners: Counter[tuple[str, str]] = Counter()
    for uid in state.snapshot()["claims"]:
        decision = state.allocation(uid)
        assert decision is not None
        for taken in decision.devices:
            owners[(decision.node, taken.device)] += 1
    assert all(count == 1 for count in owners.values())


# CPU-bound examples: minutes on a loaded 2-core machine, seconds on an idle one.
@pytest.mark.timeout(600)
@settings(max_examples=40, deadline=None)
@given(steps)
def test_nothing_is_ever_over_committed(plan: list[tuple[Any, ...]]) -> None:
    state, decisions = replay(NODES, plan)
    assert len(decisions) == len(plan)
    for step, decision in zip(plan, decisions, strict=True):
        if isinstance(decision, Allocated) and step[0] == "whole" and step[2]:
            node = state.node(decision.node)
            assert node is not None
            values = {
                node.devices[node.shape.index_by_name[d.device]].attributes[NUMA] for d in decision.devices
            }
            assert len(values) == 1


# CPU-bound examples: minutes on a loaded 2-core machine, seconds on an idle one.
@pytest.mark.timeout(600)
@settings(max_examples=20, deadline=None)
@given(steps, st.permutations(NODES))
def test_same_input_same_output_whatever_the_inventory_order(
    plan: list[tuple[Any, ...]], order: list[NodeHardware]
) -> None:
    first_state, first = replay(NODES, plan)
    second_state, second = replay(list(order), plan)
    assert first == second
    assert first_state.snapshot() == second_state.snapshot()
