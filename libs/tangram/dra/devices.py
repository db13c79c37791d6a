"""Turn a node's hardware into the devices it advertises: whole GPUs and every possible MIG placement.

Partitionable devices share a per-GPU counter set (one counter per memory slice, multiprocessors,
memory, and the single media-extensions unit), so DRA can see what can be carved, not only what is.
"""

from __future__ import annotations

import re

import msgspec

from tangram import DRIVER_NAME
from tangram.dra.model import (
    AttributeValue,
    CounterConsumption,
    CounterSet,
    Device,
    DeviceTaint,
    NodeDevices,
    Version,
)
from tangram.dra.names import (
    MEDIA_EXTENSIONS_COUNTER,
    MEMORY_COUNTER,
    MULTIPROCESSORS_COUNTER,
    NUMA_NODE,
    PCIE_ROOT,
    UNHEALTHY_TAINT,
    counter_set_name,
    gpu_device_name,
    memory_slice_counter,
    mig_device_name,
    qualified,
    shared_device_name,
)
from tangram.events.inventory import GpuInfo, MigProfile, NodeHardware

MIB = 1024 * 1024
GIB = 1024 * MIB
# A share's memory as kube-scheduler's consumable capacity counts it (the device capacity's request
# policy): asked for in steps of 256 MiB, at least 256 MiB, 4 GiB when the claim names none.
SHARE_MEMORY_STEP = 256 * MIB
SHARE_MEMORY_DEFAULT = 4 * GIB
_VERSION_PART = re.compile(r"\d+")


def to_semver(version: str) -> str:
    """NVIDIA versions to semver: "580.95.05" -> "580.95.5", "9.0" -> "9.0.0"."""
    parts = [str(int(p)) for p in _VERSION_PART.findall(version)][:3]
    if not parts:
        raise ValueError(f"version {version!r} has no numeric part")
    while len(parts) < 3:
        parts.append("0")
    return ".".join(parts)


def partitionable(gpu: GpuInfo) -> bool:
    """Ampere cannot toggle MIG without a reset, so only GPUs already in MIG mode are cut there."""
    if not gpu.mig_capable or not gpu.mig_profiles:
        return False
    return gpu.mig_enabled or not gpu.mig_toggle_needs_reset


def whole_gpu_advertised(gpu: GpuInfo) -> bool:
    """An Ampere GPU in MIG mode cannot be handed out whole without a reset."""
    return not (gpu.mig_capable and gpu.mig_enabled and gpu.mig_toggle_needs_reset)


def _common_attributes(domain: str, gpu: GpuInfo, driver_version: str) -> dict[str, AttributeValue]:
    attrs: dict[str, AttributeValue] = {
        qualified(domain, "productName"): gpu.name,
        qualified(domain, "architecture"): gpu.architecture,
        qualified(domain, "cudaComputeCapability"): Version(to_semver(gpu.cuda_compute_capability)),
        qualified(domain, "driverVersion"): Version(to_semver(driver_version)),
        qualified(domain, "index"): gpu.index,
    }
    if gpu.pcie_root is not None:
        attrs[PCIE_ROOT] = gpu.pcie_root
    if gpu.numa_node is not None:
        attrs[NUMA_NODE] = gpu.numa_node
    if gpu.nvlink_domain is not None:
        attrs[qualified(domain, "nvlinkDomain")] = gpu.nvlink_domain
    if gpu.clique_id is not None:
        attrs[qualified(domain, "cliqueId")] = gpu.clique_id
    return attrs


def _taints(domain: str, gpu: GpuInfo) -> list[DeviceTaint]:
    if gpu.health == "healthy":
        return []
    return [DeviceTaint(key=qualified(domain, UNHEALTHY_TAINT), effect="NoSchedule")]


def _gpu_counters(gpu: GpuInfo) -> dict[str, int]:
    counters = {memory_slice_counter(i): 1 for i in range(gpu.memory_slices)}
    counters[MULTIPROCESSORS_COUNTER] = gpu.multiprocessors
    counters[MEMORY_COUNTER] = gpu.memory_mib * MIB
    counters[MEDIA_EXTENSIONS_COUNTER] = 1
    return counters


def _whole_gpu(domain: str, gpu: GpuInfo, driver_version: str, *, counters: bool) -> Device:
    attrs = _common_attributes(domain, gpu, driver_version)
    attrs[qualified(domain, "type")] = "gpu"
    attrs[qualified(domain, "uuid")] = gpu.uuid
    attrs[qualified(domain, "migCapable")] = gpu.mig_capable
    consumes = (
        [CounterConsumption(counter_set=counter_set_name(gpu.index), counters=_gpu_counters(gpu))]
        if counters
        else []
    )
    return Device(
        name=gpu_device_name(gpu.index),
        kind="gpu",
        gpu_index=gpu.index,
        gpu_uuid=gpu.uuid,
        attributes=attrs,
        capacity={
            qualified(domain, "memory"): gpu.memory_mib * MIB,
            qualified(domain, "multiprocessors"): gpu.multiprocessors,
        },
        consumes=consumes,
        taints=_taints(domain, gpu),
    )


