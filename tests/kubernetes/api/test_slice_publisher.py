"""SlicePublisher against the local API server, through kubernetes_asyncio over real HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tangram.kubernetes.api import SPEC_HASH_ANNOTATION, SliceInputError, SlicePublisher
from tangram.nvml import SimNvml
from tests.kubernetes.api.apiserver import LocalApiServer
from tests.kubernetes.api.helpers import machine_slices, simulated
from tests.support.driver import DRIVER

NODE = "gpu-node-1"


def names(*indexes: int, node: str = NODE) -> tuple[str, ...]:
    return tuple(f"{node}-gpu-tangram-dev-{i}" for i in indexes)


def device_names(resource_slice: dict[str, Any]) -> list[str]:
    return [device["name"] for device in resource_slice["spec"].get("devices", [])]


def set_ampere_mig_mode(nvml: SimNvml, gpus: list[int], mode: int) -> None:
    """Ampere keeps a new MIG mode pending until the GPU is reset."""
    for index in gpus:
        nvml.nvmlDeviceSetMigMode(nvml.nvmlDeviceGetHandleByIndex(index), mode)
        nvml.sim_reset_gpu(index)


def publisher(kube_api: Any, **options: Any) -> SlicePublisher:
    return SlicePublisher(kube_api, node=NODE, driver=DRIVER, **options)


def foreign_slice(node: str, index: int, generation: int) -> dict[str, Any]:
    """A slice written by someone else (another node, or an earlier run of this one)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu-tangram-dev-{index}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 8},
            "devices": [{"name": "gpu-9"}],
        },
    }


async def test_first_sync_creates_exactly_the_rendered_slices(
    apiserver: LocalApiServer, kube_api: Any, tmp_path: Path
) -> None:
    apiserver.put_object(foreign_slice("other-node", 0, 3))
    slices = machine_slices(simulated("hgx-h200", tmp_path / "gpus.json"), NODE, generation=1)

    report = await publisher(kube_api).sync(slices)

    assert report.ok, report.error
    assert report.created == names(0, 1, 2, 3, 4)
    assert (report.replaced, report.deleted, report.generation) == ((), (), 1)
    stored = apiserver.slices(NODE)
    assert [s["metadata"]["name"] for s in stored] == list(names(0, 1, 2, 3, 4))
    assert [s["spec"] for s in stored] == [s["spec"] for s in slices]
    # 1.36: the eight GPUs' counter sets share the first slice; each device slice holds two GPUs
    assert [len(s["spec"].get("sharedCounters", [])) for s in stored] == [8, 0, 0, 0, 0]
    assert device_names(stored[1])[:2] == ["gpu-0", "gpu-0-mig-1g-18gb-0"]
    assert all(len(s["metadata"]["annotations"][SPEC_HASH_ANNOTATION]) == 32 for s in stored)
    assert [s["metadata"]["name"] for s in apiserver.slices("other-node")] == ["other-node-gpu-tangram-dev-0"]


async def test_a_sync_without_changes_writes_nothing(
    apiserver: LocalApiServer, kube_api: Any, tmp_path: Path
) -> None:
    nvml = simulated("l40s-8", tmp_path / "gpus.json")
    slices_publisher = publisher(kube_api)
    await slices_publisher.sync(machine_slices(nvml, NODE, generation=1))
    apiserver.requests.clear()

    report = await slices_publisher.sync(machine_slices(nvml, NODE, generation=2))

    assert report.unchanged == names(0)
    assert (report.created, report.replaced, report.deleted, report.generation) == ((), (), (), 1)
    assert [method for method, _ in apiserver.requests] == ["GET"]


