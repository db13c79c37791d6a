"""Reading a claim's allocation for this node, and Tangram's TopologyConfig enforced at prepare."""

from __future__ import annotations

from typing import Any

import pytest

from tangram.cdi.devices import ClaimRef
from tangram.dra import node_devices
from tangram.dra.imex import ImexChannel
from tangram.kubelet.claimstatus import ClaimRefused, check_topology, read_allocation, reserved_pods
from tests.allocator.helpers import hardware
from tests.support.driver import DRIVER

NODE = "nvl"
CLAIM = ClaimRef(namespace="ml", name="tp", uid="0b5d0000-0000-4000-8000-000000000001")
HW = hardware("h100-nvl-4x2", NODE)  # NVLink bridges join GPUs 0-1, 2-3, 4-5, 6-7 at 600 GB/s
DEVICES = {d.name: d for d in node_devices(HW, driver=DRIVER).devices}


def topology(**parameters: Any) -> dict[str, Any]:
    return {
        "source": "FromClaim",
        "requests": ["gpus"],
        "opaque": {
            "driver": DRIVER,
            "parameters": {"apiVersion": "gpu.tangram.dev/v1alpha1", "kind": "TopologyConfig", **parameters},
        },
    }


def claim(devices: list[str], config: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    results = [{"request": "gpus", "driver": DRIVER, "pool": NODE, "device": d, **extra} for d in devices]
    return {
        "metadata": {"name": CLAIM.name, "namespace": CLAIM.namespace, "uid": CLAIM.uid},
        "status": {"allocation": {"devices": {"results": results, "config": config or []}}},
    }


def test_results_of_this_driver_are_read_with_their_request_and_admin_access() -> None:
    body = claim(["gpu-0", "gpu-1"], adminAccess=True)
    body["status"]["allocation"]["devices"]["results"].append(
        {"request": "nic", "driver": "net.example.com", "pool": "other", "device": "eth0"}
    )
    allocation = read_allocation(body, CLAIM, driver=DRIVER, pool=NODE)
    assert [(r.request, r.device, r.admin_access) for r in allocation.results] == [
        ("gpus", "gpu-0", True),
        ("gpus", "gpu-1", True),
    ]


@pytest.mark.parametrize(
    ("devices", "config"),
    [
        (["gpu-0", "gpu-1"], topology(interconnect="NVLink")),
        (["gpu-2", "gpu-3"], topology(minPairBandwidthGBps=600)),
        (["gpu-0", "gpu-5"], topology(interconnect="Any")),
    ],
)
def test_an_allocation_that_meets_its_topology_config_passes(
    devices: list[str], config: dict[str, Any]
) -> None:
    allocation = read_allocation(claim(devices, [config]), CLAIM, driver=DRIVER, pool=NODE)
    check_topology(allocation, DEVICES, HW, CLAIM)


@pytest.mark.parametrize(
    ("devices", "config", "message"),
    [
        (
            ["gpu-1", "gpu-2"],
            topology(interconnect="NVLink"),
            "GPUs 1 and 2 of node nvl are not NVLink-connected",
        ),
        (["gpu-0", "gpu-1"], topology(minPairBandwidthGBps=900), "at least 900 GB/s"),
    ],
)
def test_an_allocation_kube_scheduler_made_against_the_topology_config_is_refused(
    devices: list[str], config: dict[str, Any], message: str
) -> None:
    allocation = read_allocation(claim(devices, [config]), CLAIM, driver=DRIVER, pool=NODE)
    with pytest.raises(ClaimRefused, match=message):
        check_topology(allocation, DEVICES, HW, CLAIM)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (claim(["gpu-0"], [topology(placement="Sideways")]), r"config\[0\]\.opaque\.parameters\.placement"),
        (claim(["gpu-0"], [topology(minPairBandwidthGBps=-1)]), r"parameters\.minPairBandwidthGBps"),
        (claim(["gpu-0"], [topology(colour="red")]), r"parameters\.colour: Extra inputs are not permitted"),
        (
            claim(["gpu-0"], [{"opaque": {"driver": DRIVER, "parameters": {"kind": "MemoryConfig"}}}]),
            r"parameters\.kind: 'MemoryConfig' is not a gpu\.tangram\.dev parameter kind",
        ),
        (
            claim(["gpu-0"], [{"opaque": {"driver": DRIVER, "parameters": "x"}}]),
            r"parameters: expected an object",
        ),
        ({"metadata": {"uid": CLAIM.uid}, "status": {}}, r"is not allocated"),
        (
            {"metadata": {"uid": CLAIM.uid}, "status": {"allocation": {"devices": {"results": "x"}}}},
            "expected a list",
        ),
        (claim([]), "holds no device of driver gpu.tangram.dev"),
    ],
)
def test_unreadable_allocations_are_refused_naming_the_field(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ClaimRefused, match=message):
        read_allocation(body, CLAIM, driver=DRIVER, pool=NODE)


