"""One node's changing state: what is allocated, what counters remain, which devices are free."""

from __future__ import annotations

from collections.abc import Iterable

from tangram.allocation.shape import DeviceShape, NodeShape
from tangram.dra.model import Device, NodeDevices
from tangram.dra.names import memory_slice_counter
from tangram.events.inventory import NodeHardware


class ExistingInstance:
    __slots__ = ("in_use", "mask", "profile_id", "start", "uuid")

    def __init__(self, profile_id: int, start: int, size: int, uuid: str, in_use: bool) -> None:
        self.profile_id = profile_id
        self.start = start
        self.mask = sum(1 << s for s in range(start, start + size))
        self.uuid = uuid
        self.in_use = in_use


class NodeState:
    """Availability is kept per device and refreshed per GPU, so a claim reads it without recomputing."""

    def __init__(self, hw: NodeHardware, devices: NodeDevices, shape: NodeShape, generation: int) -> None:
        self.name = hw.node
        self.hw = hw
        self.devices: tuple[Device, ...] = tuple(devices.devices)
        self.driver = devices.driver
        self.pool = devices.pool
        self.shape = shape
        self.generation = generation
        self.gpu_uuid = {g.index: g.uuid for g in hw.gpus}
        self.allocated: dict[int, str] = {}  # device -> claim uid (admin access never lands here)
        self.remaining: dict[str, dict[str, int]] = {k: dict(v) for k, v in shape.counter_sets.items()}
        self.destroying: set[tuple[int, int, int]] = set()  # (gpu, profile id, start) being destroyed
        self.existing: dict[int, list[ExistingInstance]] = {
            g.index: [
                ExistingInstance(m.profile_id, m.placement.start, m.placement.size, m.uuid, m.in_use)
                for m in g.mig_instances
            ]
            for g in hw.gpus
        }
        self.available: list[bool] = [False] * len(shape.devices)
        self.occupied: dict[int, int] = dict.fromkeys(shape.gpus, 0)
        self.whole_free: dict[int, bool] = dict.fromkeys(shape.gpus, False)
        self.version = 0
        self.refresh(shape.gpus)

    # --- changes -----------------------------------------------------------------------------------

    def take(self, indexes: Iterable[int], uid: str) -> None:
        touched = set()
        for i in indexes:
            device = self.shape.devices[i]
            self.allocated[i] = uid
            for set_name, counters in device.consumes:
                remaining = self.remaining[set_name]
                for counter, amount in counters:
                    remaining[counter] = remaining.get(counter, 0) - amount
            touched.add(device.gpu_index)
        self.refresh(touched)

    def give_back(self, indexes: Iterable[int]) -> None:
        touched = set()
        for i in indexes:
            if self.allocated.pop(i, None) is None:
                continue
            device = self.shape.devices[i]
            for set_name, counters in device.consumes:
                remaining = self.remaining[set_name]
                for counter, amount in counters:
                    remaining[counter] = remaining.get(counter, 0) + amount
            touched.add(device.gpu_index)
        self.refresh(touched)

    def mark_destroying(self, gpu_index: int, profile_id: int, start: int) -> None:
        self.destroying.add((gpu_index, profile_id, start))
        self.refresh([gpu_index])

    # --- queries -----------------------------------------------------------------------------------

    def instance_for(self, device: DeviceShape) -> ExistingInstance | None:
        """The live MIG instance at exactly this placement, if there is one not being destroyed."""
        for inst in self.existing.get(device.gpu_index, ()):
            if (
                inst.profile_id == device.profile_id
                and inst.mask == device.mask
                and (device.gpu_index, inst.profile_id, inst.start) not in self.destroying
            ):
                return inst
        return None

    def fits(self, device: DeviceShape) -> bool:
        for set_name, counters in device.consumes:
            remaining = self.remaining[set_name]
            for counter, amount in counters:
                if remaining.get(counter, 0) < amount:
                    return False
        return True

    def bucket_key(self) -> tuple[int, int]:
        """(free whole GPUs, longest free slice run on a GPU that is not free whole): the fleet index key."""
        free_whole = 0
        longest = 0
        for gpu in self.shape.gpus.values():
            if self.whole_free[gpu.index]:
                free_whole += 1
            elif gpu.mig:
                longest = max(longest, _longest_run(~self.occupied[gpu.index], gpu.slices))
        return free_whole, longest

    # --- availability ------------------------------------------------------------------------------

    def refresh(self, gpu_indexes: Iterable[int]) -> None:
        self.version += 1
        shape = self.shape
        for g in gpu_indexes:
            gpu = shape.gpus[g]
            live = [
                inst
                for inst in self.existing.get(g, ())
                if (g, inst.profile_id, inst.start) not in self.destroying
            ]
            occupied = 0
            if gpu.counter_set is not None and gpu.slices:
                remaining = self.remaining[gpu.counter_set]
                for s in range(gpu.slices):
                    if remaining.get(memory_slice_counter(s), 0) < 1:
                        occupied |= 1 << s
            claimed_masks = {shape.devices[i].mask for i in gpu.mig if i in self.allocated}
            foreign = 0
            for inst in live:
                if inst.mask not in claimed_masks:
                    foreign |= inst.mask
            self.occupied[g] = occupied | foreign
            for i in gpu.mig:
                device = shape.devices[i]
                if i in self.allocated or not self.fits(device):
                    self.available[i] = False
                    continue
                exact = next(
                    (x for x in live if x.profile_id == device.profile_id and x.mask == device.mask), None
                )
                if exact is not None:
                    self.available[i] = not exact.in_use
                else:
                    self.available[i] = device.mask & foreign == 0
            if gpu.whole is not None:
                free = gpu.whole not in self.allocated and self.fits(shape.devices[gpu.whole]) and not live
                self.available[gpu.whole] = free
                self.whole_free[g] = free
            else:
                self.whole_free[g] = False


def _longest_run(free_bits: int, width: int) -> int:
    best = run = 0
    for s in range(width):
        if free_bits >> s & 1:
            run += 1
            best = max(best, run)
        else:
            run = 0
    return best