async def test_mig_layout_change_replaces_changed_slices_and_deletes_unwanted_ones(
    apiserver: LocalApiServer, kube_api: Any, tmp_path: Path
) -> None:
    nvml = simulated("a100-pcie-2x2", tmp_path / "gpus.json")  # GPU 1 ships in MIG mode
    set_ampere_mig_mode(nvml, [0, 2, 3], 1)
    slices_publisher = publisher(kube_api)
    first = await slices_publisher.sync(machine_slices(nvml, NODE, generation=1))
    assert first.created == names(0, 1, 2)
    assert [len(device_names(s)) for s in apiserver.slices(NODE)] == [0, 50, 50]  # 4 GPUs x 25 placements

    set_ampere_mig_mode(nvml, [0, 2, 3], 0)
    report = await slices_publisher.sync(machine_slices(nvml, NODE, generation=2))

    assert report.ok, report.error
    assert (report.created, report.replaced, report.deleted) == ((), names(0, 1), names(2))
    counters, devices = apiserver.slices(NODE)
    assert [cs["name"] for cs in counters["spec"]["sharedCounters"]] == ["gpu-1-counters"]
    assert [d for d in device_names(devices) if "-mig-" not in d] == ["gpu-0", "gpu-2", "gpu-3"]
    assert len(device_names(devices)) == 28
    assert devices["spec"]["pool"] == {"name": NODE, "generation": 2, "resourceSliceCount": 2}


async def test_a_created_mig_instance_rewrites_the_pool_at_a_new_generation(
    apiserver: LocalApiServer, kube_api: Any, tmp_path: Path
) -> None:
    nvml = simulated("hgx-h200", tmp_path / "gpus.json")
    slices_publisher = publisher(kube_api)
    await slices_publisher.sync(machine_slices(nvml, NODE, generation=1))
    before = {s["metadata"]["name"]: s for s in apiserver.slices(NODE)}

    gpu0 = nvml.nvmlDeviceGetHandleByIndex(0)  # ships in MIG mode
    profile = nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu0, 0)  # 1g profile index
    placement = type("Placement", (), {"start": 6, "size": 1})()
    nvml.nvmlDeviceCreateGpuInstanceWithPlacement(gpu0, profile.id, placement)
    report = await slices_publisher.sync(machine_slices(nvml, NODE, generation=2))

    assert report.ok, report.error
    assert report.replaced == names(0, 1, 2, 3, 4)  # one generation across the pool
    after = {s["metadata"]["name"]: s for s in apiserver.slices(NODE)}
    assert {s["spec"]["pool"]["generation"] for s in after.values()} == {2}
    changed = [
        name
        for name in after
        if after[name]["metadata"]["annotations"] != before[name]["metadata"]["annotations"]
    ]
    assert changed == [names(1)[0]]  # the slice of GPUs 0 and 1
    [instance] = [d for d in after[names(1)[0]]["spec"]["devices"] if d["name"] == "gpu-0-mig-1g-18gb-6"]
    [placement_before] = [
        d for d in before[names(1)[0]]["spec"]["devices"] if d["name"] == "gpu-0-mig-1g-18gb-6"
    ]
    assert "uuid" in instance["attributes"] and "uuid" not in placement_before["attributes"]


async def test_slices_of_an_older_run_are_deleted_and_the_generation_keeps_growing(
    apiserver: LocalApiServer, kube_api: Any, tmp_path: Path
) -> None:
    apiserver.put_object(foreign_slice(NODE, 7, 5))  # a leftover at generation 5
    apiserver.put_object(foreign_slice("other-node", 7, 5))
    slices = machine_slices(simulated("l40s-8", tmp_path / "gpus.json"), NODE, generation=1)

    report = await publisher(kube_api).sync(slices)

    assert (report.created, report.deleted, report.generation) == (names(0), names(7), 6)
    assert [s["spec"]["pool"]["generation"] for s in apiserver.slices(NODE)] == [6]
    assert [s["metadata"]["name"] for s in apiserver.slices("other-node")] == ["other-node-gpu-tangram-dev-7"]


async def test_conflicting_writes_are_retried_and_the_result_is_consistent(
    apiserver: LocalApiServer, kube_api: Any, tmp_path: Path
) -> None:
    nvml = simulated("l40s-8", tmp_path / "gpus.json")
    slices_publisher = publisher(kube_api)
    await slices_publisher.sync(machine_slices(nvml, NODE, generation=1))
    nvml.sim_set_lost(4)
    wanted = machine_slices(nvml, NODE, generation=2)

    apiserver.race_next_replaces(3)
    report = await slices_publisher.sync(wanted)

    assert report.ok, report.error
    assert report.conflicts == 3
    assert report.replaced == names(0)
    puts = [path for method, path in apiserver.requests if method == "PUT"]
    assert len(puts) == 4
    [stored] = apiserver.slices(NODE)
    assert stored["spec"] == wanted[0]["spec"]
    assert stored["metadata"]["labels"] == {"example.com/touched": "3"}  # the other writer was there
    assert stored["metadata"]["generation"] == 2  # spec changed once, label edits do not count


