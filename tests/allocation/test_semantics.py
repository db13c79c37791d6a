"""DRA structured-parameters semantics: each feature, and how each one fails."""

from __future__ import annotations

from typing import Any

import pytest

from tangram.allocation import Allocated, Claim, Failed
from tangram.events.inventory import MigInstance, MigPlacement
from tests.allocation.machines import (
    CLASSES,
    DRIVER,
    a100_mig,
    claim,
    device_class,
    hgx,
    index_is,
    l40s,
    profile_is,
    request,
)
from tests.support.fleets import devices_of, fleet, reason_of


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"devices": {"requests": []}}, "no device requests"),
        ({"devices": {"requests": [{"name": "Bad_Name", "exactly": {"deviceClassName": "x"}}]}}, "DNS label"),
        ({"devices": {"requests": [{"name": "a"}]}}, "spec.devices.requests[0]: exactly one of exactly"),
        (
            {"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "x", "count": 0}}]}},
            "spec.devices.requests[0].exactly.count",
        ),
        (
            {
                "devices": {
                    "requests": [
                        {
                            "name": "a",
                            "exactly": {"deviceClassName": "x", "allocationMode": "All", "count": 2},
                        }
                    ]
                }
            },
            "count must not be set when allocationMode is All",
        ),
        (
            {"devices": {"requests": [request(count=32), request(name="b", count=1)]}},
            "at most 32",
        ),
        (
            {
                "devices": {
                    "requests": [request()],
                    "constraints": [{"requests": ["nope"], "matchAttribute": "a/b"}],
                }
            },
            "constraints names request 'nope'",
        ),
        (
            {"devices": {"requests": [request()], "constraints": [{"matchAttribute": "numaNode"}]}},
            "must be fully qualified",
        ),
        ({"devices": {"requests": [request(selectorz=[])]}}, "spec.devices.requests[0].exactly.selectorz"),
        (
            {"devices": {"requests": [request(capacity={"requests": {f"{DRIVER}/memory": "lots"}})]}},
            "not a Kubernetes quantity",
        ),
    ],
)
def test_invalid_claims_fail_naming_the_field(spec: dict[str, Any], fragment: str) -> None:
    state = fleet(hgx("n1"))
    decision = state.allocate(
        Claim(namespace="ns", name="c", uid="u", spec=spec),
        CLASSES,
    )
    assert fragment in reason_of(decision)


def test_unknown_class_fails() -> None:
    decision = fleet(hgx("n1")).allocate(claim("c", request(device_class="missing")), CLASSES)
    assert reason_of(decision) == 'request "gpus": device class "missing" does not exist'


def test_cel_compile_error_fails_the_claim() -> None:
    decision = fleet(hgx("n1")).allocate(claim("c", request(selectors=("device.attributes[",))), CLASSES)
    assert reason_of(decision).startswith('request "gpus": request "gpus" selector: CEL compile error')


def test_cel_runtime_error_fails_the_claim() -> None:
    classes = {**CLASSES, "broken": device_class("broken", f'device.attributes["{DRIVER}"].foo == 1')}
    decision = fleet(hgx("n1")).allocate(claim("c", request(device_class="broken")), classes)
    assert reason_of(decision).startswith(
        'request "gpus": class "broken": CEL runtime error: no such key: foo'
    )


def test_class_and_request_selectors_are_anded() -> None:
    state = fleet(hgx("n1"), l40s("n2"))
    decision = state.allocate(
        claim("c", request(selectors=(f'device.attributes["{DRIVER}"].productName == "NVIDIA L40S"',))),
        CLASSES,
    )
    assert isinstance(decision, Allocated) and decision.node == "n2"
    assert devices_of(decision) == ["gpu-0"]


@pytest.mark.parametrize(("count", "allocated"), [(None, 1), (1, 1), (3, 3), (8, 8)])
def test_exact_count(count: int | None, allocated: int) -> None:
    decision = fleet(hgx("n1")).allocate(claim("c", request(count=count)), CLASSES)
    assert len(devices_of(decision)) == allocated


