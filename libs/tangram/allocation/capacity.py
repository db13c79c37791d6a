"""How many claims of a kind still fit on a node in a given state: the supply that placements spend.

A node's state, for this purpose, is its shape, which GPUs are free whole (bits by GPU index) and
each GPU's occupied memory slices. Nodes of one shape in one state offer the same, so every count
is cached per state, never per node: a fleet of thousands of nodes has few distinct states.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from tangram.allocation.demand import ClaimKind
from tangram.allocation.eligibility import Eligible
from tangram.allocation.shape import NodeShape

FitState = tuple[str, int, tuple[int, ...]]  # (shape signature, free whole GPU bits, occupied per GPU)


@dataclass(frozen=True, slots=True)
class Want:
    """A claim kind on one node shape: the devices it may take there and how many at once."""

    kind: str  # "gpu" | "mig"
    count: int
    whole: int  # "gpu": bits of the GPUs whose whole device is eligible
    compatible: tuple[int, ...]  # "gpu" with NVLink or bandwidth rules: per GPU index, bits of allowed peers
    paired: bool  # compatible applies
    masks: tuple[tuple[int, ...], ...]  # "mig": per GPU position, eligible placement masks
    devices: frozenset[int]  # eligible device indexes on the shape


def want_on(shape: NodeShape, kind: ClaimKind, eligible: Eligible | None) -> Want | None:
    """The kind on this shape, or None when nothing of the shape can serve it."""
    if kind.alt is None:
        chosen = _prior_devices(shape, kind)
    else:
        if eligible is None or eligible.reason:
            return None
        chosen = eligible.devices
    if not chosen:
        return None
    kinds = {shape.devices[d].kind for d in chosen}
    if kinds == {"gpu"}:
        whole = 0
        for d in chosen:
            whole |= 1 << shape.devices[d].gpu_index
        top = max(shape.gpus, default=0) + 1
        paired = kind.nvlink or kind.min_bandwidth_gbps > 0
        compatible = []
        for g in range(top):
            peers = 0
            for h in range(top):
                if (
                    h != g
                    and (not kind.nvlink or shape.pairs.nvlinks(g, h) > 0)
                    and (shape.pairs.bandwidth_gbps(g, h) >= kind.min_bandwidth_gbps)
                ):
                    peers |= 1 << h
            compatible.append(peers)
        return Want("gpu", kind.count, whole, tuple(compatible), paired, (), frozenset(chosen))
    if kinds == {"mig"}:
        per_gpu: dict[int, list[int]] = {}
        for d in chosen:
            device = shape.devices[d]
            per_gpu.setdefault(device.gpu_index, []).append(device.mask)
        masks = tuple(tuple(sorted(set(per_gpu.get(g, ())))) for g in sorted(shape.gpus))
        return Want("mig", kind.count, 0, (), False, masks, frozenset(chosen))
    return None


def _prior_devices(shape: NodeShape, kind: ClaimKind) -> tuple[int, ...]:
    if kind.mig_profile >= 0:
        return tuple(d.index for d in shape.devices if d.kind == "mig" and d.profile_id == kind.mig_profile)
    return tuple(d.index for d in shape.devices if d.kind == "gpu")


def fit(want: Want, free_whole: int, occupied: tuple[int, ...]) -> int:
    """Disjoint claims of the kind that fit now (each kind counted alone)."""
    if want.kind == "gpu":
        bits = free_whole & want.whole
        if not want.paired:
            return bin(bits).count("1") // want.count
        return _sets(bits, want.count, want.compatible)
    total = 0
    for masks, used in zip(want.masks, occupied, strict=False):
        if masks:
            total += placements_fit(masks, used)
    return total // want.count


@lru_cache(maxsize=200_000)
def placements_fit(masks: tuple[int, ...], used: int) -> int:
    """The most disjoint placements among masks that avoid the used slices."""
    for position, mask in enumerate(masks):
        if mask & used == 0:
            rest = masks[position + 1 :]
            return max(1 + placements_fit(rest, used | mask), placements_fit(rest, used))
    return 0


@lru_cache(maxsize=200_000)
def _sets(bits: int, k: int, compatible: tuple[int, ...]) -> int:
    """The most disjoint k-sets of the GPUs in bits whose members are pairwise compatible."""
    if bin(bits).count("1") < k:
        return 0
    if k == 1:
        return bin(bits).count("1")
    low = (bits & -bits).bit_length() - 1
    rest = bits & ~(1 << low)
    best = _sets(rest, k, compatible)
    for members in _cliques(rest & compatible[low], k - 1, compatible):
        best = max(best, 1 + _sets(rest & ~members, k, compatible))
    return best


def _cliques(bits: int, k: int, compatible: tuple[int, ...]) -> list[int]:
    """Every k-set of the GPUs in bits that is pairwise compatible, as bits."""
    if k == 0:
        return [0]
    out: list[int] = []
    remaining = bits
    while remaining:
        low = (remaining & -remaining).bit_length() - 1
        remaining &= ~(1 << low)
        for tail in _cliques(remaining & compatible[low], k - 1, compatible):
            out.append(tail | 1 << low)
    return out
