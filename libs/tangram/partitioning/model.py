"""What the partitioner knows about MIG instances: plain data shared by the executor and the decisions."""

from __future__ import annotations

from dataclasses import dataclass

from tangram.events import MigPlacement


@dataclass(frozen=True, slots=True)
class InstanceKey:
    """Where a GPU instance sits: its GPU and memory slices (unique while it exists)."""

    gpu_uuid: str
    start: int
    size: int

    @classmethod
    def of(cls, gpu_uuid: str, placement: MigPlacement) -> InstanceKey:
        return cls(gpu_uuid, placement.start, placement.size)


@dataclass(frozen=True, slots=True)
class CreatedInstance:
    """A MIG device the executor made (or found already made) at a placement."""

    gpu_index: int
    gpu_uuid: str
    profile_id: int
    profile: str
    placement: MigPlacement
    mig_uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    gi_cap_minor: int
    ci_cap_minor: int


@dataclass(frozen=True, slots=True)
class ObservedInstance:
    """A GPU instance as NVML shows it now, with its compute instances (none after a crash mid-create)."""

    gpu_index: int
    gpu_uuid: str
    profile_id: int
    profile: str
    placement: MigPlacement
    gpu_instance_id: int
    compute_instance_ids: tuple[int, ...]
    mig_uuid: str  # of the first compute instance; "" when there is none
    in_use: bool

    @property
    def key(self) -> InstanceKey:
        return InstanceKey.of(self.gpu_uuid, self.placement)

    @property
    def empty(self) -> bool:
        return not self.compute_instance_ids

    def overlaps(self, placement: MigPlacement) -> bool:
        """Shares a memory slice with `placement`."""
        mine = self.placement
        return mine.start < placement.start + placement.size and placement.start < mine.start + mine.size


@dataclass(frozen=True, slots=True)
class DestroyedInstance:
    gpu_index: int
    gpu_uuid: str
    profile: str
    placement: MigPlacement
    mig_uuid: str
    gpu_instance_id: int
    mig_disabled: bool = False
