"""What nodes of the same hardware share: device layout, counters, MIG geometry and topology.

Nodes whose inventories differ only in identities (UUIDs, NVLink domain and clique ids, existing
MIG instances) have one shape, so selector results and topology tables are computed once per
shape instead of once per node.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgspec

from tangram.allocation.links import PairTable
from tangram.dra.model import Device, NodeDevices
from tangram.dra.names import SHARED_SUFFIX, memory_slice_counter, qualified
from tangram.events.inventory import GpuInfo, NodeHardware

# Attributes whose values differ between otherwise identical nodes; a selector that names one of
# them is evaluated per node instead of per shape.
IDENTITY_ATTRIBUTES = ("uuid", "parentUUID", "nvlinkDomain", "cliqueId")

# MIG sizes in memory slices, largest first: the order in which lost placements weigh.
SIZE_CLASSES = (8, 4, 2, 1)


def shape_signature(hw: NodeHardware) -> str:
    gpus = [
        msgspec.structs.replace(
            gpu,
            uuid="",
            pci_bus_id="",
            minor=0,
            nvlink_domain=None,
            clique_id=None,
            mig_instances=[],
            processes=0,
            health_reason="",
        )
        for gpu in sorted(hw.gpus, key=lambda g: g.index)
    ]
    stripped = msgspec.structs.replace(hw, node="", cuda_driver_version="", gpus=gpus)
    return hashlib.sha1(msgspec.json.encode(stripped), usedforsecurity=False).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class DeviceShape:
    index: int
    name: str
    kind: str
    gpu_index: int
    size: int  # memory slices it takes: a MIG placement's size, a whole GPU's total (0 if not MIG-capable)
    mask: int  # memory slices as bits
    profile_id: int | None
    consumes: tuple[tuple[str, tuple[tuple[str, int], ...]], ...]  # (counter set, ((counter, amount), ...))
    # The same consumption split for a fast fit test: memory-slice counters of one counter set as
    # bits (each a 0/1 counter), and every other counter as (counter set, counter, amount).
    slice_set: str | None = None
    slice_bits: int = 0
    needs: tuple[tuple[str, str, int], ...] = ()
    shared: bool = False  # a share host: several claims may hold it (see NodeState.hosts)
    twin: int = -1  # a share host's exclusive device: same GPU or placement, same counters
    memory: int = 0  # bytes: a share host's memory, what its shares divide


@dataclass(frozen=True, slots=True)
class GpuShape:
    index: int
    slices: int  # memory slices (0 without MIG)
    whole: int | None  # the whole-GPU device, if advertised
    mig: tuple[int, ...]  # MIG placement devices
    counter_set: str | None
    placements: tuple[tuple[int, int], ...]  # (size, mask) of every profile's placements
    uncounted_slices: int = 0  # memory slices with no one-unit counter in counter_set: never free
    shared: tuple[int, ...] = ()  # share host devices


class NodeShape:
    """Static facts for every node with this signature."""

    def __init__(self, signature: str, hw: NodeHardware, devices: NodeDevices) -> None:
        self.signature = signature
        self.counter_sets = {cs.name: dict(cs.counters) for cs in devices.counter_sets}
        # Per counter set, its one-unit memory-slice counters as (bit, counter name).
        self.slice_counters: dict[str, tuple[tuple[int, str], ...]] = {
            name: tuple(
                (s, memory_slice_counter(s)) for s in range(64) if counters.get(memory_slice_counter(s)) == 1
            )
            for name, counters in self.counter_sets.items()
        }
        by_index: dict[int, GpuInfo] = {}
        for g in hw.gpus:
            by_index.setdefault(g.index, g)
        index_by_name = {d.name: i for i, d in enumerate(devices.devices)}
        self.devices: tuple[DeviceShape, ...] = tuple(
            _device_shape(
                i, d, by_index[d.gpu_index], self.slice_counters, index_by_name, driver=devices.driver
            )
            for i, d in enumerate(devices.devices)
        )
        self.index_by_name = index_by_name
        self.has_share_hosts = any(d.shared for d in self.devices)
        self.pairs = PairTable([g.index for g in hw.gpus], hw.links)
        per_gpu: dict[int, list[DeviceShape]] = {}
        for d in self.devices:
            per_gpu.setdefault(d.gpu_index, []).append(d)
        gpus: dict[int, GpuShape] = {}
        for gpu in sorted(hw.gpus, key=lambda g: g.index):
            mine = per_gpu.get(gpu.index, [])
            whole = next((d.index for d in mine if d.kind == "gpu" and not d.shared), None)
            mig = tuple(d.index for d in mine if d.kind == "mig" and not d.shared)
            sets = {name for d in mine for name, _ in d.consumes}
            counter_set = min(sets) if sets else None
            slices = gpu.memory_slices if mig else 0
            counted = {bit for bit, _ in self.slice_counters.get(counter_set or "", ())}
            gpus[gpu.index] = GpuShape(
                index=gpu.index,
                slices=slices,
                whole=whole,
                mig=mig,
                counter_set=counter_set,
                placements=tuple(sorted((self.devices[i].size, self.devices[i].mask) for i in mig)),
                uncounted_slices=sum(1 << s for s in range(slices) if s not in counted),
                shared=tuple(d.index for d in mine if d.shared),
            )
        self.gpus = gpus
        # GPU indexes in order, each one's position in that order, and its memory slices.
        self.gpu_order: tuple[int, ...] = tuple(sorted(gpus))
        self.gpu_positions: dict[int, int] = {g: p for p, g in enumerate(self.gpu_order)}
        self.gpu_widths: tuple[int, ...] = tuple(gpus[g].slices for g in self.gpu_order)
        by_set: dict[str, list[int]] = {name: [] for name in self.counter_sets}
        for d in self.devices:
            for name in dict.fromkeys(s for s, _ in d.consumes):
                if name in by_set:
                    by_set[name].append(d.index)
        self.devices_by_set: dict[str, tuple[int, ...]] = {name: tuple(v) for name, v in by_set.items()}
        self.whole_gpus = tuple(g.index for g in gpus.values() if g.whole is not None)
        self._best_set_scores: dict[int, int] = {}
        self.largest_nvlink_set = self.pairs.largest_nvlink_set(self.whole_gpus)

    def best_set_score(self, k: int) -> int:
        """The highest set score of any k whole GPUs of the hardware (0 for fewer than 2), once per k."""
        found = self._best_set_scores.get(k)
        if found is None:
            found = self._best_set_scores[k] = self.pairs.best_set_score(self.whole_gpus, k)
        return found


def _device_shape(
    index: int,
    device: Device,
    gpu: GpuInfo,
    slice_counters: dict[str, tuple[tuple[int, str], ...]],
    index_by_name: dict[str, int],
    *,
    driver: str,
) -> DeviceShape:
    if device.placement is not None:
        size = device.placement.size
        mask = sum(1 << s for s in device.placement.slices)
    else:
        size = gpu.memory_slices if device.consumes else 0
        mask = (1 << size) - 1
    consumes = tuple((c.counter_set, tuple(sorted(c.counters.items()))) for c in device.consumes)
    slice_set = consumes[0][0] if consumes else None
    bit_of = {name: bit for bit, name in slice_counters.get(slice_set or "", ())}
    slice_bits = 0
    needs: list[tuple[str, str, int]] = []
    for set_name, counters in consumes:
        for counter, amount in counters:
            if set_name == slice_set and counter in bit_of and amount == 1:
                slice_bits |= 1 << bit_of[counter]
            else:
                needs.append((set_name, counter, amount))
    return DeviceShape(
        index=index,
        name=device.name,
        kind=device.kind,
        gpu_index=device.gpu_index,
        size=size,
        mask=mask,
        profile_id=device.profile_id,
        consumes=consumes,
        slice_set=slice_set,
        slice_bits=slice_bits,
        needs=tuple(needs),
        shared=device.shared,
        twin=index_by_name[device.name.removesuffix(SHARED_SUFFIX)] if device.shared else -1,
        memory=device.capacity.get(qualified(driver, "memory"), 0),
    )


_LOSS_CACHE: dict[tuple[tuple[tuple[int, int], ...], int, int], tuple[int, ...]] = {}


def placement_loss(placements: tuple[tuple[int, int], ...], occupied: int, taken: int) -> tuple[int, ...]:
    """Still-placeable MIG placements, by size class largest first, that taking `taken` slices destroys."""
    key = (placements, occupied, taken)
    loss = _LOSS_CACHE.get(key)
    if loss is None:
        counts = dict.fromkeys(SIZE_CLASSES, 0)
        for size, mask in placements:
            if mask & occupied == 0 and mask & taken and size in counts:
                counts[size] += 1
        loss = tuple(counts[s] for s in SIZE_CLASSES)
        if len(_LOSS_CACHE) > 100_000:
            _LOSS_CACHE.clear()
        _LOSS_CACHE[key] = loss
    return loss


def placeable(placements: tuple[tuple[int, int], ...], occupied: int) -> tuple[int, ...]:
    """Placeable MIG placements by size class, largest first, given the occupied slices."""
    return placement_loss(placements, occupied, (1 << 16) - 1)