def test_exact_count_more_than_a_node_has_fails_with_counts() -> None:
    state = fleet(hgx("n1"), hgx("n2"))
    decision = state.allocate(claim("c", request(count=9)), CLASSES)
    assert reason_of(decision) == (
        '0/2 nodes fit: 2 nodes: request "gpus": only 8 devices of this hardware match (needs 9)'
    )
    # No node could hold it were everything free: not capacity that a release could give back.
    assert isinstance(decision, Failed) and decision.cause == "hardware"


def test_all_mode_takes_every_matching_device() -> None:
    state = fleet(l40s("n1"))
    decision = state.allocate(claim("c", request(allocationMode="All")), CLASSES)
    assert devices_of(decision) == [f"gpu-{i}" for i in range(8)]


def test_all_mode_fails_when_one_matching_device_is_in_use() -> None:
    state = fleet(l40s("n1"))
    assert isinstance(state.allocate(claim("one", request()), CLASSES), Allocated)
    decision = state.allocate(claim("all", request(allocationMode="All")), CLASSES)
    assert "allocationMode All needs every matching device and some are in use" in reason_of(decision)


def test_first_available_tries_subrequests_in_order() -> None:
    state = fleet(l40s("n1"))
    req = {
        "name": "gpus",
        "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu.tangram.dev", "count": 9},
            {"name": "small", "deviceClassName": "gpu.tangram.dev", "count": 2},
        ],
    }
    decision = state.allocate(claim("c", req), CLASSES)
    assert isinstance(decision, Allocated)
    assert [d.request for d in decision.devices] == ["gpus/small", "gpus/small"]


@pytest.mark.parametrize(
    ("memory", "fits"),
    [("40Gi", True), ("46068Mi", True), ("46069Mi", False), ("100G", False)],
)
def test_capacity_requests(memory: str, fits: bool) -> None:
    state = fleet(l40s("n1"))
    decision = state.allocate(
        claim("c", request(capacity={"requests": {f"{DRIVER}/memory": memory}})), CLASSES
    )
    if fits:
        assert devices_of(decision) == ["gpu-0"]
    else:
        assert "has capacity gpu.tangram.dev/memory >=" in reason_of(decision)


def test_match_attribute_across_requests() -> None:
    state = fleet(l40s("n1"))
    spec = {"constraints": [{"matchAttribute": "resource.kubernetes.io/numaNode"}]}
    decision = state.allocate(
        claim(
            "c", request(name="a", count=3), request(name="b", count=1, selectors=(index_is(0, 4),)), **spec
        ),
        CLASSES,
    )
    assert isinstance(decision, Allocated)
    numa = {d.gpu_index < 4 for d in decision.devices}
    assert len(numa) == 1


def test_match_attribute_unsatisfiable() -> None:
    state = fleet(l40s("n1"))
    spec = {"constraints": [{"matchAttribute": "resource.kubernetes.io/numaNode"}]}
    decision = state.allocate(claim("c", request(count=5), **spec), CLASSES)
    assert "satisfy matchAttribute resource.kubernetes.io/numaNode" in reason_of(decision)


def test_match_attribute_missing_makes_device_ineligible() -> None:
    state = fleet(l40s("n1"))
    spec = {"constraints": [{"matchAttribute": f"{DRIVER}/nvlinkDomain"}]}
    decision = state.allocate(claim("c", request(), **spec), CLASSES)
    assert f"no free devices with attribute {DRIVER}/nvlinkDomain" in reason_of(decision)


def test_distinct_attribute() -> None:
    state = fleet(l40s("n1"))
    spec = {"constraints": [{"distinctAttribute": "resource.kubernetes.io/numaNode"}]}
    ok = state.allocate(claim("two", request(count=2), **spec), CLASSES)
    assert {d.gpu_index < 4 for d in ok.devices} == {True, False}  # type: ignore[union-attr]
    failed = state.allocate(claim("three", request(count=3), **spec), CLASSES)
    assert "satisfy distinctAttribute resource.kubernetes.io/numaNode" in reason_of(failed)


