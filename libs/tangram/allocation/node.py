"""One node's changing state: what is allocated, what counters remain, which devices are free."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tangram.allocation.shape import DeviceShape, NodeShape
from tangram.dra.model import Device, NodeDevices
from tangram.dra.sharing import counted_compute
from tangram.events.catalogue import AllocatedDevice
from tangram.events.inventory import NodeHardware


class ExistingInstance:
    __slots__ = ("in_use", "mask", "profile", "profile_id", "size", "start", "uuid")

    def __init__(
        self, profile_id: int, start: int, size: int, uuid: str, in_use: bool, *, profile: str = ""
    ) -> None:
        self.profile_id = profile_id
        self.profile = profile
        self.start = start
        self.size = size
        self.mask = sum(1 << s for s in range(start, start + size))
        self.uuid = uuid
        self.in_use = in_use


# The holder recorded in NodeState.allocated for a share host's device: its claims are in `hosts`.
SHARES = "(shares)"


class ShareHost:
    """The shares a share host carries: one strategy for all, each claim's memory and compute."""

    __slots__ = ("shares", "strategy")

    def __init__(self, strategy: str) -> None:
        self.strategy = strategy
        self.shares: dict[str, tuple[int, int]] = {}  # claim uid -> (memory bytes, compute percent)

    @property
    def memory_used(self) -> int:
        return sum(memory for memory, _ in self.shares.values())

    @property
    def compute_used(self) -> int:
        return sum(compute for _, compute in self.shares.values())


