"""Demand-aware placement: scarce shapes kept whole, MIG packed and reconfigured, names never decide."""

from __future__ import annotations

from typing import Any

from tangram.allocation import Failed, FleetState
from tangram.events.inventory import MigInstance, MigPlacement, NodeHardware
from tests.allocation.machines import CLASSES, claim, hgx, index_is, l40s, nvlink_config, profile_is, request
from tests.support.fleets import allocated, devices_of, fleet

MIG = "mig.gpu.tangram.dev"
OTHERS = (1, 2, 3, 4, 5, 6, 7)
AT_ZERO = 'device.attributes["gpu.tangram.dev"].placementStart == 0'


def mig_claim(name: str, profile: str) -> Any:
    return claim(name, request(device_class=MIG, selectors=(profile_is(profile),)))


def on(node: str, *indexes: int) -> tuple[str, ...]:
    return (index_is(*indexes), f'device.attributes["gpu.tangram.dev"].uuid.startsWith("GPU-{node}-")')


def instance(
    profile: str, profile_id: int, start: int, size: int, *, uuid: str, in_use: bool = False
) -> MigInstance:
    return MigInstance(
        uuid=uuid,
        profile=profile,
        profile_id=profile_id,
        placement=MigPlacement(start=start, size=size),
        gpu_instance_id=start + 1,
        compute_instance_id=0,
        in_use=in_use,
    )


def test_one_gpu_goes_to_an_l40s_not_to_the_nvswitch_node_whatever_the_names() -> None:
    for h200, other in (("a", "z"), ("z", "a")):
        state = fleet(hgx(h200, kind="h200"), l40s(other))
        assert allocated(state.allocate(claim("one", request()), CLASSES)).node == other


def test_eight_nvlink_gpus_still_fit_after_single_gpu_claims() -> None:
    state = fleet(hgx("a", kind="h200"), l40s("b"))
    for n in range(8):
        assert allocated(state.allocate(claim(f"one-{n}", request()), CLASSES)).node == "b"
    eight = allocated(state.allocate(claim("eight", request(count=8), config=nvlink_config()), CLASSES))
    assert eight.node == "a"


def test_exact_free_3g_instance_is_reused_when_no_other_run_is_free() -> None:
    # GPU 0 has a 3g in use at slices 0-3 and a free 3g at 4-7; the other GPUs are taken whole.
    # The free-run filter used to count slices under the free instance as taken and fail the claim.
    gpu0 = {
        "mig_enabled": True,
        "mig_instances": [
            instance("3g.71gb", 9, 0, 4, uuid="MIG-busy", in_use=True),
            instance("3g.71gb", 9, 4, 4, uuid="MIG-free"),
        ],
    }
    for policy in ("tangram", "first-fit", "best-fit"):
        state = fleet(hgx("n", kind="h200", gpu_extra={0: gpu0}))
        allocated(state.allocate(claim("rest", request(count=7, selectors=(index_is(*OTHERS),))), CLASSES))
        three = allocated(state.allocate(mig_claim("three", "3g.71gb"), CLASSES, policy))
        assert [(d.gpu_index, d.placement) for d in three.devices] == [(0, MigPlacement(start=4, size=4))]
        assert three.partitions == []  # reused, nothing created


def test_exact_free_instance_is_reused_before_a_new_one_is_cut() -> None:
    gpu0 = {"mig_enabled": True, "mig_instances": [instance("2g.35gb", 14, 2, 2, uuid="MIG-free")]}
    state = fleet(hgx("n", kind="h200", gpu_extra={0: gpu0}))
    two = allocated(state.allocate(mig_claim("two", "2g.35gb"), CLASSES))
    assert [(d.gpu_index, d.placement) for d in two.devices] == [(0, MigPlacement(start=2, size=2))]
    assert two.partitions == []


