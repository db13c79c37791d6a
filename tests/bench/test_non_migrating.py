"""The non-migrating optimum (each claim keeps one placement for its whole life) on traces small
enough to work out by hand."""

from __future__ import annotations

import pytest

from tangram.bench.packing import (
    Held,
    LosingPlacement,
    PackingGpu,
    PackingNode,
    first_losing_placement,
    maximal_alive,
    non_migrating_admitted,
    pooled,
)
from tangram.bench.quality import Replayed, _losing_report, migrating_prefix, same_claims_stranded
from tangram.bench.traces import Arrival, ClaimShape, Departure, Op, build_fleet

# H100-style placements without the media-extensions profile: (compute, start, size)
H100 = (
    *((1, s, 1) for s in range(7)),
    *((1, s, 2) for s in (0, 2, 4, 6)),
    *((2, s, 2) for s in (0, 2, 4)),
    (3, 0, 4),
    (3, 4, 4),
    (4, 0, 4),
    (7, 0, 8),
)
ONE = ClaimShape("gpu", 1)
TWO = ClaimShape("gpu", 2)
PAIR = ClaimShape("gpu", 2, nvlink=True)
MIG_1G = ClaimShape("mig", compute=1, slices=1)
MIG_7G = ClaimShape("mig", compute=7, slices=8)
MIG_4G = ClaimShape("mig", compute=4, slices=4)


def plain_node(name: str, gpus: int, nvlinked: tuple[tuple[int, int], ...] = ()) -> PackingNode:
    return PackingNode(
        name=name,
        gpus=tuple(PackingGpu(index=i, whole=True, slices=0) for i in range(gpus)),
        nvlinked=frozenset(nvlinked),
    )


def mig_node(name: str, gpus: int) -> PackingNode:
    return PackingNode(
        name=name,
        gpus=tuple(PackingGpu(index=i, whole=True, slices=8, placements=H100) for i in range(gpus)),
        nvlinked=frozenset(),
    )


BRIDGED = plain_node("bridged", 4, nvlinked=((0, 1), (2, 3)))
SWITCHED = plain_node("switched", 4, nvlinked=((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)))
# p and q must share a pair when the NVLink pair X comes; u and v then fill the other pair; when p
# and u have gone, the pair Z needs both halves of one pair free: p and u together, which the first
# pairing forbids. Rearranged at Z's arrival (q and v on one pair), all six fit.
CROSSED: list[Op] = [
    Arrival("p", ONE),
    Arrival("q", ONE),
    Arrival("x", PAIR),
    Departure("x"),
    Arrival("u", ONE),
    Arrival("v", ONE),
    Departure("p"),
    Departure("u"),
    Arrival("z", PAIR),
]


def test_the_sets_alive_at_once_are_those_a_departure_or_the_end_follows() -> None:
    ops: list[Op] = [
        Arrival("a", ONE),
        Arrival("b", ONE),
        Departure("a"),
        Arrival("c", ONE),
        Arrival("d", ONE),
        Departure("b"),
        Departure("c"),
        Arrival("e", ONE),
    ]
    shapes, sets = maximal_alive(ops, 5)
    assert len(shapes) == 5
    assert sets == [[0, 1], [1, 2, 3], [3, 4]]
    # cut after the third arrival: d, e and what follows them are not part of it
    assert maximal_alive(ops, 3)[1] == [[0, 1], [1, 2]]


def test_a_claim_never_moved_cannot_make_room_it_could_if_moved() -> None:
    found = non_migrating_admitted([BRIDGED], CROSSED)
    assert (found.admitted, found.proven) == (5, True)  # z fails; the migrating optimum admits 6


def test_without_a_conflict_it_admits_as_many_as_with_moves() -> None:
    # Every pair of the switched node has NVLink: any two free GPUs take z.
    found = non_migrating_admitted([SWITCHED], CROSSED)
    assert (found.admitted, found.proven) == (6, True)


