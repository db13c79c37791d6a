"""Where Tangram places claims (topology, fragmentation, Pack/Spread) and what the baselines do instead."""

from __future__ import annotations

from typing import Any

from tangram.allocation import Allocated
from tests.allocation.machines import (
    CLASSES,
    DRIVER,
    a100_mig,
    claim,
    h100_nvl,
    hgx,
    index_is,
    l40s,
    nvlink_config,
    profile_is,
    request,
)
from tests.support.fleets import fleet, gpus_of

MIG = "mig.gpu.tangram.dev"


def on_node(name: str, attribute: str = "uuid") -> str:
    return f'device.attributes["{DRIVER}"].{attribute}.startsWith("GPU-{name}-")'


def gpus(decision: Any) -> list[int]:
    return sorted(gpus_of(decision))


def test_four_gpus_on_nvl_node_get_two_bridged_pairs() -> None:
    state = fleet(h100_nvl("n1"))
    assert gpus(state.allocate(claim("one", request()), CLASSES)) == [0]
    four = state.allocate(claim("four", request(count=4)), CLASSES)
    assert gpus(four) == [4, 5, 6, 7]
    assert isinstance(four, Allocated) and four.set_score == four.ideal_set_score


def test_two_gpus_on_nvl_node_get_a_bridged_pair() -> None:
    state = fleet(h100_nvl("n1"))
    assert gpus(state.allocate(claim("x", request(selectors=(index_is(0, 3),), count=2)), CLASSES)) == [0, 3]
    assert gpus(state.allocate(claim("pair", request(count=2)), CLASSES)) == [4, 5]


def test_one_gpu_does_not_break_the_only_free_nvlink_pair() -> None:
    state = fleet(h100_nvl("n1", gpus=4))
    assert gpus(state.allocate(claim("x", request(selectors=(index_is(3),))), CLASSES)) == [3]
    assert gpus(state.allocate(claim("one", request()), CLASSES)) == [2]
    assert gpus(state.allocate(claim("pair", request(count=2)), CLASSES)) == [0, 1]


def test_one_gpu_prefers_the_gpu_whose_partner_is_used() -> None:
    state = fleet(h100_nvl("n1"))
    assert gpus(state.allocate(claim("a", request()), CLASSES)) == [0]
    assert gpus(state.allocate(claim("b", request()), CLASSES)) == [1]


def test_first_fit_takes_devices_in_order_and_breaks_pairs() -> None:
    state = fleet(h100_nvl("n1", gpus=4))
    state.allocate(claim("x", request(selectors=(index_is(3),))), CLASSES, "first-fit")
    assert gpus(state.allocate(claim("one", request()), CLASSES, "first-fit")) == [0]
    pair = state.allocate(claim("pair", request(count=2)), CLASSES, "first-fit")
    assert gpus(pair) == [1, 2]


def test_first_fit_takes_nodes_in_name_order() -> None:
    state = fleet(l40s("b"), l40s("a"), l40s("c"))
    state.allocate(claim("x", request(count=2)), CLASSES, "first-fit")
    decision = state.allocate(claim("y", request(count=7)), CLASSES, "first-fit")
    assert isinstance(decision, Allocated) and decision.node == "b"
    assert gpus(decision) == [0, 1, 2, 3, 4, 5, 6]


def test_best_fit_takes_the_fullest_node_that_fits() -> None:
    state = fleet(l40s("a"), l40s("b"), l40s("c"))
    state.allocate(claim("x", request(selectors=(index_is(0, 1, 2, 3, 4),), count=5)), CLASSES, "first-fit")
    state.allocate(claim("y", request(selectors=(index_is(0, 1),), count=2)), CLASSES, "first-fit")
    assert state.snapshot()["nodes"]["a"]["free_whole_gpus"] == 3
    decision = state.allocate(claim("z", request(count=2)), CLASSES, "best-fit")
    assert isinstance(decision, Allocated) and decision.node == "a"
    assert gpus(decision) == [5, 6]


