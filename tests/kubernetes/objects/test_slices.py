import re
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from tangram.dra import CounterConsumption, CounterSet, node_devices
from tangram.events.inventory import GpuInfo, NodeHardware
from tangram.kubernetes.objects import SliceRenderError, check_limits, render_slices
from tests.kubernetes.objects.nodes import (
    H100_DEVICES_PER_GPU,
    H100_PROFILES,
    a100_node,
    h100_node,
    l40s_node,
)
from tests.kubernetes.objects.schema import validate_strictly
from tests.support.driver import DRIVER

VERSIONS = ["1.34", "1.35", "1.36", "1.37"]
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
ALL_H100_COUNTERS = {
    **{f"memory-slice-{i}": {"value": "1"} for i in range(8)},
    "multiprocessors": {"value": "132"},
    "memory": {"value": "81559Mi"},
    "media-extensions": {"value": "1"},
}


def render(hw: NodeHardware, version: str, **kwargs: Any) -> list[dict[str, Any]]:
    return render_slices(node_devices(hw, driver=DRIVER), k8s_version=version, driver=DRIVER, **kwargs)  # type: ignore[arg-type]


def all_devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def all_counter_sets(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {cs["name"]: cs for s in slices for cs in s["spec"].get("sharedCounters") or []}


NODES: dict[str, Callable[[], NodeHardware]] = {
    "h100": h100_node,
    "l40s": l40s_node,
    "a100-mig-off": lambda: a100_node(mig_enabled=False),
    "a100-mig-on": lambda: a100_node(mig_enabled=True),
    "h100-unhealthy": lambda: h100_node(health=["healthy", "unhealthy", *["healthy"] * 6]),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("node", sorted(NODES))
def test_slices_validate_strictly_and_respect_limits(node: str, version: str) -> None:
    slices = render(NODES[node](), version)
    assert check_limits(slices, version) == []
    for obj in slices:
        validate_strictly(obj, version)


def test_h100_on_134_puts_two_gpus_with_their_counter_sets_in_each_slice() -> None:
    slices = render(h100_node(), "1.34")
    # 11 counters per GPU: two sets fit under 32 shared counters, three do not
    layout = [
        (sorted(cs["name"] for cs in s["spec"]["sharedCounters"]), len(s["spec"]["devices"])) for s in slices
    ]
    assert layout == [
        (["gpu-0-counters", "gpu-1-counters"], 52),
        (["gpu-2-counters", "gpu-3-counters"], 52),
        (["gpu-4-counters", "gpu-5-counters"], 52),
        (["gpu-6-counters", "gpu-7-counters"], 52),
    ]
    for s in slices:
        local = {cs["name"] for cs in s["spec"]["sharedCounters"]}
        consumed = {c["counterSet"] for d in s["spec"]["devices"] for c in d["consumesCounters"]}
        assert consumed == local


@pytest.mark.parametrize("version", ["1.35", "1.36", "1.37"])
def test_h100_on_135_and_later_separates_counter_sets_from_devices(version: str) -> None:
    slices = render(h100_node(), version)
    assert "devices" not in slices[0]["spec"]
    assert [cs["name"] for cs in slices[0]["spec"]["sharedCounters"]] == [
        f"gpu-{i}-counters" for i in range(8)
    ]
    # at most 64 devices once they consume counters: two GPUs of 26 devices per slice
    assert [len(s["spec"]["devices"]) for s in slices[1:]] == [52, 52, 52, 52]
    assert all("sharedCounters" not in s["spec"] for s in slices[1:])


@pytest.mark.parametrize("version", VERSIONS)
def test_pool_metadata_is_shared_by_every_slice(version: str) -> None:
    slices = render(h100_node("node-a.example.com"), version, generation=7)
    expected_count = 4 if version == "1.34" else 5
    assert [s["metadata"]["name"] for s in slices] == [
        f"node-a.example.com-gpu-tangram-dev-{i}" for i in range(expected_count)
    ]
    for s in slices:
        assert s["apiVersion"] == "resource.k8s.io/v1"
        assert s["kind"] == "ResourceSlice"
        assert s["spec"]["driver"] == "gpu.tangram.dev"
        assert s["spec"]["nodeName"] == "node-a.example.com"
        assert s["spec"]["pool"] == {
            "name": "node-a.example.com",
            "generation": 7,
            "resourceSliceCount": expected_count,
        }


def test_whole_gpu_is_rendered_with_unqualified_own_attributes_and_canonical_quantities() -> None:
    device = all_devices(render(h100_node(), "1.35"))["gpu-0"]
    assert device == {
        "name": "gpu-0",
        "attributes": {
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "architecture": {"string": "hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "565.57.1"},
            "index": {"int": 0},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"},
            "resource.kubernetes.io/numaNode": {"int": 0},
            "nvlinkDomain": {"string": "nvswitch-0"},
            "type": {"string": "gpu"},
            "uuid": {"string": "GPU-1d6e0b7a-0000-4000-8000-000000000000"},
            "migCapable": {"bool": True},
        },
        "capacity": {"memory": {"value": "81559Mi"}, "multiprocessors": {"value": "132"}},
        "consumesCounters": [{"counterSet": "gpu-0-counters", "counters": ALL_H100_COUNTERS}],
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_every_gpu_counter_set_holds_all_its_slices(version: str) -> None:
    sets = all_counter_sets(render(h100_node(), version))
    assert sets == {
        f"gpu-{i}-counters": {"name": f"gpu-{i}-counters", "counters": ALL_H100_COUNTERS} for i in range(8)
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_full_gpu_consumes_everything(version: str) -> None:
    devices = all_devices(render(h100_node(), version))
    for i in range(8):
        assert devices[f"gpu-{i}"]["consumesCounters"] == [
            {"counterSet": f"gpu-{i}-counters", "counters": ALL_H100_COUNTERS}
        ]


def _expected_h100_placements(gpu: int) -> dict[str, tuple[set[int], str, str]]:
    expected = {}
    for name, _pid, _index, slices, _cs, mib, sms, starts, _me in H100_PROFILES:
        label = name.replace(".", "-").replace("+", "-")
        for start in starts:
            expected[f"gpu-{gpu}-mig-{label}-{start}"] = (
                set(range(start, start + slices)),
                f"{mib}Mi",
                str(sms),
            )
    return expected


@pytest.mark.parametrize("version", VERSIONS)
def test_every_mig_placement_consumes_exactly_its_memory_slices(version: str) -> None:
    devices = all_devices(render(h100_node(), version))
    for gpu in range(8):
        expected = _expected_h100_placements(gpu)
        mig = {n: d for n, d in devices.items() if n.startswith(f"gpu-{gpu}-mig-")}
        assert set(mig) == set(expected)
        for name, (slices, memory, sms) in expected.items():
            [consumption] = mig[name]["consumesCounters"]
            assert consumption["counterSet"] == f"gpu-{gpu}-counters"
            counters = consumption["counters"]
            assert {k for k in counters if k.startswith("memory-slice-")} == {
                f"memory-slice-{i}" for i in slices
            }
            assert all(counters[f"memory-slice-{i}"] == {"value": "1"} for i in slices)
            assert counters["memory"] == {"value": memory}
            assert counters["multiprocessors"] == {"value": sms}
            assert ("media-extensions" in counters) == name.startswith(f"gpu-{gpu}-mig-1g-10gb-me-")
            assert mig[name]["capacity"] == {"memory": {"value": memory}, "multiprocessors": {"value": sms}}
            assert mig[name]["attributes"]["type"] == {"string": "mig"}
    assert len(devices) == 8 * H100_DEVICES_PER_GPU


def test_existing_mig_instance_carries_its_uuid_and_parent() -> None:
    devices = all_devices(render(h100_node(), "1.36"))
    attributes = devices["gpu-1-mig-3g-40gb-4"]["attributes"]
    assert attributes["uuid"] == {"string": "MIG-5c3f0f6e-1111-4222-8333-444455556666"}
    assert attributes["parentUUID"] == {"string": "GPU-1d6e0b7a-0000-4000-8000-000000000001"}
    assert attributes["profile"] == {"string": "3g.40gb"}
    assert "uuid" not in devices["gpu-1-mig-3g-40gb-0"]["attributes"]


@pytest.mark.parametrize("version", VERSIONS)
def test_non_mig_gpus_carry_no_counters(version: str) -> None:
    slices = render(l40s_node(), version)
    assert len(slices) == 1
    assert "sharedCounters" not in slices[0]["spec"]
    devices = slices[0]["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert all("consumesCounters" not in d for d in devices)
    assert devices[0]["capacity"] == {"memory": {"value": "46068Mi"}, "multiprocessors": {"value": "142"}}
    assert devices[0]["attributes"]["migCapable"] == {"bool": False}


@pytest.mark.parametrize("version", VERSIONS)
def test_ampere_with_mig_off_advertises_no_partitions(version: str) -> None:
    slices = render(a100_node(mig_enabled=False), version)
    devices = all_devices(slices)
    assert sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert all("consumesCounters" not in d for d in devices.values())
    assert all_counter_sets(slices) == {}


@pytest.mark.parametrize("version", VERSIONS)
def test_ampere_with_mig_on_advertises_partitions_but_not_whole_gpus(version: str) -> None:
    devices = all_devices(render(a100_node(mig_enabled=True), version))
    assert not {"gpu-0", "gpu-1", "gpu-2", "gpu-3"} & set(devices)
    assert len(devices) == 4 * (H100_DEVICES_PER_GPU - 1)
    assert devices["gpu-2-mig-7g-80gb-0"]["capacity"]["memory"] == {"value": "81152Mi"}


def test_unhealthy_gpu_devices_carry_a_taint() -> None:
    devices = all_devices(render(h100_node(health=["healthy", "unhealthy", *["healthy"] * 6]), "1.36"))
    taint = [{"key": "gpu.tangram.dev/unhealthy", "effect": "NoSchedule"}]
    assert devices["gpu-1"]["taints"] == taint
    assert devices["gpu-1-mig-1g-10gb-6"]["taints"] == taint
    assert "taints" not in devices["gpu-0"]


@pytest.mark.parametrize("version", VERSIONS)
def test_names_are_dns_labels_and_stable(version: str) -> None:
    first = render(h100_node(), version)
    second = render(h100_node(), version)
    assert first == second
    names = [n for n in all_devices(first)]
    assert all(DNS_LABEL.match(n) for n in names)
    assert "gpu-0-mig-1g-10gb-me-6" in names


@pytest.mark.parametrize(
    ("version", "unhealthy", "sizes"),
    [
        ("1.34", frozenset(), [128, 72]),
        ("1.35", frozenset(), [128, 72]),
        ("1.34", frozenset({5}), [128, 72]),
        # a tainted device limits its slice to 64 devices from 1.35 on
        ("1.35", frozenset({5}), [64, 128, 8]),
        ("1.36", frozenset({5}), [64, 128, 8]),
    ],
)
def test_large_nodes_are_split_within_the_device_limits(
    version: str, unhealthy: frozenset[int], sizes: list[int]
) -> None:
    slices = render(l40s_node("big", count=200, unhealthy=unhealthy), version)
    assert [len(s["spec"]["devices"]) for s in slices] == sizes
    assert check_limits(slices, version) == []
    assert [d["name"] for s in slices for d in s["spec"]["devices"]] == [f"gpu-{i}" for i in range(200)]


@pytest.mark.parametrize("version", VERSIONS)
def test_node_without_gpus_publishes_one_empty_slice(version: str) -> None:
    slices = render(NodeHardware(node="cpu-only", driver_version="580.95.05"), version)
    assert [s["spec"]["devices"] for s in slices] == [[]]
    assert slices[0]["spec"]["pool"]["resourceSliceCount"] == 1
    validate_strictly(slices[0], version)


def test_another_driver_name_is_its_own_domain() -> None:
    devices = node_devices(l40s_node(), driver="gpu.example.com")
    [obj] = render_slices(devices, k8s_version="1.35", driver="gpu.example.com")
    assert obj["spec"]["driver"] == "gpu.example.com"
    assert obj["metadata"]["name"] == "l40s-1-gpu-example-com-0"
    assert obj["spec"]["devices"][0]["attributes"]["type"] == {"string": "gpu"}


def test_devices_built_for_another_driver_are_refused() -> None:
    devices = node_devices(l40s_node(), driver="gpu.example.com")
    with pytest.raises(SliceRenderError, match=r"built for driver 'gpu.example.com', not 'gpu.tangram.dev'"):
        render_slices(devices, k8s_version="1.35", driver=DRIVER)


def test_unsupported_kubernetes_version_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unsupported Kubernetes version '1.33'"):
        render(l40s_node(), "1.33")


def test_overlong_string_attribute_is_refused_naming_it() -> None:
    hw = l40s_node()
    gpu = hw.gpus[0]
    long_name = GpuInfo(**{**{f: getattr(gpu, f) for f in gpu.__struct_fields__}, "name": "N" * 65})
    bad = NodeHardware(node=hw.node, driver_version=hw.driver_version, gpus=[long_name])
    with pytest.raises(SliceRenderError, match=r"'productName' is 65 characters > 64"):
        render(bad, "1.34")


def test_very_long_node_names_give_valid_unique_slice_names() -> None:
    node = ".".join(["a" * 60] * 4) + ".b"  # 246 characters, a valid node name
    slices = render(l40s_node(node, count=200), "1.35")
    names = [s["metadata"]["name"] for s in slices]
    assert len(set(names)) == 2
    assert all(len(n) <= 253 for n in names)
    assert check_limits(slices, "1.35") == []


def test_counter_set_shared_by_two_gpus_is_refused_on_134() -> None:
    devices = node_devices(h100_node())
    moved = [
        msgspec.structs.replace(
            d, consumes=[CounterConsumption(counter_set="gpu-0-counters", counters={"memory": 1})]
        )
        if d.gpu_index == 1
        else d
        for d in devices.devices
    ]
    shared = msgspec.structs.replace(devices, devices=moved)
    with pytest.raises(
        SliceRenderError, match=r"counter set 'gpu-0-counters' is consumed by devices of several GPUs"
    ):
        render_slices(shared, k8s_version="1.34", driver=DRIVER)


def test_counter_set_nobody_consumes_is_still_published_on_134() -> None:
    devices = node_devices(h100_node())
    spare = CounterSet(name="spare-counters", counters={"memory": 1024})
    with_spare = msgspec.structs.replace(devices, counter_sets=[*devices.counter_sets, spare])
    slices = render_slices(with_spare, k8s_version="1.34", driver=DRIVER)
    assert slices[-1]["spec"]["sharedCounters"][-1] == {
        "name": "spare-counters",
        "counters": {"memory": {"value": "1Ki"}},
    }
    assert check_limits(slices, "1.34") == []
