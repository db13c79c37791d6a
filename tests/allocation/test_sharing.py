"""Shares: claims of shared.gpu.tangram.dev packed onto share hosts by memory and compute, kept
apart from exclusive claims, one strategy per device, freed share by share."""

from __future__ import annotations

from typing import Any

import pytest

from tangram.allocation import Allocated, Claim, Failed, FleetState
from tangram.allocation.ledger import Ledger
from tangram.events import ClaimRequested
from tests.allocation.machines import (
    CLASSES,
    DRIVER,
    claim,
    device_class,
    h100_nvl,
    hgx,
    index_is,
    l40s,
    request,
)
from tests.support.fleets import allocated, fleet, reason_of

SHARED = "shared.gpu.tangram.dev"
SHARE_CLASSES = {
    **CLASSES,
    SHARED: device_class(
        SHARED, f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "shared"'
    ),
}
GIB = 2**30


def sharing(**parameters: Any) -> list[dict[str, Any]]:
    return [
        {
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "gpu.tangram.dev/v1alpha1",
                    "kind": "SharingConfig",
                    **parameters,
                },
            }
        }
    ]


def share(name: str, asked: str | None = "10Gi", *selectors: str, **config: Any) -> Claim:
    """A claim of one share: `asked` is its capacity request; `config` a SharingConfig's fields."""
    extra: dict[str, Any] = {}
    if asked is not None:
        extra["capacity"] = {"requests": {"memory": asked}}
    devices: dict[str, Any] = {}
    if config:
        devices["config"] = sharing(**config)
    return claim(name, request("share", SHARED, selectors=selectors, **extra), **devices)


def held(decision: Any) -> tuple[str, str]:
    device = allocated(decision).devices[0]
    return allocated(decision).node, device.device


def test_four_10gib_shares_pack_onto_one_l40s_and_the_fifth_names_the_memory_left() -> None:
    state = fleet(l40s("l1"))
    first_gpu = index_is(0)
    decisions = [state.allocate(share(f"s{i}", "10Gi", first_gpu), SHARE_CLASSES) for i in range(4)]
    assert [held(d) for d in decisions] == [("l1", "gpu-0-shared")] * 4
    shares = [allocated(d).devices[0].share for d in decisions]
    assert all(s is not None and s.memory_bytes == 10 * GIB and s.strategy == "MPS" for s in shares)
    assert len({s.id for s in shares if s is not None}) == 4  # one shareID per claim
    fifth = state.allocate(share("s4", "10Gi", first_gpu), SHARE_CLASSES)
    assert isinstance(fifth, Failed) and fifth.cause == "capacity"
    # 46068 MiB less 40 GiB: 4.988 GiB
    assert "no shared device has room for a share of 10 GiB (MPS)" in fifth.reason
    assert "gpu-0-shared has 4.988 GiB of memory and 100% compute left" in fifth.reason


def test_a_share_fills_the_host_already_shared_before_opening_another() -> None:
    state = fleet(l40s("l1"))
    assert held(state.allocate(share("a", "30Gi"), SHARE_CLASSES)) == ("l1", "gpu-0-shared")
    assert held(state.allocate(share("b", "20Gi"), SHARE_CLASSES)) == (
        "l1",
        "gpu-1-shared",
    )  # 15 GiB left on gpu-0
    assert held(state.allocate(share("c", "12Gi"), SHARE_CLASSES)) == (
        "l1",
        "gpu-0-shared",
    )  # the fuller fits
    assert held(state.allocate(share("d", "12Gi"), SHARE_CLASSES)) == ("l1", "gpu-1-shared")


def test_an_exclusive_claim_never_gets_a_shared_gpu() -> None:
    state = fleet(l40s("l1"))
    allocated(state.allocate(share("s", "4Gi"), SHARE_CLASSES))
    whole = [state.allocate(claim(f"w{i}", request()), SHARE_CLASSES) for i in range(8)]
    assert sorted(d.devices[0].gpu_index for d in whole if isinstance(d, Allocated)) == [1, 2, 3, 4, 5, 6, 7]
    assert isinstance(whole[-1], Failed)
    # and a share never opens a host on a GPU held whole: none is left to open, the first one fills
    assert held(state.allocate(share("t", "40Gi"), SHARE_CLASSES)) == ("l1", "gpu-0-shared")
    assert isinstance(state.allocate(share("u", "8Gi"), SHARE_CLASSES), Failed)