def test_an_opaque_config_of_another_driver_is_not_ours_to_read() -> None:
    other = {"opaque": {"driver": "net.example.com", "parameters": {"kind": "Anything"}}}
    assert read_allocation(claim(["gpu-0"], [other]), CLAIM, driver=DRIVER, pool=NODE).topology == ()


def imex(source: str = "FromClaim", nodes: tuple[str, ...] = (NODE,)) -> dict[str, Any]:
    channel = ImexChannel(domain="ml/train", clique="c.1", channel=2, nodes=nodes)
    return {"source": source, "opaque": {"driver": DRIVER, "parameters": channel.model_dump(mode="json")}}


def test_the_allocators_imex_channel_is_read() -> None:
    allocation = read_allocation(claim(["gpu-0"], [imex()]), CLAIM, driver=DRIVER, pool=NODE)
    assert allocation.imex is not None and (allocation.imex.domain, allocation.imex.channel) == (
        "ml/train",
        2,
    )


def test_an_imex_channel_a_claim_or_its_class_carries_is_refused() -> None:
    """Attack: a claim writes the kind into its own spec, kube-scheduler copies it into the
    allocation (FromClaim), and the node would hand out a channel no allocator gave."""
    forged = claim(["gpu-0"], [imex()])
    forged["spec"] = {"devices": {"requests": [], "config": [{"opaque": imex()["opaque"]}]}}
    with pytest.raises(ClaimRefused, match="an ImexChannel config is Tangram's own"):
        read_allocation(forged, CLAIM, driver=DRIVER, pool=NODE)
    with pytest.raises(ClaimRefused, match="an ImexChannel config is Tangram's own"):
        read_allocation(claim(["gpu-0"], [imex("FromClass")]), CLAIM, driver=DRIVER, pool=NODE)
    broken = imex()
    broken["opaque"]["parameters"]["channel"] = 99999
    with pytest.raises(ClaimRefused, match=r"invalid ImexChannel.*channel"):
        read_allocation(claim(["gpu-0"], [broken]), CLAIM, driver=DRIVER, pool=NODE)


def test_the_pods_a_claim_is_reserved_for_are_read_and_anything_else_left_out() -> None:
    body = {
        "status": {
            "reservedFor": [
                {"resource": "pods", "name": "train-0", "uid": "u0"},
                {"resource": "pods", "name": "train-1", "uid": "u1"},
                {"resource": "jobs", "apiGroup": "batch", "name": "train", "uid": "u2"},
                {"resource": "pods", "name": "Not A Name!", "uid": "u3"},
                {"resource": "pods", "name": 7},
                "garbage",
            ]
        }
    }
    assert reserved_pods(body) == ["train-0", "train-1"]
    assert reserved_pods({"status": {"reservedFor": "x"}}) == [] and reserved_pods([]) == []