class NodeState:
    """Availability is kept per device and settled per GPU on the first read after a change.

    Changes only mark their GPUs stale, so a rebuild that folds thousands of takes and releases
    into a node computes its availability once, when a decision first reads it.
    """

    def __init__(self, hw: NodeHardware, devices: NodeDevices, shape: NodeShape, generation: int) -> None:
        self.name = hw.node
        self.hw = hw
        self.devices: tuple[Device, ...] = tuple(devices.devices)
        self.driver = devices.driver
        self.pool = devices.pool
        self.shape = shape
        self.generation = generation
        self.gpu_uuid = {g.index: g.uuid for g in hw.gpus}
        self._memory_slices: dict[int, int] = {}
        for g in hw.gpus:
            self._memory_slices.setdefault(g.index, g.memory_slices)
        self._mig_enabled = {g.index for g in hw.gpus if g.mig_enabled}
        self.allocated: dict[int, str] = {}  # device -> claim uid (admin access never lands here)
        self.hosts: dict[int, ShareHost] = {}  # share host device -> its shares (allocated to SHARES)
        self.remaining: dict[str, dict[str, int]] = {k: dict(v) for k, v in shape.counter_sets.items()}
        self.destroying: set[tuple[int, int, int]] = set()  # (gpu, profile id, start) being destroyed
        self.existing: dict[int, list[ExistingInstance]] = {
            g.index: [
                ExistingInstance(
                    m.profile_id, m.placement.start, m.placement.size, m.uuid, m.in_use, profile=m.profile
                )
                for m in g.mig_instances
            ]
            for g in hw.gpus
        }
        self._available: list[bool] = [False] * len(shape.devices)
        self._occupied: dict[int, int] = dict.fromkeys(shape.gpus, 0)
        self._whole_free: dict[int, bool] = dict.fromkeys(shape.gpus, False)
        self._reusable: dict[int, int] = dict.fromkeys(shape.gpus, 0)
        self._stale: set[int] = set(shape.gpus)
        self.version = 0
        self._group: tuple[int, tuple[Any, ...]] | None = None  # (version, group key)
        self.mig_mode = sum(1 << g.index for g in hw.gpus if g.mig_enabled)

    # --- changes -----------------------------------------------------------------------------------

    def take(self, indexes: Iterable[int], uid: str) -> None:
        devices = self.shape.devices
        for i in indexes:
            device = devices[i]
            self.allocated[i] = uid
            for set_name, counters in device.consumes:
                remaining = self.remaining[set_name]
                for counter, amount in counters:
                    remaining[counter] = remaining.get(counter, 0) - amount
            self._stale.add(device.gpu_index)
        self.version += 1

    def give_back(self, indexes: Iterable[int]) -> None:
        devices = self.shape.devices
        for i in indexes:
            if self.allocated.pop(i, None) is None:
                continue
            device = devices[i]
            for set_name, counters in device.consumes:
                remaining = self.remaining[set_name]
                for counter, amount in counters:
                    remaining[counter] = remaining.get(counter, 0) + amount
            self._stale.add(device.gpu_index)
        self.version += 1

    def take_share(self, index: int, uid: str, *, strategy: str, memory: int, compute: int) -> None:
        """The claim holds a share of the host; the first share opens it (its counters are taken)."""
        host = self.hosts.get(index)
        if host is None:
            self.take([index], SHARES)
            host = self.hosts[index] = ShareHost(strategy)
        host.shares[uid] = (memory, compute)
        self.version += 1

    def give_back_share(self, index: int, uid: str) -> bool:
        """The claim's share is freed; True when it was the host's last (the host is closed)."""
        host = self.hosts.get(index)
        if host is None or host.shares.pop(uid, None) is None:
            return False
        self.version += 1
        if host.shares:
            return False
        del self.hosts[index]
        self.give_back([index])
        return True

    def take_held(self, uid: str, devices: Iterable[AllocatedDevice], names: Iterable[str]) -> None:
        """Take what a decision holds on this node: its devices, or its shares of share hosts.
        Names the node does not advertise (now) are skipped."""
        index = self.shape.index_by_name
        shares = {d.device: d.share for d in devices if d.share is not None}
        plain: list[int] = []
        for name in names:
            i = index.get(name)
            if i is None:
                continue
            share = shares.get(name)
            if share is not None and self.shape.devices[i].shared:
                self.take_share(
                    i, uid, strategy=share.strategy, memory=share.memory_bytes, compute=counted_compute(share)
                )
            else:
                plain.append(i)
        if plain:
            self.take(plain, uid)

    def give_back_held(self, uid: str, names: Iterable[str]) -> set[str]:
        """Free what the claim holds on this node; returns the names of devices now free that it
        held: its own devices, and share hosts its share was the last of."""
        index = self.shape.index_by_name
        freed: set[str] = set()
        plain: list[int] = []
        for name in names:
            i = index.get(name)
            if i is None:
                continue
            if i in self.hosts:
                if self.give_back_share(i, uid):
                    freed.add(name)
            else:
                if i in self.allocated:
                    freed.add(name)
                plain.append(i)
        self.give_back(plain)
        return freed

    def openable(self, device: DeviceShape) -> bool:
        """A share host not yet carrying shares can be opened now: its exclusive twin is free."""
        return device.shared and device.index not in self.allocated and self.available[device.twin]

    def mark_destroying(self, gpu_index: int, profile_id: int, start: int) -> None:
        self.destroying.add((gpu_index, profile_id, start))
        self._stale.add(gpu_index)
        self.version += 1

    def keep(self, gpu_uuid: str, start: int) -> None:
        """A destroy was refused: the instance at `start` stays and occupies its slices again."""
        gone = {
            entry
            for entry in self.destroying
            if self.gpu_uuid.get(entry[0]) == gpu_uuid and entry[2] == start
        }
        if gone:
            self.destroying -= gone
            self._stale.update(entry[0] for entry in gone)
            self.version += 1

    def destroyed(self, gpu_uuid: str, start: int, mig_uuid: str, *, slot_freed: bool = True) -> None:
        """A destroy at `start` was applied: nothing there is on its way out any more (unless
        `slot_freed` is False), and the instance it destroyed is gone even from an inventory read
        before the destroy."""
        gone = (
            {e for e in self.destroying if self.gpu_uuid.get(e[0]) == gpu_uuid and e[2] == start}
            if slot_freed
            else set()
        )
        self.destroying -= gone
        for g, live in self.existing.items():
            if self.gpu_uuid.get(g) != gpu_uuid:
                continue
            kept = [inst for inst in live if not (mig_uuid and inst.uuid == mig_uuid)]
            if len(kept) != len(live) or any(e[0] == g for e in gone):
                self.existing[g] = kept
                self._stale.add(g)
        self.version += 1

    def set_destroying(self, destroying: set[tuple[int, int, int]]) -> None:
        self.destroying = set(destroying)
        self._stale.update(self.shape.gpus)
        self.version += 1

    # --- queries -----------------------------------------------------------------------------------

    @property
    def available(self) -> list[bool]:
        """Per device: free to hand out now (read-only to callers)."""
        if self._stale:
            self._settle()
        return self._available

    @property
    def occupied(self) -> dict[int, int]:
        """Per GPU: memory slices taken by claims or by instances no claim owns, as bits."""
        if self._stale:
            self._settle()
        return self._occupied

    @property
    def whole_free(self) -> dict[int, bool]:
        """Per GPU: it can be handed out whole now."""
        if self._stale:
            self._settle()
        return self._whole_free

    def mig_enabled(self, gpu_index: int) -> bool:
        return gpu_index in self._mig_enabled

    def memory_slices(self, gpu_index: int) -> int:
        return self._memory_slices.get(gpu_index, 0)

    def instance_for(self, device: DeviceShape) -> ExistingInstance | None:
        """The live MIG device at exactly this placement, if there is one not being destroyed."""
        for inst in self.existing.get(device.gpu_index, ()):
            if (
                inst.profile_id == device.profile_id
                and inst.mask == device.mask
                and inst.uuid
                and (device.gpu_index, inst.profile_id, inst.start) not in self.destroying
            ):
                return inst
        return None

    def fits(self, device: DeviceShape) -> bool:
        """The node's remaining counters cover what the device consumes."""
        if device.slice_bits and device.slice_bits & self._used_slices(device.slice_set) != 0:
            return False
        remaining = self.remaining
        return all(remaining[s].get(c, 0) >= amount for s, c, amount in device.needs)

    def bucket_key(self) -> tuple[int, int]:
        """(free whole GPUs, longest free slice run on a GPU that is not free whole): the fleet index key.

        Slices under a free MIG instance count as free: a claim of that exact profile reuses the
        instance, so the index must not filter the node out.
        """
        whole_free = self.whole_free
        occupied = self._occupied
        reusable = self._reusable
        free_whole = 0
        longest = 0
        for gpu in self.shape.gpus.values():
            if whole_free[gpu.index]:
                free_whole += 1
            elif gpu.mig:
                free = ~(occupied[gpu.index] & ~reusable[gpu.index])
                longest = max(longest, _longest_run(free, gpu.slices))
        return free_whole, longest

    def group_key(self) -> tuple[Any, ...]:
        """Everything placement reads from the node, names and identities left out: nodes with
        one group key are interchangeable, so a decision looks at one of them for all.

        (shape signature, free whole GPU bits, occupied slices per GPU, MIG mode bits, live
        instances as (GPU, profile id, start, in use, claimed)).
        """
        cached = self._group
        if cached is not None and cached[0] == self.version and not self._stale:
            return cached[1]
        whole_free = self.whole_free
        occupied = self._occupied
        bits = 0
        for g, free in whole_free.items():
            if free:
                bits |= 1 << g
        instances: list[tuple[int, int, int, bool, bool]] = []
        claimed = {(self.shape.devices[i].gpu_index, self.shape.devices[i].mask) for i in self.allocated}
        for g, live in self.existing.items():
            for inst in live:
                if (g, inst.profile_id, inst.start) in self.destroying:
                    continue
                instances.append((g, inst.profile_id, inst.start, inst.in_use, (g, inst.mask) in claimed))
        key = (
            self.shape.signature,
            bits,
            tuple(occupied[g] for g in sorted(occupied)),
            self.mig_mode,
            tuple(sorted(instances)),
        )
        self._group = (self.version, key)
        return key

    # --- availability ------------------------------------------------------------------------------

    def _used_slices(self, set_name: str | None) -> int:
        if set_name is None:
            return 0
        remaining = self.remaining[set_name]
        used = 0
        for bit, counter in self.shape.slice_counters[set_name]:
            if remaining.get(counter, 0) < 1:
                used |= 1 << bit
        return used

    def _settle(self) -> None:
        stale = sorted(self._stale)
        self._stale.clear()
        for g in stale:
            self._refresh_gpu(g)

    def _refresh_gpu(self, g: int) -> None:
        shape = self.shape
        devices = shape.devices
        allocated = self.allocated
        remaining = self.remaining
        available = self._available
        gpu = shape.gpus[g]
        destroying = self.destroying
        live = [
            inst for inst in self.existing.get(g, ()) if (g, inst.profile_id, inst.start) not in destroying
        ]
        used = self._used_slices(gpu.counter_set)
        occupied = (used & ((1 << gpu.slices) - 1)) | gpu.uncounted_slices if gpu.counter_set else 0
        foreign = 0
        if live:
            claimed_masks = {devices[i].mask for i in (*gpu.mig, *gpu.shared) if i in allocated}
            for inst in live:
                if inst.mask not in claimed_masks:
                    foreign |= inst.mask
        self._occupied[g] = occupied | foreign
        self._reusable[g] = 0
        for i in gpu.mig:
            device = devices[i]
            if (
                i in allocated
                or device.slice_bits
                & (used if device.slice_set == gpu.counter_set else self._used_slices(device.slice_set))
                or not all(remaining[s].get(c, 0) >= amount for s, c, amount in device.needs)
            ):
                available[i] = False
                continue
            exact = None
            for x in live:
                # Without a UUID it is no MIG device yet (or any more): a GPU instance read between
                # its create and its compute instance's, or left by a crash. It holds its slices
                # but cannot be handed out.
                if x.profile_id == device.profile_id and x.mask == device.mask and x.uuid:
                    exact = x
                    break
            if exact is not None:
                available[i] = not exact.in_use
                if available[i]:
                    self._reusable[g] |= device.mask
            else:
                available[i] = device.mask & foreign == 0
        if gpu.whole is not None:
            device = devices[gpu.whole]
            free = (
                gpu.whole not in allocated
                and not live
                and not device.slice_bits
                & (used if device.slice_set == gpu.counter_set else self._used_slices(device.slice_set))
                and all(remaining[s].get(c, 0) >= amount for s, c, amount in device.needs)
            )
            available[gpu.whole] = free
            self._whole_free[g] = free
        else:
            self._whole_free[g] = False


def _longest_run(free_bits: int, width: int) -> int:
    best = run = 0
    for s in range(width):
        if free_bits >> s & 1:
            run += 1
            best = max(best, run)
        else:
            run = 0
    return best
