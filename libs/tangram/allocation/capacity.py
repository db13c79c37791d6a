"""How many claims of a kind still fit on a node in a given state: the supply that placements spend.

A node's state, for this purpose, is its shape, which GPUs are free whole (bits by GPU index) and
each GPU's occupied memory slices. Nodes of one shape in one state offer the same, so every count
is cached per state, never per node: a fleet of thousands of nodes has few distinct states.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from tangram.allocation.demand import ClaimKind
from tangram.allocation.eligibility import Eligible
from tangram.allocation.shape import NodeShape

FitState = tuple[str, int, tuple[int, ...]]  # (shape signature, free whole GPU bits, occupied per GPU)

_EXACT_COMPONENT = 12  # GPUs of a compatibility component that is no clique, counted exactly
_CLIQUE_STEPS = 10_000  # search steps for one k-set in a larger such component


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
    ordered: tuple[int, ...] = ()  # the same, in index order


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
        return Want(
            "gpu", kind.count, whole, tuple(compatible), paired, (), frozenset(chosen), tuple(sorted(chosen))
        )
    if kinds == {"mig"}:
        per_gpu: dict[int, list[int]] = {}
        for d in chosen:
            device = shape.devices[d]
            per_gpu.setdefault(device.gpu_index, []).append(device.mask)
        masks = tuple(tuple(sorted(set(per_gpu.get(g, ())))) for g in sorted(shape.gpus))
        return Want("mig", kind.count, 0, (), False, masks, frozenset(chosen), tuple(sorted(chosen)))
    return None


def _prior_devices(shape: NodeShape, kind: ClaimKind) -> tuple[int, ...]:
    exclusive = [d for d in shape.devices if not d.shared]
    if kind.mig_profile >= 0:
        return tuple(d.index for d in exclusive if d.kind == "mig" and d.profile_id == kind.mig_profile)
    return tuple(d.index for d in exclusive if d.kind == "gpu")


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
    """The most disjoint k-sets of the GPUs in bits whose members are pairwise compatible.

    A k-set lies inside one connected component of the compatibility graph, so components are
    counted apart: one that is a clique (an NVSwitch fabric, a bridged pair) holds size // k sets;
    any other is searched exactly up to _EXACT_COMPONENT GPUs, and greedily beyond.
    """
    if bin(bits).count("1") < k:
        return 0
    if k == 1:
        return bin(bits).count("1")
    total = 0
    for component in _components(bits, compatible):
        size = bin(component).count("1")
        if size < k:
            continue
        if _is_clique(component, compatible):
            total += size // k
        elif size <= _EXACT_COMPONENT:
            total += _exact_sets(component, k, compatible)
        else:
            total += _greedy_sets(component, k, compatible)
    return total


def _components(bits: int, compatible: tuple[int, ...]) -> list[int]:
    out: list[int] = []
    rest = bits
    while rest:
        component = frontier = rest & -rest
        while frontier:
            low = frontier & -frontier
            frontier ^= low
            new = compatible[low.bit_length() - 1] & rest & ~component
            component |= new
            frontier |= new
        out.append(component)
        rest &= ~component
    return out


def _is_clique(component: int, compatible: tuple[int, ...]) -> bool:
    rest = component
    while rest:
        low = rest & -rest
        rest ^= low
        if (compatible[low.bit_length() - 1] | low) & component != component:
            return False
    return True


@lru_cache(maxsize=200_000)
def _exact_sets(bits: int, k: int, compatible: tuple[int, ...]) -> int:
    if bin(bits).count("1") < k:
        return 0
    low = (bits & -bits).bit_length() - 1
    rest = bits & ~(1 << low)
    best = _exact_sets(rest, k, compatible)
    for members in cliques_in_order(rest & compatible[low], k - 1, compatible):
        best = max(best, 1 + _exact_sets(rest & ~members, k, compatible))
    return best


def _greedy_sets(bits: int, k: int, compatible: tuple[int, ...]) -> int:
    """Disjoint k-sets taken lowest GPU first: a count never above the most there are."""
    count = 0
    rest = bits
    while bin(rest).count("1") >= k:
        low = (rest & -rest).bit_length() - 1
        rest &= ~(1 << low)
        found = first_clique(rest & compatible[low], k - 1, compatible)
        if found is not None:
            rest &= ~found
            count += 1
    return count


def first_clique(bits: int, k: int, compatible: tuple[int, ...], limit: int = _CLIQUE_STEPS) -> int | None:
    """The first pairwise compatible k-set of the GPUs in bits, in order of GPU index, as bits;
    None when there is none or none is found within `limit` steps."""
    for found in cliques_in_order(bits, k, compatible, limit):
        return found
    return None


def cliques_in_order(
    bits: int, k: int, compatible: tuple[int, ...], limit: int | None = None
) -> Iterator[int]:
    """The pairwise compatible k-sets of the GPUs in bits as bits, in the order of
    itertools.combinations over the GPUs sorted by index, in at most `limit` steps when given."""
    steps = 0

    def extend(candidates: int, need: int, chosen: int) -> Iterator[int]:
        nonlocal steps
        if need == 0:
            yield chosen
            return
        while bin(candidates).count("1") >= need:
            steps += 1
            if limit is not None and steps > limit:
                return
            low = candidates & -candidates
            candidates ^= low
            yield from extend(candidates & compatible[low.bit_length() - 1], need - 1, chosen | low)

    yield from extend(bits, k, 0)
