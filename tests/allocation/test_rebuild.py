"""A fleet rebuilt from logged decisions decides exactly as the fleet that lived through them."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings

from tangram.allocation import Allocated, Claim, FleetState
from tangram.allocation.node import NodeState
from tangram.allocation.shape import shape_signature
from tangram.allocation.templates import DeviceTemplates
from tangram.dra import node_devices
from tangram.events.inventory import MigInstance, MigPlacement, NodeHardware
from tests.allocation.machines import CLASSES, a100_mig, claim, h100_nvl, hgx, profile_is, request
from tests.allocation.traces import NODES, make_claim, steps

FOLLOW_UP = [
    claim("next-2", request(count=2)),
    claim("next-mig", request(device_class="mig.gpu.tangram.dev", selectors=(profile_is("1g.10gb"),))),
    claim("next-3g", request(device_class="mig.gpu.tangram.dev", selectors=(profile_is("3g.40gb"),))),
    claim("next-4", request(count=4)),
    claim("next-1", request(count=1)),
]


def _availability(node: NodeState) -> tuple[Any, ...]:
    return (list(node.available), dict(node.occupied), dict(node.whole_free), node.bucket_key())


# CPU-bound examples: minutes on a loaded 2-core machine, seconds on an idle one.
@pytest.mark.timeout(600)
@settings(max_examples=25, deadline=None)
@given(steps)
def test_rebuilt_fleet_has_the_same_availability_and_makes_the_same_decisions(
    plan: list[tuple[Any, ...]],
) -> None:
    live = FleetState()
    rebuilt = FleetState()
    for hw in NODES:
        live.apply_inventory(hw)
        rebuilt.apply_inventory(hw)
    held: list[str] = []
    for i, step in enumerate(plan):
        if step[0] == "release":
            if held:
                uid = held.pop(step[1] % len(held))
                live.release(uid)
                rebuilt.release_replayed(uid)
            continue
        decision = live.allocate(make_claim(i, step), CLASSES, step[3])
        # The rebuild reads the request back from the log before the decision: the demand mix
        # is part of the fold.
        rebuilt.note_demand(make_claim(i, step), CLASSES)
        if isinstance(decision, Allocated):
            held.append(decision.claim_uid)
            rebuilt.adopt(decision)
    assert rebuilt.snapshot() == live.snapshot()
    for name in live.node_names:
        live_node, rebuilt_node = live.node(name), rebuilt.node(name)
        assert live_node is not None and rebuilt_node is not None
        assert _availability(rebuilt_node) == _availability(live_node)
    for follow in FOLLOW_UP:
        assert rebuilt.allocate(follow, CLASSES) == live.allocate(follow, CLASSES)


def _device_view(hw: NodeHardware, devices: list[Any]) -> list[Any]:
    # Attribute order matters too: the devices are published in this order.
    return [(msgspec.to_builtins(d), list(d.attributes)) for d in devices]


def _without_nvlink_domains(hw: NodeHardware) -> NodeHardware:
    return msgspec.structs.replace(hw, gpus=[msgspec.structs.replace(g, nvlink_domain=None) for g in hw.gpus])


def test_devices_derived_from_a_template_equal_the_devices_built_from_hardware() -> None:
    templates = DeviceTemplates("gpu.tangram.dev")
    used = MigInstance(
        uuid="MIG-used",
        profile="3g.40gb",
        profile_id=9,
        placement=MigPlacement(start=4, size=4),
        gpu_instance_id=2,
        compute_instance_id=0,
        in_use=True,
    )
    free = MigInstance(
        uuid="MIG-free",
        profile="1g.10gb",
        profile_id=19,
        placement=MigPlacement(start=0, size=1),
        gpu_instance_id=7,
        compute_instance_id=0,
    )
    first = a100_mig("a")
    variants = [
        first,
        a100_mig("b"),
        a100_mig("c", instances={1: [used, free], 3: [free]}),
        hgx("h1"),
        hgx("h2", gpu_extra={0: {"clique_id": "cluster.1"}}),
        _without_nvlink_domains(hgx("h3")),
        h100_nvl("nvl"),
    ]
    for hw in variants:
        derived = templates.devices(shape_signature(hw), hw)
        built = node_devices(hw, driver="gpu.tangram.dev", shared=True)
        assert _device_view(hw, derived.devices) == _device_view(hw, built.devices)
        assert derived.counter_sets == built.counter_sets
        assert (derived.node, derived.pool) == (hw.node, hw.node)
    uuids = {
        d.attributes.get("gpu.tangram.dev/uuid")
        for d in templates.devices(shape_signature(variants[2]), variants[2]).devices
    }
    assert {"MIG-used", "MIG-free", None} == uuids


def _two_gpus() -> Claim:
    return claim("pair", request(count=2))


def test_best_available_set_is_reported_when_no_nvlink_pair_is_free() -> None:
    fleet = FleetState()
    fleet.apply_inventory(h100_nvl("nvl"))
    # One GPU of every bridged pair (0-1, 2-3, 4-5, 6-7) is taken: no NVLink pair is left.
    for index in (0, 2, 4, 6):
        one = claim(
            f"one-{index}",
            request(count=1, selectors=(f'device.attributes["gpu.tangram.dev"].index == {index}',)),
        )
        assert isinstance(fleet.allocate(one, CLASSES), Allocated)
    decision = fleet.allocate(_two_gpus(), CLASSES)
    assert isinstance(decision, Allocated)
    # Bridged pair: same board (50) + 12 NVLinks (1200); free GPUs 1, 3 share a NUMA node (NODE: 20).
    assert decision.ideal_set_score == 1250
    assert decision.best_available_set_score == 20
    assert decision.set_score == 20
    assert sorted(d.gpu_index for d in decision.devices) in ([1, 3], [5, 7])


def test_best_available_set_equals_the_ideal_on_an_empty_node() -> None:
    fleet = FleetState()
    fleet.apply_inventory(h100_nvl("nvl"))
    decision = fleet.allocate(_two_gpus(), CLASSES)
    assert isinstance(decision, Allocated)
    assert (decision.set_score, decision.best_available_set_score, decision.ideal_set_score) == (
        1250,
        1250,
        1250,
    )