def test_taints_need_tolerations() -> None:
    sick = l40s("n1", health={i: "unhealthy" for i in range(8)})
    state = fleet(sick)
    failed = state.allocate(claim("c", request()), CLASSES)
    assert (
        reason_of(failed) == f'0/1 nodes fit: 1 node: request "gpus": taint {DRIVER}/unhealthy not tolerated'
    )
    tolerations = [{"key": f"{DRIVER}/unhealthy", "operator": "Exists", "effect": "NoSchedule"}]
    assert isinstance(state.allocate(claim("t", request(tolerations=tolerations)), CLASSES), Allocated)


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"operator": "Exists"}, True),
        ({"key": f"{DRIVER}/unhealthy", "operator": "Exists"}, True),
        ({"key": f"{DRIVER}/unhealthy", "operator": "Equal", "value": ""}, True),
        ({"key": f"{DRIVER}/unhealthy", "operator": "Equal", "value": "yes"}, False),
        ({"key": f"{DRIVER}/unhealthy", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_toleration_matrix(toleration: dict[str, Any], tolerated: bool) -> None:
    state = fleet(l40s("n1", health={0: "unhealthy"}))
    decision = state.allocate(
        claim("c", request(selectors=(index_is(0),), tolerations=[toleration])), CLASSES
    )
    assert isinstance(decision, Allocated) is tolerated


def test_admin_access_does_not_need_or_consume_availability() -> None:
    state = fleet(l40s("n1"))
    assert isinstance(state.allocate(claim("all", request(allocationMode="All")), CLASSES), Allocated)
    admin = state.allocate(claim("admin", request(allocationMode="All", adminAccess=True)), CLASSES)
    assert isinstance(admin, Allocated) and all(d.admin_access for d in admin.devices)
    state.release("uid-all")
    assert len(devices_of(state.allocate(claim("again", request(count=8)), CLASSES))) == 8


def test_counters_make_whole_gpu_and_mig_exclusive() -> None:
    state = fleet(hgx("n1", gpu_extra={i: {"mig_capable": False} for i in range(1, 8)}))
    mig = state.allocate(
        claim("m", request(device_class="mig.gpu.tangram.dev", selectors=(profile_is("1g.10gb"),))), CLASSES
    )
    assert isinstance(mig, Allocated) and mig.devices[0].gpu_index == 0
    whole = state.allocate(claim("w", request(selectors=(index_is(0),))), CLASSES)
    assert 'request "gpus": no free device matches class "gpu.tangram.dev"' in reason_of(whole)


def test_mig_counters_never_overlap_and_seven_1g_fill_a_gpu() -> None:
    state = fleet(a100_mig("n1"))
    sel = (profile_is("1g.10gb"), index_is(0))
    starts = []
    for i in range(7):
        d = state.allocate(
            claim(f"m{i}", request(device_class="mig.gpu.tangram.dev", selectors=sel)), CLASSES
        )
        assert isinstance(d, Allocated)
        starts.append(d.devices[0].placement.start)  # type: ignore[union-attr]
    assert sorted(starts) == [0, 1, 2, 3, 4, 5, 6]
    failed = state.allocate(claim("m8", request(device_class="mig.gpu.tangram.dev", selectors=sel)), CLASSES)
    assert isinstance(failed, Failed)


def test_at_most_32_results() -> None:
    state = fleet(a100_mig("n1"))
    decision = state.allocate(
        claim("c", request(device_class="mig.gpu.tangram.dev", allocationMode="All")), CLASSES
    )
    assert "at most 32 devices" in reason_of(decision)


def test_all_devices_on_one_node() -> None:
    state = fleet(l40s("n1"), l40s("n2"))
    assert isinstance(state.allocate(claim("a", request(count=5)), CLASSES), Allocated)
    decision = state.allocate(claim("b", request(count=4), request(name="more", count=4)), CLASSES)
    assert isinstance(decision, Allocated) and decision.node == "n2"
    assert isinstance(state.allocate(claim("c", request(count=4)), CLASSES), Failed)


def test_existing_instance_is_reused_without_partitioning() -> None:
    instance = MigInstance(
        uuid="MIG-1",
        profile_id=9,
        profile="3g.40gb",
        placement=MigPlacement(start=4, size=4),
        gpu_instance_id=2,
        compute_instance_id=0,
    )
    state = fleet(a100_mig("n1", instances={2: [instance]}))
    decision = state.allocate(
        claim("c", request(device_class="mig.gpu.tangram.dev", selectors=(profile_is("3g.40gb"),))), CLASSES
    )
    assert isinstance(decision, Allocated)
    assert devices_of(decision) == ["gpu-2-mig-3g-40gb-4"]
    assert decision.partitions == []
    released = state.release("uid-c")
    assert [(p.gpu_index, p.profile, p.mig_uuid) for p in released.destroy] == [(2, "3g.40gb", "MIG-1")]


def test_new_mig_placement_comes_with_a_partition_plan() -> None:
    state = fleet(a100_mig("n1"))
    decision = state.allocate(
        claim("c", request(device_class="mig.gpu.tangram.dev", selectors=(profile_is("7g.80gb"),))), CLASSES
    )
    assert isinstance(decision, Allocated)
    assert [
        (p.gpu_index, p.profile_id, p.placement.start, p.placement.size) for p in decision.partitions
    ] == [(0, 0, 0, 8)]


def test_allocation_is_idempotent_per_uid() -> None:
    state = fleet(l40s("n1"))
    first = state.allocate(claim("c", request(count=2)), CLASSES)
    again = state.allocate(claim("c", request(count=2)), CLASSES)
    assert first == again
    assert state.metrics().allocated_devices == 2


def test_topology_config_parameters_are_validated() -> None:
    config = [
        {
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "gpu.tangram.dev/v1alpha1",
                    "kind": "TopologyConfig",
                    "interconnect": "Copper",
                },
            }
        }
    ]
    decision = fleet(hgx("n1")).allocate(claim("c", request(count=2), config=config), CLASSES)
    assert reason_of(decision).startswith(
        "invalid TopologyConfig: spec.devices.config[0].opaque.parameters.interconnect"
    )


