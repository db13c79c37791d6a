"""check_limits against hand-written slices that break one API-server rule each."""

import copy
from typing import Any

import pytest

from tangram.kubernetes.objects import check_limits


def device(name: str, *, consumes: dict[str, int] | None = None, **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"name": name, "attributes": {"type": {"string": "gpu"}}}
    if consumes is not None:
        obj["consumesCounters"] = [
            {"counterSet": "set-0", "counters": {f"c-{i}": {"value": "1"} for i in range(n)}}
            for _, n in consumes.items()
        ]
    obj.update(extra)
    return obj


def counter_set(name: str, size: int) -> dict[str, Any]:
    return {"name": name, "counters": {f"c-{i}": {"value": "1"} for i in range(size)}}


def slices_of(*specs: dict[str, Any], generation: int = 1) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"n1-gpu-tangram-dev-{i}"},
            "spec": {
                "driver": "gpu.tangram.dev",
                "nodeName": "n1",
                "pool": {"name": "n1", "generation": generation, "resourceSliceCount": len(specs)},
                **spec,
            },
        }
        for i, spec in enumerate(specs)
    ]


def test_valid_pool_has_no_violations() -> None:
    pool = slices_of({"devices": [device("gpu-0"), device("gpu-1")]})
    for version in ("1.34", "1.35", "1.36", "1.37"):
        assert check_limits(pool, version) == []


def test_more_than_128_devices() -> None:
    pool = slices_of({"devices": [device(f"gpu-{i}") for i in range(129)]})
    assert check_limits(pool, "1.34") == ["slice 0: 129 devices > 128"]


@pytest.mark.parametrize(("version", "violations"), [("1.34", 0), ("1.35", 1), ("1.36", 1), ("1.37", 1)])
def test_65_counter_consuming_devices(version: str, violations: int) -> None:
    devices = [device(f"d-{i}", consumes={"set-0": 1}) for i in range(65)]
    pool = slices_of({"devices": devices, "sharedCounters": [counter_set("set-0", 1)]})
    problems = [p for p in check_limits(pool, version) if "devices >" in p]
    assert len(problems) == violations
    if violations:
        assert problems[0] == "slice 0: 65 devices > 64 (devices consume counters or carry taints)"


def test_65_tainted_devices_on_135() -> None:
    taint = [{"key": "gpu.tangram.dev/unhealthy", "effect": "NoSchedule"}]
    pool = slices_of({"devices": [device(f"d-{i}", taints=taint) for i in range(65)]})
    assert check_limits(pool, "1.35") == [
        "slice 0: 65 devices > 64 (devices consume counters or carry taints)"
    ]
    assert check_limits(pool, "1.34") == []


def test_devices_and_counters_in_one_slice_after_134() -> None:
    pool = slices_of(
        {"devices": [device("d-0", consumes={"set-0": 2})], "sharedCounters": [counter_set("set-0", 2)]}
    )
    assert check_limits(pool, "1.34") == []
    assert check_limits(pool, "1.35") == ["slice 0: carries both devices and shared counters"]


def test_134_needs_the_counter_set_in_the_same_slice() -> None:
    pool = slices_of(
        {"sharedCounters": [counter_set("set-0", 2)]}, {"devices": [device("d-0", consumes={"set-0": 2})]}
    )
    assert check_limits(pool, "1.35") == []
    assert check_limits(pool, "1.34") == [
        "slice 1 device 'd-0': consumes counter set 'set-0', which is not in the same slice"
    ]


def test_more_than_32_shared_counters_in_a_134_slice() -> None:
    pool = slices_of({"sharedCounters": [counter_set("a", 20), counter_set("b", 13)]})
    assert check_limits(pool, "1.34") == ["slice 0: 33 shared counters > 32"]
    assert check_limits(pool, "1.35") == []


