"""What a cluster without partitionable devices (or without device taints) is offered."""

from tangram.dra import node_devices, untainted_only, whole_devices_only
from tests.kubernetes.objects.nodes import h100_node, l40s_node
from tests.support.driver import DRIVER


def test_whole_gpus_and_existing_instances_only_without_counters() -> None:
    full = node_devices(h100_node(), driver=DRIVER)
    degraded = whole_devices_only(full)

    # GPU 1 holds a 3g instance at slice 4: it offers that instance, not itself
    assert [d.name for d in degraded.devices] == [
        "gpu-0",
        "gpu-1-mig-3g-40gb-4",
        *(f"gpu-{i}" for i in range(2, 8)),
    ]
    assert degraded.counter_sets == [] and all(d.consumes == [] for d in degraded.devices)
    assert len(full.devices) > 8 * 20 and full.counter_sets  # the full view had every placement
    [instance] = [d for d in degraded.devices if d.kind == "mig"]
    assert instance.attributes[f"{DRIVER}/uuid"] == "MIG-5c3f0f6e-1111-4222-8333-444455556666"


def test_tainted_devices_are_left_out_where_taints_are_dropped() -> None:
    devices = node_devices(l40s_node(unhealthy=frozenset({2})), driver=DRIVER)
    assert [d.name for d in untainted_only(devices).devices] == ["gpu-0", "gpu-1", "gpu-3"]
    assert [d.name for d in devices.devices if d.taints] == ["gpu-2"]