def test_pack_fills_the_most_used_node_and_spread_the_least_used() -> None:
    state = fleet(l40s("a"), l40s("b"))
    state.allocate(claim("x", request(count=3)), CLASSES)
    assert state.snapshot()["claims"]["uid-x"] == "a"
    packed = state.allocate(claim("p", request()), CLASSES)
    assert isinstance(packed, Allocated) and packed.node == "a"
    config = [
        {
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "gpu.tangram.dev/v1alpha1",
                    "kind": "TopologyConfig",
                    "placement": "Spread",
                },
            }
        }
    ]
    spread = state.allocate(claim("s", request(), config=config), CLASSES)
    assert isinstance(spread, Allocated) and spread.node == "b"


def test_multi_gpu_claim_skips_a_fuller_node_without_nvlink_pair() -> None:
    state = fleet(h100_nvl("a", gpus=4), hgx("b"))
    pinned = (index_is(0, 2), on_node("a"))
    assert isinstance(state.allocate(claim("x", request(selectors=pinned, count=2)), CLASSES), Allocated)
    decision = state.allocate(claim("pair", request(count=2), config=nvlink_config()), CLASSES)
    assert isinstance(decision, Allocated) and decision.node == "b"


def test_pair_without_nvlink_takes_the_unbridged_leftovers_not_the_nvswitch_node() -> None:
    state = fleet(h100_nvl("a", gpus=4), hgx("b"))
    pinned = (index_is(0, 2), on_node("a"))
    assert isinstance(state.allocate(claim("x", request(selectors=pinned, count=2)), CLASSES), Allocated)
    decision = state.allocate(claim("pair", request(count=2)), CLASSES)
    assert isinstance(decision, Allocated) and decision.node == "a"
    eight = state.allocate(claim("eight", request(count=8), config=nvlink_config()), CLASSES)
    assert isinstance(eight, Allocated) and eight.node == "b"


def test_mig_1g_claims_pack_onto_a_partitioned_gpu_and_keep_4g_possible() -> None:
    state = fleet(a100_mig("n1"))
    sel = (profile_is("1g.10gb"),)
    placed = [
        state.allocate(claim(f"m{i}", request(device_class=MIG, selectors=sel)), CLASSES) for i in range(3)
    ]
    layout = [(d.devices[0].gpu_index, d.devices[0].placement.start) for d in placed]  # type: ignore[union-attr]
    assert layout == [(0, 6), (0, 4), (0, 5)]
    four = state.allocate(
        claim("four", request(device_class=MIG, selectors=(profile_is("4g.40gb"),))), CLASSES
    )
    assert isinstance(four, Allocated)
    assert (four.devices[0].gpu_index, four.devices[0].placement.start) == (0, 0)  # type: ignore[union-attr]


def test_first_fit_mig_starts_at_slice_zero() -> None:
    state = fleet(a100_mig("n1"))
    sel = (profile_is("1g.10gb"),)
    d = state.allocate(claim("m", request(device_class=MIG, selectors=sel)), CLASSES, "first-fit")
    assert isinstance(d, Allocated)
    assert (d.devices[0].gpu_index, d.devices[0].placement.start) == (0, 0)  # type: ignore[union-attr]
    four = state.allocate(
        claim("four", request(device_class=MIG, selectors=(profile_is("4g.40gb"),))), CLASSES, "first-fit"
    )
    assert isinstance(four, Allocated) and four.devices[0].gpu_index == 1


def test_failure_reason_counts_nodes_per_cause() -> None:
    state = fleet(l40s("a", health={i: "unhealthy" for i in range(8)}), a100_mig("b"), a100_mig("c"))
    for node_name in ("b", "c"):
        for g in range(4):
            sel = (profile_is("7g.80gb"), index_is(g), on_node(node_name, "parentUUID"))
            taken = state.allocate(
                claim(f"{node_name}{g}", request(device_class=MIG, selectors=sel)), CLASSES
            )
            assert isinstance(taken, Allocated) and taken.node == node_name
    decision = state.allocate(claim("x", request(device_class="any.gpu.tangram.dev")), {**CLASSES})
    assert decision.reason == (  # type: ignore[union-attr]
        "0/3 nodes fit: 2 nodes: not enough free GPUs or MIG slices; "
        '1 node: request "gpus": taint gpu.tangram.dev/unhealthy not tolerated'
    )