def _mig_devices(domain: str, gpu: GpuInfo, driver_version: str) -> list[Device]:
    existing = {(m.profile_id, m.placement.start): m.uuid for m in gpu.mig_instances}
    devices: list[Device] = []
    for profile in sorted(gpu.mig_profiles, key=lambda p: (p.memory_slices, p.profile_id)):
        for placement in sorted(profile.placements, key=lambda p: p.start):
            attrs = _common_attributes(domain, gpu, driver_version)
            attrs[qualified(domain, "type")] = "mig"
            attrs[qualified(domain, "profile")] = profile.name
            attrs[qualified(domain, "parentUUID")] = gpu.uuid
            attrs[qualified(domain, "placementStart")] = placement.start
            attrs[qualified(domain, "placementSize")] = placement.size
            mig_uuid = existing.get((profile.profile_id, placement.start))
            if mig_uuid is not None:
                attrs[qualified(domain, "uuid")] = mig_uuid
            devices.append(
                Device(
                    name=mig_device_name(gpu.index, profile.name, placement.start),
                    kind="mig",
                    gpu_index=gpu.index,
                    gpu_uuid=gpu.uuid,
                    attributes=attrs,
                    capacity={
                        qualified(domain, "memory"): profile.memory_mib * MIB,
                        qualified(domain, "multiprocessors"): profile.multiprocessors,
                    },
                    consumes=[
                        CounterConsumption(
                            counter_set=counter_set_name(gpu.index),
                            counters=_placement_counters(profile, placement.start),
                        )
                    ],
                    taints=_taints(domain, gpu),
                    profile=profile.name,
                    profile_id=profile.profile_id,
                    placement=placement,
                )
            )
    return devices


def _share_host(domain: str, exclusive: Device) -> Device:
    """The share host of an exclusive device: the same GPU or placement and the same counters.

    Its `type` is "shared", so no selector of the exclusive classes ever matches it; `shareOf` says
    what is shared. MIG placements with media extensions are not shared (the one media unit of a
    GPU is for a claim that asks for it).
    """
    type_name = qualified(domain, "type")
    attrs: dict[str, AttributeValue] = {}
    for name, value in exclusive.attributes.items():
        if name == type_name:
            # next to `type`, before a MIG instance's `uuid`, which comes last when it exists
            attrs[name] = "shared"
            attrs[qualified(domain, "shareOf")] = exclusive.kind
        else:
            attrs[name] = value
    # Memory only: a capacity without a request policy is consumed whole by every share (as
    # kube-scheduler counts consumable capacity), so multiprocessors would let one share in.
    memory_name = qualified(domain, "memory")
    memory = {name: value for name, value in exclusive.capacity.items() if name == memory_name}
    return msgspec.structs.replace(
        exclusive, name=shared_device_name(exclusive.name), attributes=attrs, capacity=memory, shared=True
    )


def share_hosts(domain: str, gpu: GpuInfo, exclusive: list[Device]) -> list[Device]:
    """The devices of one GPU that claims may share: the whole GPU, and MIG placements smaller than
    the GPU without media extensions (a share of the full-size instance is the whole GPU's)."""
    profiles = {p.profile_id: p for p in gpu.mig_profiles}
    hosts: list[Device] = []
    for device in exclusive:
        if device.kind == "mig":
            profile = profiles.get(device.profile_id if device.profile_id is not None else -1)
            if profile is None or profile.media_extensions or profile.memory_slices >= gpu.memory_slices:
                continue
        hosts.append(_share_host(domain, device))
    return hosts


def _placement_counters(profile: MigProfile, start: int) -> dict[str, int]:
    counters = {memory_slice_counter(i): 1 for i in range(start, start + profile.memory_slices)}
    counters[MULTIPROCESSORS_COUNTER] = profile.multiprocessors
    counters[MEMORY_COUNTER] = profile.memory_mib * MIB
    if profile.media_extensions:
        counters[MEDIA_EXTENSIONS_COUNTER] = 1
    return counters


def node_devices(hw: NodeHardware, *, driver: str = DRIVER_NAME, shared: bool = False) -> NodeDevices:
    """Every device of the node in a stable order: GPU index, whole GPU first, then placements, then
    (with `shared`) the GPU's share hosts.

    A GPU that is cut, or shared, has its counter set: a share host and the device it shares
    consume the same counters, which is what keeps exclusive claims and shares of one GPU apart.
    """
    devices: list[Device] = []
    counter_sets: list[CounterSet] = []
    for gpu in sorted(hw.gpus, key=lambda g: g.index):
        cut = partitionable(gpu)
        counted = cut or shared
        if counted:
            counter_sets.append(CounterSet(name=counter_set_name(gpu.index), counters=_gpu_counters(gpu)))
        exclusive: list[Device] = []
        if whole_gpu_advertised(gpu):
            exclusive.append(_whole_gpu(driver, gpu, hw.driver_version, counters=counted))
        if cut:
            exclusive.extend(_mig_devices(driver, gpu, hw.driver_version))
        devices.extend(exclusive)
        if shared:
            devices.extend(share_hosts(driver, gpu, exclusive))
    return NodeDevices(node=hw.node, driver=driver, pool=hw.node, devices=devices, counter_sets=counter_sets)


def whole_devices_only(devices: NodeDevices) -> NodeDevices:
    """What a cluster without partitionable devices can be offered: whole GPUs and existing MIG instances.

    Without counters the scheduler cannot see that placements overlap or that a whole GPU excludes
    its instances, so only devices that exist side by side are kept: a GPU with MIG instances offers
    those instances (and not itself), any other GPU offers itself.
    """
    cut = {d.gpu_index for d in devices.devices if d.kind == "mig" and _exists(d)}
    kept = [
        msgspec.structs.replace(d, consumes=[])
        for d in devices.devices
        if not d.shared and ((d.kind == "gpu" and d.gpu_index not in cut) or (d.kind == "mig" and _exists(d)))
    ]
    return msgspec.structs.replace(devices, devices=kept, counter_sets=[])


def untainted_only(devices: NodeDevices) -> NodeDevices:
    """Where the API server drops device taints, a tainted device must not be offered at all."""
    return msgspec.structs.replace(devices, devices=[d for d in devices.devices if not d.taints])


def _exists(device: Device) -> bool:
    """A MIG placement carries a uuid attribute only when its instance exists."""
    return any(name.rpartition("/")[2] == "uuid" for name in device.attributes)