async def test_endless_conflicts_give_up_without_raising_and_the_next_sync_recovers(
    apiserver: LocalApiServer, kube_api: Any, tmp_path: Path
) -> None:
    nvml = simulated("l40s-8", tmp_path / "gpus.json")
    slices_publisher = publisher(kube_api, max_conflict_retries=2)
    await slices_publisher.sync(machine_slices(nvml, NODE, generation=1))
    nvml.sim_set_lost(4)
    wanted = machine_slices(nvml, NODE, generation=2)

    apiserver.race_next_replaces(3)
    failed = await slices_publisher.sync(wanted)

    assert failed.error is not None and "409 Conflict" in failed.error
    assert (failed.conflicts, failed.replaced) == (2, ())
    assert slices_publisher.pending
    recovered = await slices_publisher.sync(wanted)
    assert (recovered.ok, recovered.replaced, recovered.conflicts) == (True, names(0), 0)
    assert apiserver.slices(NODE)[0]["spec"] == wanted[0]["spec"]


async def test_server_errors_are_reported_not_raised_and_retried_after_backoff(
    apiserver: LocalApiServer, kube_api: Any, tmp_path: Path
) -> None:
    slices = machine_slices(simulated("l40s-8", tmp_path / "gpus.json"), NODE, generation=1)
    slow = publisher(kube_api, backoff_s=60.0, max_backoff_s=60.0)

    apiserver.fail_next(1, status=500)
    failed = await slow.sync(slices)

    assert failed.error is not None and "500 InternalError" in failed.error
    assert failed.retry_in_s == 60.0
    assert apiserver.slices(NODE) == []
    assert await slow.retry_if_due() is None  # not before the backoff has passed

    quick = publisher(kube_api, backoff_s=0.01, max_backoff_s=0.01)
    apiserver.fail_next(1, status=503)
    assert not (await quick.sync(slices)).ok
    retried = None
    while retried is None:
        await asyncio.sleep(0.01)
        retried = await quick.retry_if_due()
    assert (retried.ok, retried.created) == (True, names(0))
    assert not quick.pending
    assert await quick.retry_if_due() is None


async def test_a_server_that_is_down_is_reported_and_the_next_sync_recovers(
    apiserver: LocalApiServer, kube_api: Any, tmp_path: Path
) -> None:
    slices = machine_slices(simulated("l40s-8", tmp_path / "gpus.json"), NODE, generation=1)
    slices_publisher = publisher(kube_api, request_timeout_s=5.0)
    await apiserver.stop()

    down = await slices_publisher.sync(slices)

    assert down.error is not None and ": 0 Unreachable" in down.error
    assert slices_publisher.pending
    await apiserver.start()
    up = await slices_publisher.sync(slices)
    assert (up.ok, up.created) == (True, names(0))
    assert [s["metadata"]["name"] for s in apiserver.slices(NODE)] == list(names(0))


async def test_the_server_rejects_an_invalid_slice_and_the_error_says_why(
    apiserver: LocalApiServer, kube_api: Any, tmp_path: Path
) -> None:
    [resource_slice] = machine_slices(simulated("l40s-8", tmp_path / "gpus.json"), NODE, generation=1)
    resource_slice["spec"]["devices"][0]["colour"] = "blue"  # not a field of Device

    report = await publisher(kube_api).sync([resource_slice])

    assert report.error is not None
    assert "422 Invalid" in report.error and "colour" in report.error
    assert apiserver.slices(NODE) == []


async def test_slices_of_another_node_are_refused(kube_api: Any, tmp_path: Path) -> None:
    slices = machine_slices(simulated("l40s-8", tmp_path / "gpus.json"), "other-node", generation=1)
    with pytest.raises(SliceInputError, match="'other-node'"):
        await publisher(kube_api).sync(slices)