def test_counter_set_names_unique_across_the_pool_after_134() -> None:
    pool = slices_of({"sharedCounters": [counter_set("a", 1)]}, {"sharedCounters": [counter_set("a", 1)]})
    assert check_limits(pool, "1.35") == ["counter set name 'a' used 2 times in the pool"]


def test_more_than_8_counter_sets_or_32_counters_per_set() -> None:
    pool = slices_of(
        {"sharedCounters": [counter_set(f"s-{i}", 1) for i in range(9)] + [counter_set("big", 33)]}
    )
    assert check_limits(pool, "1.36") == [
        "slice 0: counter set 'big' has 33 counters > 32",
        "slice 0: 10 counter sets > 8",
    ]


def test_consumed_counter_limits_per_device_and_slice_on_134() -> None:
    greedy = device("d-0", consumes={"set-0": 33})
    pool = slices_of({"devices": [greedy], "sharedCounters": [counter_set("set-0", 33)]})
    problems = check_limits(pool, "1.34")
    assert "slice 0 device 'd-0': consumes 33 counters > 32" in problems
    many = [device(f"d-{i}", consumes={"set-0": 9}) for i in range(114)]  # 1026 consumed counters
    pool = slices_of({"devices": many, "sharedCounters": [counter_set("set-0", 9)]})
    assert check_limits(pool, "1.34") == ["slice 0: 1026 consumed counters > 1024"]


def test_more_than_two_consumptions_per_device_after_134() -> None:
    d = device("d-0")
    d["consumesCounters"] = [{"counterSet": s, "counters": {"c-0": {"value": "1"}}} for s in ("a", "b", "c")]
    pool = slices_of({"devices": [d]}, {"sharedCounters": [counter_set(s, 1) for s in ("a", "b", "c")]})
    assert check_limits(pool, "1.35") == ["slice 0 device 'd-0': 3 counter consumptions > 2"]


def test_device_level_rules() -> None:
    d = device("GPU_0")
    d["attributes"] = {f"a{i}": {"int": i} for i in range(30)} | {
        "gpu.tangram.dev/type": {"string": "x" * 65}
    }
    d["capacity"] = {"memory": {"value": "1Gi"}, "multiprocessors": {"value": "1"}}
    pool = slices_of({"devices": [d]})
    assert check_limits(pool, "1.34") == [
        "slice 0 device 'GPU_0': device name 'GPU_0' is not a DNS label",
        "slice 0 device 'GPU_0': 31 attributes + 2 capacities > 32",
        "slice 0 device 'GPU_0': attribute or capacity 'gpu.tangram.dev/type': "
        "'gpu.tangram.dev/type' is in the driver's own domain and should be written unqualified",
        "slice 0 device 'GPU_0': attribute 'gpu.tangram.dev/type' is 65 characters > 64",
    ]


def test_pool_consistency() -> None:
    pool = slices_of({"devices": [device("gpu-0")]}, {"devices": [device("gpu-0")]})
    broken = copy.deepcopy(pool)
    broken[1]["spec"]["pool"]["generation"] = 2
    broken[1]["spec"]["pool"]["resourceSliceCount"] = 3
    broken[1]["metadata"]["name"] = broken[0]["metadata"]["name"]
    assert check_limits(broken, "1.35") == [
        "slices disagree on the pool generation: [1, 2]",
        "resourceSliceCount [2, 3] but the pool has 2 slices",
        "slice name 'n1-gpu-tangram-dev-0' used 2 times",
        "device name 'gpu-0' used 2 times in the pool",
    ]
    assert check_limits([], "1.35") == ["no slices: a pool needs at least one ResourceSlice"]


def test_consumed_counter_must_exist_in_its_set() -> None:
    pool = slices_of(
        {"devices": [device("d-0", consumes={"set-0": 3})], "sharedCounters": [counter_set("set-0", 2)]}
    )
    assert check_limits(pool, "1.34") == [
        "slice 0 device 'd-0': counters ['c-2'] are not in counter set 'set-0'"
    ]