def test_the_first_claim_goes_where_the_second_still_fits() -> None:
    # p fits on either node, but the 2-GPU claim only on "two": p must go on "one". The hint puts
    # p on "two" (as a policy that looks no further might): the optimum is not bound to it.
    nodes = [plain_node("one", 1), plain_node("two", 2)]
    ops: list[Op] = [Arrival("p", ONE), Arrival("w", TWO)]
    found = non_migrating_admitted(nodes, ops, at_least=1, hint=[Held("two", (0,))])
    assert (found.admitted, found.proven) == (2, True)


def test_capacity_is_held_only_while_the_claim_lives() -> None:
    gpu = [mig_node("m", 1)]
    whole_then_mig: list[Op] = [Arrival("w", ONE), Departure("w"), Arrival("p", MIG_1G), Arrival("q", MIG_7G)]
    # w leaves before p comes; q (all 8 slices) meets p: the prefix ends before q
    assert non_migrating_admitted(gpu, whole_then_mig).admitted == 2
    mig_then_whole: list[Op] = [Arrival("p", MIG_1G), Arrival("w", ONE)]
    assert non_migrating_admitted(gpu, mig_then_whole).admitted == 1  # a GPU with a MIG device is not whole


def test_the_prefix_ends_at_the_first_claim_that_cannot_fit() -> None:
    ops: list[Op] = [Arrival("big", TWO), Arrival("small", ONE)]
    assert non_migrating_admitted([plain_node("one", 1)], ops).admitted == 0


def test_bounds_given_are_kept() -> None:
    # at_most caps the prefix (the arrivals past it are not considered); at_least == at_most: no solve
    assert non_migrating_admitted([SWITCHED], CROSSED, at_most=3).admitted == 3
    found = non_migrating_admitted([BRIDGED], CROSSED, at_least=4, at_most=4)
    assert (found.admitted, found.proven, found.seconds) == (4, True, 0.0)


def test_a_hint_the_model_does_not_offer_is_refused() -> None:
    with pytest.raises(ValueError, match="does not offer"):
        non_migrating_admitted([BRIDGED], CROSSED, at_least=1, hint=[Held("elsewhere", (0,))])


def test_counting_gpus_is_enough_only_where_any_set_serves_alike() -> None:
    assert pooled(plain_node("l40s", 8))  # no NVLink, no MIG
    assert pooled(SWITCHED)  # NVLink between every pair
    assert not pooled(BRIDGED)  # a pair claim needs a bridged pair
    assert not pooled(mig_node("m", 2))  # MIG devices sit on particular GPUs


def test_the_migrating_optimum_admits_the_crossed_trace_whole() -> None:
    # At z's arrival q and v are alive: moved onto one pair, z takes the other.
    arrivals, proven, _ = migrating_prefix([BRIDGED], CROSSED, 0, capacity_gpus=4, time_limit_s=10)
    assert (arrivals, proven) == (6, True)


def test_the_migrating_optimum_checks_arrivals_before_the_last_departure() -> None:
    # Four NVLink-connected GPUs do not exist on the bridged node; the departure and the claim after
    # it do not hide that failure (the first arrival), nor does the count of GPUs (4 of 4).
    four = ClaimShape("gpu", 4, nvlink=True)
    ops: list[Op] = [Arrival("f", four), Departure("f"), Arrival("g", ONE)]
    assert migrating_prefix([BRIDGED], ops, 0, capacity_gpus=4, time_limit_s=10)[:2] == (0, True)
    # Too many GPUs at once: the second arrival fails, whatever follows it.
    ops = [Arrival("a", TWO), Arrival("b", ONE), Departure("a"), Arrival("c", ONE)]
    assert migrating_prefix([plain_node("two", 2)], ops, 0, capacity_gpus=2, time_limit_s=10)[:2] == (1, True)