def test_topology_config_nvlink_rejects_pcie_only_nodes() -> None:
    config = [
        {
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "gpu.tangram.dev/v1alpha1",
                    "kind": "TopologyConfig",
                    "interconnect": "NVLink",
                    "minPairBandwidthGBps": 600,
                },
            }
        }
    ]
    state = fleet(l40s("n1"), hgx("n2"))
    decision = state.allocate(claim("c", request(count=2), config=config), CLASSES)
    assert isinstance(decision, Allocated) and decision.node == "n2"
    assert decision.config[0]["opaque"]["parameters"]["interconnect"] == "NVLink"
    state2 = fleet(l40s("n1"))
    assert "NVLink-connected" in reason_of(
        state2.allocate(claim("c", request(count=2), config=config), CLASSES)
    )


def test_release_frees_devices_and_unknown_release_is_empty() -> None:
    state = fleet(l40s("n1"))
    state.allocate(claim("c", request(count=8)), CLASSES)
    released = state.release("uid-c")
    assert released.node == "n1" and len(released.devices) == 8
    assert state.release("uid-c").devices == []
    assert state.metrics().free_gpus == 8


def test_inventory_replacement_keeps_allocations() -> None:
    state = fleet(l40s("n1"))
    state.allocate(claim("c", request(count=3)), CLASSES)
    state.apply_inventory(l40s("n1"))
    assert state.metrics().free_gpus == 5
    assert state.snapshot()["nodes"]["n1"]["allocated"] == {
        "gpu-0": "uid-c",
        "gpu-1": "uid-c",
        "gpu-2": "uid-c",
    }