def test_a_share_keeps_nvlink_pairs_whole_and_prefers_a_gpu_without_nvlink() -> None:
    state = fleet(h100_nvl("nvl"), l40s("l40s"))
    node, device = held(state.allocate(share("s", "10Gi"), SHARE_CLASSES))
    assert node == "l40s"
    assert device == "gpu-0-shared"


def mig_node() -> Any:
    """An HGX H100 running MIG: GPU 0 in MIG mode, no instance yet."""
    return hgx("h", gpu_extra={0: {"mig_enabled": True}})


def test_on_a_node_without_mig_a_share_opens_a_whole_gpu_not_an_instance() -> None:
    state = fleet(hgx("h"))
    first = allocated(state.allocate(share("a", "10Gi"), SHARE_CLASSES))
    assert first.devices[0].device == "gpu-0-shared"
    assert first.partitions == []
    assert held(state.allocate(share("b", "40Gi"), SHARE_CLASSES)) == ("h", "gpu-0-shared")


def test_a_share_carves_a_mig_instance_sized_for_it_on_a_node_running_mig() -> None:
    state = fleet(mig_node())
    first = allocated(state.allocate(share("a", "10Gi"), SHARE_CLASSES))
    # 1g.10gb holds 9.75 GiB: the smallest host that fits is a 1g.20gb placement, created for it
    # at memory slices 6-7, where it spoils no 3g or 4g placement
    assert first.devices[0].device == "gpu-0-mig-1g-20gb-6-shared"
    assert [(p.action, p.profile, p.placement.start) for p in first.partitions] == [("create", "1g.20gb", 6)]
    second = allocated(state.allocate(share("b", "8Gi"), SHARE_CLASSES))
    assert second.devices[0].device == "gpu-0-mig-1g-20gb-6-shared"
    assert second.partitions == []  # joins the instance the first share's command creates
    third = allocated(state.allocate(share("c", "8Gi"), SHARE_CLASSES))
    # no room left there: the next host is cut on the GPU already cut, not on a whole GPU
    assert third.devices[0].gpu_index == 0
    assert third.devices[0].device != "gpu-0-mig-1g-20gb-6-shared"


def test_the_instance_of_a_mig_share_host_is_destroyed_after_its_last_share_only() -> None:
    state = fleet(mig_node())
    allocated(state.allocate(share("a", "10Gi"), SHARE_CLASSES))
    allocated(state.allocate(share("b", "8Gi"), SHARE_CLASSES))
    assert state.release("uid-a").destroy == []
    last = state.release("uid-b")
    assert [(p.profile, p.placement.start) for p in last.destroy] == [("1g.20gb", 6)]


def test_one_strategy_per_device_mps_and_time_slicing_never_meet() -> None:
    state = fleet(l40s("l1"))
    assert held(state.allocate(share("m", "4Gi", strategy="MPS"), SHARE_CLASSES)) == ("l1", "gpu-0-shared")
    sliced = allocated(
        state.allocate(share("t", "4Gi", strategy="TimeSlicing", timeSlice="Long"), SHARE_CLASSES)
    )
    assert sliced.devices[0].device == "gpu-1-shared"
    assert sliced.devices[0].share is not None
    assert (sliced.devices[0].share.strategy, sliced.devices[0].share.time_slice) == ("TimeSlicing", "Long")
    only_gpu0 = index_is(0)
    refused = state.allocate(share("t2", "4Gi", only_gpu0, strategy="TimeSlicing"), SHARE_CLASSES)
    assert "gpu-0-shared" not in reason_of(refused)
    assert "1 shared device runs another strategy" in reason_of(refused)


def test_compute_percentages_are_counted_per_device() -> None:
    state = fleet(l40s("l1"))
    a = allocated(state.allocate(share("a", "4Gi", computePercent=60), SHARE_CLASSES))
    b = allocated(state.allocate(share("b", "4Gi", computePercent=60), SHARE_CLASSES))
    c = allocated(state.allocate(share("c", "4Gi", computePercent=40), SHARE_CLASSES))
    assert [a.devices[0].device, b.devices[0].device, c.devices[0].device] == [
        "gpu-0-shared",
        "gpu-1-shared",
        "gpu-0-shared",
    ]
    assert c.devices[0].share is not None and c.devices[0].share.compute_percent == 40
    refused = state.allocate(share("d", "4Gi", index_is(0), computePercent=1), SHARE_CLASSES)
    assert "gpu-0-shared has 36.99 GiB of memory and 0% compute left" in reason_of(refused)


