"""tangram_claim_device_info: one series per prepared device and pod, read from what is prepared
at each scrape, so an unprepared claim's series are gone from the next scrape."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from tangram.cdi.devices import ClaimRef, ResolvedAllocation, ResolvedDevice
from tangram.events import DeviceShare
from tangram.kubelet.devicemetrics import ClaimDeviceCollector, device_info_rows

WHOLE = ResolvedDevice(request="gpu", pool="n1", device="gpu-1", gpu_index=1, gpu_uuid="GPU-A", gpu_minor=1)
MIG = ResolvedDevice(
    request="gpu",
    pool="n1",
    device="gpu-0-mig-1g.18gb-3",
    gpu_index=0,
    gpu_uuid="GPU-B",
    gpu_minor=0,
    mig_uuid="MIG-X",
    profile="1g.18gb",
    gpu_instance_id=11,
)


def allocation(uid: str, name: str, devices: list[ResolvedDevice], pods: list[str]) -> ResolvedAllocation:
    return ResolvedAllocation(claim=ClaimRef(namespace="ml", name=name, uid=uid), devices=devices, pods=pods)


def test_a_row_per_device_and_pod_with_the_keys_dcgm_is_joined_on() -> None:
    shared = ResolvedDevice(
        request="gpu",
        pool="n1",
        device="gpu-2-shared",
        gpu_index=2,
        gpu_uuid="GPU-C",
        gpu_minor=2,
        share=DeviceShare(id="share-1"),
    )
    prepared = {
        "u1": allocation("u1", "big", [WHOLE, MIG], ["train-0", "train-1"]),
        "u2": allocation("u2", "chat", [shared], []),
    }
    assert device_info_rows("n1", prepared) == [
        ("ml", "train-0", "big", "u1", "n1", "gpu-1", "GPU-A", "", "", "", ""),
        ("ml", "train-0", "big", "u1", "n1", "gpu-0-mig-1g.18gb-3", "GPU-B", "MIG-X", "11", "1g.18gb", ""),
        ("ml", "train-1", "big", "u1", "n1", "gpu-1", "GPU-A", "", "", "", ""),
        ("ml", "train-1", "big", "u1", "n1", "gpu-0-mig-1g.18gb-3", "GPU-B", "MIG-X", "11", "1g.18gb", ""),
        # pods not known (claims not read from Kubernetes): one row with no pod
        ("ml", "", "chat", "u2", "n1", "gpu-2-shared", "GPU-C", "", "", "", "share-1"),
    ]


def test_the_series_follow_what_is_prepared_scrape_by_scrape() -> None:
    registry = CollectorRegistry()
    collector = ClaimDeviceCollector()
    registry.register(collector)
    prepared = {"u1": allocation("u1", "big", [MIG], ["train-0"])}
    collector.watch("plugin", "n1", lambda: prepared)
    text = generate_latest(registry).decode()
    assert 'tangram_claim_device_info{claim="big",claim_uid="u1",device="gpu-0-mig-1g.18gb-3"' in text
    assert 'gpu_instance_id="11"' in text and 'pod="train-0"' in text
    prepared.clear()  # unprepared
    assert "claim_uid=" not in generate_latest(registry).decode()
    prepared["u1"] = allocation("u1", "big", [MIG], ["train-0"])
    collector.forget("plugin")  # the plugin stopped
    assert "claim_uid=" not in generate_latest(registry).decode()