def test_stranded_gpus_are_compared_once_both_policies_admitted_the_same_claims() -> None:
    # tangram admitted 3 claims, first-fit 2 (it failed on the third): compared at 2 admitted,
    # and on average over the moments after the first and the second.
    replays = {
        "tangram": Replayed(row={"claims": 3}, held=[], stranded=[0.0, 0.5, 1.0, 0.25]),
        "first-fit": Replayed(row={"claims": 2}, held=[], stranded=[0.0, 0.5, 2.0]),
    }
    assert same_claims_stranded(replays) == {
        "first-fit": {
            "claims": 2,
            "tangram": 1.0,
            "first-fit": 2.0,
            "tangram_mean": 0.75,
            "first-fit_mean": 1.25,
        }
    }


def test_the_losing_placement_is_the_first_after_which_the_optimum_no_longer_fits() -> None:
    # a leaves before p: anywhere is fine for it. p on "two" leaves no room for w, which only "two"
    # can hold: p is the placement that lost the optimum of 3, and "one" is where it had to go.
    nodes = [plain_node("one", 1), plain_node("two", 2)]
    ops: list[Op] = [Arrival("a", ONE), Departure("a"), Arrival("p", ONE), Arrival("w", TWO)]
    placed = [Held("two", (0,)), Held("two", (1,))]
    lost = first_losing_placement(nodes, ops, 3, placed, time_limit_s=10)
    assert lost is not None
    assert (lost.arrival, lost.placed, lost.instead) == (1, Held("two", (1,)), Held("one", ()))


def test_a_mig_device_that_shuts_out_a_later_profile_is_the_losing_placement() -> None:
    # A 1g at slice 0 leaves no placement for the 4g (slices 0-3 only); at 4, 5 or 6 both fit.
    ops: list[Op] = [Arrival("small", MIG_1G), Arrival("big", MIG_4G)]
    lost = first_losing_placement([mig_node("m", 1)], ops, 2, [Held("m", (0,), 0, 1)], time_limit_s=10)
    assert lost is not None
    assert (lost.arrival, lost.placed) == (0, Held("m", (0,), 0, 1))
    assert lost.instead.gpus == (0,) and lost.instead.size == 1 and lost.instead.start in (4, 5, 6)


def test_a_policy_that_failed_a_claim_it_had_room_for_lost_at_its_failure() -> None:
    # Every placement kept, the failed claim still fits: the failure itself is the loss.
    nodes = [plain_node("one", 1), plain_node("two", 2)]
    ops: list[Op] = [Arrival("p", ONE), Arrival("w", TWO)]
    lost = first_losing_placement(nodes, ops, 2, [Held("one", ())], time_limit_s=10)
    assert lost is not None
    assert (lost.arrival, lost.placed, lost.instead) == (1, None, Held("two", ()))


def test_a_policy_that_reached_the_optimum_lost_nothing() -> None:
    ops: list[Op] = [Arrival("p", ONE), Arrival("w", TWO)]
    placed = [Held("one", ()), Held("two", ())]
    assert first_losing_placement([plain_node("one", 1), plain_node("two", 2)], ops, 2, placed) is None


def test_the_losing_decision_is_reported_with_each_node_machine() -> None:
    nodes = build_fleet([("h100-nvl-4x2", 1), ("l40s-8", 1)])
    mig_node_name, l40s_name = nodes[0].node, nodes[1].node
    arrived = [MIG_1G, ONE]
    placed, instead = Held(mig_node_name, (2,), 0, 1), Held(l40s_name, (5,))
    lost = LosingPlacement(arrival=0, placed=placed, instead=instead, probes=3, seconds=0.5)
    assert _losing_report(lost, arrived, nodes) == {
        "arrival": 0,
        "claim": "mig-1g-1s",
        "placed": {"node": mig_node_name, "machine": "NVIDIA H100 NVL", "gpus": [2], "slices": [0, 1]},
        "instead": {"node": l40s_name, "machine": "NVIDIA L40S", "gpus": [5]},
        "probes": 3,
        "seconds": 0.5,
    }
    failed = LosingPlacement(arrival=1, placed=None, instead=Held(l40s_name, ()), probes=2, seconds=0.1)
    report = _losing_report(failed, arrived, nodes)
    assert (report["claim"], report["placed"], report["instead"]["gpus"]) == ("1gpu", None, [])