def test_the_opaque_memory_is_used_where_no_capacity_is_requested_and_the_default_otherwise() -> None:
    state = fleet(l40s("l1"))
    by_config = allocated(state.allocate(share("a", None, memory="6Gi"), SHARE_CLASSES))
    default = allocated(state.allocate(share("b", None), SHARE_CLASSES))
    stepped = allocated(state.allocate(share("c", "1000Mi"), SHARE_CLASSES))
    assert by_config.devices[0].share is not None and by_config.devices[0].share.memory_bytes == 6 * GIB
    assert default.devices[0].share is not None and default.devices[0].share.memory_bytes == 4 * GIB
    # capacity requests are rounded up to the 256 MiB step, as kube-scheduler's request policy does
    assert stepped.devices[0].share is not None and stepped.devices[0].share.memory_bytes == 1024 * 2**20


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        ({"env": {"CUDA_MPS_PIPE_DIRECTORY": "/tmp"}}, "parameters.env: Extra inputs are not permitted"),
        ({"pipeDirectory": "/var/run/other"}, "parameters.pipeDirectory: Extra inputs are not permitted"),
        ({"clients": [{"limit": "80Gi"}]}, "parameters.clients: Extra inputs are not permitted"),
        ({"computePercent": 150}, "parameters.computePercent: Input should be less than or equal to 100"),
        ({"strategy": "TimeSlicing", "computePercent": 50}, "computePercent needs strategy MPS"),
        ({"memory": "-1Gi"}, "parameters.memory: Input should be greater than 0"),
    ],
)
def test_a_sharing_config_sets_only_its_own_limits_and_names_the_field_it_refuses(
    parameters: dict[str, Any], named: str
) -> None:
    state = fleet(l40s("l1"))
    refused = state.allocate(share("x", "4Gi", **parameters), SHARE_CLASSES)
    assert isinstance(refused, Failed) and refused.cause == "claim"
    assert "invalid SharingConfig: spec.devices.config[0].opaque.parameters" in refused.reason
    assert named in refused.reason
    assert state.snapshot()["claims"] == {}


def test_a_sharing_config_on_an_exclusive_request_is_refused() -> None:
    state = fleet(l40s("l1"))
    refused = state.allocate(claim("x", request(), config=sharing(memory="4Gi")), SHARE_CLASSES)
    assert isinstance(refused, Failed) and refused.cause == "claim"
    assert "SharingConfig applies only to requests of shared devices" in refused.reason


def test_a_rebuild_from_the_decisions_holds_the_same_shares() -> None:
    live = fleet(hgx("h"), l40s("l1"))
    decisions = [allocated(live.allocate(share(f"s{i}", f"{4 + 3 * i}Gi"), SHARE_CLASSES)) for i in range(6)]
    rebuilt = FleetState()
    for decision in decisions:
        rebuilt.adopt(decision)
    for hw in (hgx("h"), l40s("l1")):
        rebuilt.apply_inventory(hw)
    assert rebuilt.snapshot() == live.snapshot()
    follow = share("next", "10Gi")
    assert rebuilt.allocate(follow, SHARE_CLASSES) == live.allocate(follow, SHARE_CLASSES)


def kube_allocation(device: str, memory: str | None, share_uid: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "share", "driver": DRIVER, "pool": "l1", "device": device}
    if share_uid is not None:
        result["shareID"] = share_uid
    if memory is not None:
        result["consumedCapacity"] = {"memory": memory}
    return {"devices": {"results": [result]}}


def test_shares_kube_scheduler_allocated_are_held_as_shares_and_counted() -> None:
    ledger = Ledger(fleet=fleet(l40s("l1")), classes=SHARE_CLASSES)
    for n, memory in enumerate(("20Gi", "16Gi")):
        uid = f"00000000-0000-4000-8000-00000000000{n}"
        allocation = kube_allocation("gpu-0-shared", memory, f"5e2a0000-0000-4000-8000-00000000000{n}")
        ledger.apply(
            ClaimRequested(key=uid, namespace="ml", name=f"k{n}", uid=uid, spec={}, allocation=allocation),
            live=False,
        )
    assert ledger.conflicts == []  # two claims on one share host are no conflict
    node = ledger.fleet.node("l1")
    assert node is not None
    [host] = node.hosts.values()
    assert host.memory_used == 36 * GIB
    # what is left on it (8.99 GiB) is what Tangram then counts: 8 GiB joins, 10 GiB does not
    assert held(ledger.fleet.allocate(share("a", "8Gi", index_is(0)), SHARE_CLASSES)) == (
        "l1",
        "gpu-0-shared",
    )
    refused = ledger.fleet.allocate(share("b", "10Gi", index_is(0)), SHARE_CLASSES)
    assert "gpu-0-shared has 0.9883 GiB of memory" in reason_of(refused)