def test_mig_claims_pack_onto_a_partitioned_gpu_of_another_node_before_cutting_a_whole_gpu() -> None:
    # Node "a" has one whole GPU left; node "z" has GPU 0 already cut for a 1g claim.
    state = fleet(hgx("a", kind="h200"), hgx("z", kind="h200"))
    allocated(state.allocate(claim("a-rest", request(count=7, selectors=on("a", *OTHERS))), CLASSES))
    allocated(state.allocate(claim("z-rest", request(count=7, selectors=on("z", *OTHERS))), CLASSES))
    first = allocated(state.allocate(mig_claim("first", "1g.18gb"), CLASSES))
    cut = first.node
    for n in range(5):
        follow = allocated(state.allocate(mig_claim(f"m{n}", "1g.18gb"), CLASSES))
        assert (follow.node, follow.devices[0].gpu_index) == (cut, 0)
    # The other node's last GPU stayed whole for a whole-GPU claim.
    whole = allocated(state.allocate(claim("whole", request()), CLASSES))
    assert whole.node != cut and whole.devices[0].profile is None


def test_whole_gpu_claim_takes_a_gpu_out_of_mig_mode_only_when_it_must() -> None:
    state = fleet(hgx("n", kind="h200", gpu_extra={3: {"mig_enabled": True}}))
    allocated(
        state.allocate(claim("rest", request(count=6, selectors=(index_is(0, 1, 2, 4, 5, 6),))), CLASSES)
    )
    whole = allocated(state.allocate(claim("whole", request()), CLASSES))
    assert whole.devices[0].gpu_index == 7 and whole.partitions == []
    one = allocated(state.allocate(mig_claim("one", "1g.18gb"), CLASSES))
    assert one.devices[0].gpu_index == 3
    assert [p.action for p in one.partitions] == ["create"]


def test_mig_claim_uses_the_gpu_already_in_mig_mode() -> None:
    state = fleet(hgx("n", kind="h200", gpu_extra={5: {"mig_enabled": True}}))
    allocated(
        state.allocate(claim("rest", request(count=6, selectors=(index_is(0, 1, 2, 3, 4, 6),))), CLASSES)
    )
    one = allocated(state.allocate(mig_claim("one", "1g.18gb"), CLASSES))
    assert one.devices[0].gpu_index == 5


def _kept_instance_node(uuid: str) -> NodeHardware:
    gpu0 = {"mig_enabled": True, "mig_instances": [instance("1g.18gb", 19, 0, 1, uuid=uuid)]}
    return hgx("n", kind="h200", gpu_extra={0: gpu0})


def test_free_instance_tangram_made_is_destroyed_for_a_whole_gpu_claim() -> None:
    state = fleet(hgx("n", kind="h200"))
    allocated(state.allocate(claim("rest", request(count=7, selectors=(index_is(*OTHERS),))), CLASSES))
    small = allocated(state.allocate(mig_claim("small", "1g.18gb"), CLASSES))
    start = small.devices[0].placement
    assert start is not None and small.devices[0].gpu_index == 0
    state.release(small.claim_uid, destroy_mig=False)  # kept warm
    gpu0 = {
        "mig_enabled": True,
        "mig_instances": [instance("1g.18gb", 19, start.start, 1, uuid="MIG-warm")],
    }
    state.apply_inventory(hgx("n", kind="h200", gpu_extra={0: gpu0}))
    whole = allocated(state.allocate(claim("whole", request()), CLASSES))
    assert whole.devices[0].gpu_index == 0
    assert [(p.action, p.mig_uuid) for p in whole.partitions] == [
        ("destroy", "MIG-warm"),
        ("disable-mig", ""),
    ]


