"""A node's GPU inventory, read through NVML calls only (identical on real and simulated NVML)."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations
from typing import Any

import msgspec
import pynvml

from tangram.events.inventory import GpuInfo, MigInstance, MigPlacement, MigProfile, NodeHardware
from tangram.hardware.catalogue import (
    GpuProduct,
    product_by_nvml_name,
    product_by_pci_device_id,
)
from tangram.hardware.topology import PairFacts, compute_links, nvlink_domains
from tangram.nvml import calls
from tangram.nvml.backend import Device, NvmlBackend
from tangram.nvml.migminors import capability_minors

_GI_PROFILE_INDEXES = range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
_CI_PROFILE_INDEXES = range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
_MIB = 1024 * 1024


def semver_driver(version: str) -> str:
    """ "580.95.05" -> "580.95.5"; "535.104" -> "535.104.0" (DRA compares driverVersion as semver)."""
    parts = [str(int(p)) for p in version.strip().split(".") if p.isdigit()]
    return ".".join([*parts, "0", "0"][:3]) if parts else "0.0.0"


def _cuda_version(nvml: NvmlBackend) -> str:
    try:
        raw = nvml.nvmlSystemGetCudaDriverVersion()
    except pynvml.NVMLError:
        return ""
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def _try(call: Any, *args: Any, default: Any = None) -> Any:
    try:
        return call(*args)
    except pynvml.NVMLError_NotSupported:
        return default


def _product(nvml: NvmlBackend, device: Device, name: str) -> GpuProduct | None:
    pci = nvml.nvmlDeviceGetPciInfo(device)
    return product_by_pci_device_id(pci.pciDeviceId) or product_by_nvml_name(name)


def _mig_profiles(nvml: NvmlBackend, device: Device) -> list[MigProfile]:
    profiles = []
    for index in _GI_PROFILE_INDEXES:
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(device, index)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue
        placements = calls.possible_placements(nvml, device, info.id)
        name = calls.profile_name(info.name)
        profiles.append(
            MigProfile(
                profile_id=info.id,
                profile_index=index,
                name=name,
                compute_slices=info.sliceCount,
                memory_slices=placements[0][1] if placements else 0,
                memory_mib=info.memorySizeMB,
                multiprocessors=info.multiprocessorCount,
                instance_count=info.instanceCount,
                placements=[MigPlacement(start=s, size=z) for s, z in placements],
                media_extensions=name.endswith("+me"),
            )
        )
    return sorted(profiles, key=lambda p: (p.memory_slices, p.compute_slices, p.media_extensions))


def _mig_instances(nvml: NvmlBackend, device: Device, profiles: list[MigProfile]) -> list[MigInstance]:
    devices = calls.mig_devices(nvml, device)
    instances = []
    for profile in profiles:
        for gi in calls.gpu_instances(nvml, device, profile.profile_id, profile.instance_count):
            gi_info = nvml.nvmlGpuInstanceGetInfo(gi)
            placement = MigPlacement(start=gi_info.placement.start, size=gi_info.placement.size)
            ci_ids = []
            for ci_index in _CI_PROFILE_INDEXES:
                try:
                    cis = calls.compute_instances(nvml, gi, ci_index)
                except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                    continue
                ci_ids += [nvml.nvmlComputeInstanceGetInfo(ci).id for ci in cis]
            # A GPU instance without a compute instance still holds its slices (compute_instance_id -1).
            for ci_id in sorted(ci_ids) or [-1]:
                uuid, busy = devices.get((gi_info.id, ci_id), ("", False))
                instances.append(
                    MigInstance(
                        uuid=uuid,
                        profile_id=profile.profile_id,
                        profile=profile.name,
                        placement=placement,
                        gpu_instance_id=gi_info.id,
                        compute_instance_id=ci_id,
                        in_use=busy,
                    )
                )
    return sorted(instances, key=lambda m: (m.placement.start, m.gpu_instance_id, m.compute_instance_id))


def _read_gpu(
    nvml: NvmlBackend, index: int, device: Device, health: tuple[str, str] | None
) -> tuple[GpuInfo, dict[str, Any]]:
    name = calls.text(nvml.nvmlDeviceGetName(device))
    pci = nvml.nvmlDeviceGetPciInfo(device)
    bus_id = calls.text(pci.busId)
    product = _product(nvml, device, name)
    major, minor_cc = nvml.nvmlDeviceGetCudaComputeCapability(device)
    extra: dict[str, Any] = {"bus_id": bus_id.upper()}
    fields: dict[str, Any] = {
        "index": index,
        "uuid": calls.text(nvml.nvmlDeviceGetUUID(device)),
        "name": name,
        "product": product.key if product else name.removeprefix("NVIDIA ").replace(" ", "-"),
        "architecture": product.architecture if product else "unknown",
        "cuda_compute_capability": f"{major}.{minor_cc}",
        "pci_bus_id": bus_id,
        "minor": nvml.nvmlDeviceGetMinorNumber(device),
        "numa_node": _try(nvml.nvmlDeviceGetNumaNodeId, device),
        "pcie_root": nvml.pcie_root_of(bus_id),
    }
    if fields["numa_node"] is not None and fields["numa_node"] < 0:
        fields["numa_node"] = None
    try:
        memory = nvml.nvmlDeviceGetMemoryInfo(device)
        fields["memory_mib"] = memory.total // _MIB
        cores = nvml.nvmlDeviceGetNumGpuCores(device)
        per_sm = 64 if fields["architecture"] == "ampere" else 128
        fields["multiprocessors"] = product.multiprocessors if product else cores // per_sm
        fields["processes"] = len(nvml.nvmlDeviceGetComputeRunningProcesses(device))
        mig_mode = _try(nvml.nvmlDeviceGetMigMode, device)
        if mig_mode is not None:
            profiles = _mig_profiles(nvml, device)
            enabled = mig_mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            fields.update(
                mig_capable=True,
                mig_enabled=enabled,
                mig_toggle_needs_reset=product.mig_toggle_needs_reset if product else False,
                memory_slices=max((p.memory_slices for p in profiles), default=0),
                compute_slices=max((p.compute_slices for p in profiles), default=0),
                mig_profiles=profiles,
                mig_instances=_mig_instances(nvml, device, profiles) if enabled else [],
            )
    except pynvml.NVMLError_GpuIsLost:
        fields.setdefault("memory_mib", product.memory_mib if product else 0)
        fields.setdefault("multiprocessors", product.multiprocessors if product else 0)
        health = ("unhealthy", "GPU is lost (fell off the bus)")
    if health is not None:
        fields["health"], fields["health_reason"] = health
    return GpuInfo(**fields), extra


def _nvlink_peers(nvml: NvmlBackend, device: Device) -> tuple[dict[str, int], set[str], int]:
    """(links per remote GPU bus id, bus ids of the NVSwitches its links end at, switch link count)."""
    to_gpus: dict[str, int] = {}
    switches: set[str] = set()
    switch_links = 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(device, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
            remote = calls.text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(device, link).busId).upper()
            kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(device, link)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue
        except pynvml.NVMLError_GpuIsLost:
            return {}, set(), 0
        if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            switches.add(remote)
            switch_links += 1
        elif kind == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU:
            to_gpus[remote] = to_gpus.get(remote, 0) + 1
    return to_gpus, switches, switch_links


def _clique(nvml: NvmlBackend, device: Device) -> tuple[str, bool] | None:
    """The GPU's fabric clique ("<cluster uuid>.<clique id>") and whether its NVLink bandwidth is
    degraded; None when the GPU is in no fabric or its registration is not complete."""
    try:
        info = calls.fabric_info(nvml, device)
    except pynvml.NVMLError:
        return None
    raw = bytes(info.clusterUuid)
    if (
        info.state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        or info.status != pynvml.NVML_SUCCESS
        or not any(raw)
    ):
        return None
    h = raw.hex()
    degraded_bw = (info.healthMask >> pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW) & (
        (1 << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW) - 1
    )
    clique = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}.{info.cliqueId}"
    return clique, degraded_bw == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE


# Reading a node takes many NVML calls; the partitioner may change the GPUs in between (MIG mode
# turned off, an instance destroyed), and a call then fails for a handle read a moment before.
_CHANGED_WHILE_READ = (
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_NOT_FOUND,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
)


def read_node_hardware(
    nvml: NvmlBackend,
    node: str,
    *,
    health: Mapping[int, tuple[str, str]] | None = None,
    minors: Mapping[str, int] | None = None,
    attempts: int = 5,
) -> NodeHardware:
    """The node's inventory. `health` overrides per GPU index (from an XID watcher), e.g.
    {3: ("unhealthy", "XID 79")}; `minors` is the mig-minors table, so that existing MIG instances
    carry the capability minors their device nodes need. NVML must be initialised by the caller.
    A read that the GPUs changed under is read again (up to `attempts` times)."""
    for attempt in range(attempts):
        try:
            return _read_node_hardware(nvml, node, health=health, minors=minors)
        except pynvml.NVMLError as exc:
            if exc.value not in _CHANGED_WHILE_READ or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _read_node_hardware(
    nvml: NvmlBackend,
    node: str,
    *,
    health: Mapping[int, tuple[str, str]] | None,
    minors: Mapping[str, int] | None,
) -> NodeHardware:
    count = nvml.nvmlDeviceGetCount()
    devices = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    gpus: list[GpuInfo] = []
    bus_ids: list[str] = []
    for index, device in enumerate(devices):
        info, extra = _read_gpu(nvml, index, device, (health or {}).get(index))
        gpus.append(info)
        bus_ids.append(extra["bus_id"])
    by_bus = {bus: i for i, bus in enumerate(bus_ids)}

    peers: list[dict[int, int]] = []
    switch_sets: list[set[str]] = []
    switch_counts: list[int] = []
    for device in devices:
        to_gpus, switches, switch_links = _nvlink_peers(nvml, device)
        peers.append({by_bus[b]: n for b, n in to_gpus.items() if b in by_bus})
        switch_sets.append(switches)
        switch_counts.append(switch_links)

    facts = []
    for a, b in combinations(range(count), 2):
        if switch_sets[a] & switch_sets[b]:
            # Switch-attached: every pair talks over all of its links (NV18 on HGX H100/H200).
            nvlinks = min(switch_counts[a], switch_counts[b])
        else:
            nvlinks = peers[a].get(b, 0)
        level = nvml.nvmlDeviceGetTopologyCommonAncestor(devices[a], devices[b])
        p2p = nvml.nvmlDeviceGetP2PStatus(devices[a], devices[b], pynvml.NVML_P2P_CAPS_INDEX_READ)
        facts.append(
            PairFacts(a=a, b=b, nvlinks=nvlinks, pcie_level=level, p2p=p2p == pynvml.NVML_P2P_STATUS_OK)
        )
    links = compute_links(gpus, facts)

    fabric = {i: c for i, d in enumerate(devices) if (c := _clique(nvml, d)) is not None}
    cliques = {i: clique for i, (clique, _) in fabric.items()}
    groups = _switch_groups(switch_sets)
    domains = nvlink_domains(node, list(range(count)), links, switch_groups=groups, cliques=cliques)
    gpus = [
        msgspec.structs.replace(
            g,
            nvlink_domain=domains[g.index],
            clique_id=cliques.get(g.index),
            fabric_degraded=g.index in fabric and fabric[g.index][1],
            mig_instances=_with_minors(g, minors) if minors else g.mig_instances,
        )
        for g in gpus
    ]
    return NodeHardware(
        node=node,
        driver_version=semver_driver(nvml.nvmlSystemGetDriverVersion()),
        cuda_driver_version=_cuda_version(nvml),
        gpus=gpus,
        links=links,
    )


def _with_minors(gpu: GpuInfo, minors: Mapping[str, int]) -> list[MigInstance]:
    result = []
    for instance in gpu.mig_instances:
        gi, ci = capability_minors(minors, gpu.minor, instance.gpu_instance_id, instance.compute_instance_id)
        result.append(msgspec.structs.replace(instance, gi_cap_minor=gi, ci_cap_minor=ci))
    return result


def _switch_groups(switch_sets: list[set[str]]) -> dict[int, str]:
    """GPUs whose links reach a common NVSwitch share a group (union of overlapping switch sets)."""
    groups: dict[int, str] = {}
    parents = list(range(len(switch_sets)))

    def root(i: int) -> int:
        while parents[i] != i:
            parents[i] = parents[parents[i]]
            i = parents[i]
        return i

    for a, b in combinations(range(len(switch_sets)), 2):
        if switch_sets[a] & switch_sets[b]:
            parents[root(b)] = root(a)
    for i, switches in enumerate(switch_sets):
        if switches:
            groups[i] = str(root(i))
    return groups
