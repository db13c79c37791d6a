"""Share hosts in ResourceSlices: what several claims may hold at once, published where the API
server serves consumable capacity, kept apart from exclusive devices by counters."""

from typing import Any

import pytest

from tangram.dra import node_devices
from tangram.kubernetes.objects import check_limits, render_slices
from tests.kubernetes.objects.nodes import h100_node, l40s_node
from tests.kubernetes.objects.schema import validate_strictly
from tests.support.driver import DRIVER

SHARED_VERSIONS = ["1.36", "1.37"]


def render(hw: Any, version: str) -> list[dict[str, Any]]:
    return render_slices(node_devices(hw, driver=DRIVER, shared=True), k8s_version=version, driver=DRIVER)  # type: ignore[arg-type]


def devices_of(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


@pytest.mark.parametrize("version", SHARED_VERSIONS)
@pytest.mark.parametrize("node", [h100_node, l40s_node])
def test_slices_with_share_hosts_validate_and_respect_limits(node: Any, version: str) -> None:
    slices = render(node(), version)
    assert check_limits(slices, version) == []
    for obj in slices:
        validate_strictly(obj, version)


@pytest.mark.parametrize("version", SHARED_VERSIONS)
def test_a_non_mig_gpu_and_its_share_host_consume_the_same_counters(version: str) -> None:
    devices = devices_of(render(l40s_node(), version))
    assert [n for n in devices if n.startswith("gpu-0")] == ["gpu-0", "gpu-0-shared"]
    whole, host = devices["gpu-0"], devices["gpu-0-shared"]
    assert host["consumesCounters"] == whole["consumesCounters"]
    assert host["consumesCounters"][0]["counterSet"] == "gpu-0-counters"
    assert host["consumesCounters"][0]["counters"]["memory"] == {"value": "46068Mi"}
    assert "allowMultipleAllocations" not in whole
    assert host["allowMultipleAllocations"] is True
    assert host["attributes"]["type"] == {"string": "shared"}
    assert host["attributes"]["shareOf"] == {"string": "gpu"}
    assert whole["attributes"]["type"] == {"string": "gpu"}
    # memory only: a capacity without a request policy would be consumed whole by every share
    assert host["capacity"] == {
        "memory": {
            "value": "46068Mi",
            "requestPolicy": {"default": "4Gi", "validRange": {"min": "256Mi", "step": "256Mi"}},
        }
    }


def test_mig_share_hosts_are_placements_without_media_extensions_smaller_than_the_gpu() -> None:
    devices = devices_of(render(h100_node(), "1.37"))
    hosts = sorted(
        n.removeprefix("gpu-0-mig-") for n in devices if n.startswith("gpu-0-mig-") and n.endswith("-shared")
    )
    assert hosts == sorted(
        [f"1g-10gb-{s}-shared" for s in range(7)]
        + [f"1g-20gb-{s}-shared" for s in (0, 2, 4, 6)]
        + [f"2g-20gb-{s}-shared" for s in (0, 2, 4)]
        + [f"3g-40gb-{s}-shared" for s in (0, 4)]
        + ["4g-40gb-0-shared"]
    )
    exclusive, host = devices["gpu-0-mig-2g-20gb-2"], devices["gpu-0-mig-2g-20gb-2-shared"]
    assert host["consumesCounters"] == exclusive["consumesCounters"]
    assert host["attributes"]["shareOf"] == {"string": "mig"}
    assert host["attributes"]["profile"] == {"string": "2g.20gb"}


def test_without_sharing_no_share_host_and_no_counters_on_non_mig_gpus() -> None:
    devices = node_devices(l40s_node(), driver=DRIVER)
    assert [d.name for d in devices.devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert devices.counter_sets == []
    assert all(not d.consumes and not d.shared for d in devices.devices)