def test_free_instance_of_another_profile_is_reconfigured_for_a_4g_claim() -> None:
    state = fleet(hgx("n", kind="h200"))
    allocated(state.allocate(claim("rest", request(count=7, selectors=(index_is(*OTHERS),))), CLASSES))
    # Tangram cuts a 2g at slices 0-1 (the only start a 4g can use is 0), then the claim leaves.
    two = allocated(
        state.allocate(
            claim("two", request(device_class=MIG, selectors=(profile_is("2g.35gb"), index_is(0), AT_ZERO))),
            CLASSES,
        )
    )
    assert two.devices[0].placement == MigPlacement(start=0, size=2)
    state.release(two.claim_uid, destroy_mig=False)
    gpu0 = {"mig_enabled": True, "mig_instances": [instance("2g.35gb", 14, 0, 2, uuid="MIG-2g")]}
    state.apply_inventory(hgx("n", kind="h200", gpu_extra={0: gpu0}))
    four = allocated(state.allocate(mig_claim("four", "4g.71gb"), CLASSES))
    assert [(p.action, p.profile) for p in four.partitions] == [("destroy", "2g.35gb"), ("create", "4g.71gb")]


def test_instances_made_outside_tangram_are_left_alone_unless_allowed() -> None:
    for allowed in (False, True):
        state = fleet(_kept_instance_node("MIG-foreign"), reconfigure_foreign_instances=allowed)
        allocated(state.allocate(claim("rest", request(count=7, selectors=(index_is(*OTHERS),))), CLASSES))
        whole = state.allocate(claim("whole", request()), CLASSES)
        if not allowed:
            assert isinstance(whole, Failed)
            continue
        assert [(p.action, p.mig_uuid) for p in allocated(whole).partitions] == [
            ("destroy", "MIG-foreign"),
            ("disable-mig", ""),
        ]


def test_reconfiguration_is_a_last_resort() -> None:
    # A free whole GPU elsewhere on the node is taken before a kept instance is destroyed.
    state = fleet(hgx("n", kind="h200"))
    allocated(
        state.allocate(claim("rest", request(count=6, selectors=(index_is(1, 2, 3, 4, 5, 6),))), CLASSES)
    )
    small = allocated(
        state.allocate(
            claim("small", request(device_class=MIG, selectors=(profile_is("1g.18gb"), index_is(0)))), CLASSES
        )
    )
    state.release(small.claim_uid, destroy_mig=False)
    start = small.devices[0].placement
    assert start is not None
    gpu0 = {"mig_enabled": True, "mig_instances": [instance("1g.18gb", 19, start.start, 1, uuid="MIG-warm")]}
    state.apply_inventory(hgx("n", kind="h200", gpu_extra={0: gpu0}))
    whole = allocated(state.allocate(claim("whole", request()), CLASSES))
    assert whole.devices[0].gpu_index == 7 and whole.partitions == []


def test_a_new_kind_that_says_nothing_about_demand_leaves_the_supply_as_without_it() -> None:
    """A claim of a kind not seen before is counted while it is placed and taken back out when it
    fails for a reason that says nothing about demand. Nodes changed before it (here by a claim
    kube-scheduler allocated, learned from its node) are filed during its decision: the supply of
    the kinds tracked must count them as a fleet that never saw the claim does, or every later
    decision weighs placements with a supply that has drifted."""

    def history(with_hopeless: bool) -> tuple[FleetState, list[list[str]]]:
        state = fleet(hgx("hgx-a"), l40s("l40s-a"))
        for n, count in enumerate((1, 2)):
            state.allocate(claim(f"seen-{n}", request(count=count)), CLASSES)
        state.adopt_prepared("outside", "hgx-a", [("gpus", "gpu-5")])
        if with_hopeless:
            hopeless = state.allocate(claim("hopeless", request(count=16)), CLASSES)
            assert isinstance(hopeless, Failed) and hopeless.cause == "hardware"
        # of the kinds seen before: nothing counts the supply again from the start
        placed = [
            devices_of(state.allocate(claim(f"next-{n}", request(count=count)), CLASSES))
            for n, count in enumerate((1, 2, 1, 2, 1))
        ]
        return state, placed

    seen, seen_placed = history(with_hopeless=True)
    unseen, unseen_placed = history(with_hopeless=False)
    assert seen._index.supply == unseen._index.supply
    assert seen_placed == unseen_placed
