"""A claim's options on a node: every placement of a kind of claim on a node's state, what each
leaves, and the few of a group's placements that demand-aware placement (placement.DemandIndex)
can tell apart. Pure functions of a node's hardware and state."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from tangram.allocation.capacity import FitState, Want, cliques_in_order
from tangram.allocation.demand import ClaimKind
from tangram.allocation.node import NodeState

_COMBINATIONS_LIMIT = 512  # GPU sets scored per node state; larger nodes take the first ones


@dataclass(frozen=True, slots=True)
class Option:
    """One way to place the claim on a node of a group: the devices and what it leaves."""

    devices: tuple[int, ...]
    after: FitState
    quality: float  # GPU set score / the best set of that many GPUs on the hardware (1.0 for one GPU)
    set_score: int
    mode_changes: int
    creates: int
    leaves: tuple[int, int]  # (free whole GPUs, free memory slices) after: fuller first


# An option before it is made: (devices, free whole GPU bits after, GPUs changed as (position,
# occupied slices before, after), quality, set score, mode changes, creates, leaves).
Placement = tuple[
    tuple[int, ...], int, tuple[tuple[int, int, int], ...], float, int, int, int, tuple[int, int]
]
Tail = tuple[int, int, tuple[int, int], tuple[int, ...]]  # (mode changes, creates, leaves, devices)


@dataclass(frozen=True, slots=True)
class Reduced:
    """A group's options for a kind, as far as choose() can tell them apart: those of the best
    NVLink quality only (quality comes first on the node), one per loss taken (the least tail of
    those that take the same), and none that another takes no more of every kind from with a
    lesser tail (weights are never negative, so that one's loss is never lower)."""

    quality: float
    entries: tuple[tuple[tuple[tuple[int, int], ...], Tail, Option], ...]  # (delta, tail, option)
    monotone: bool = True  # no entry gives any kind room back (no negative loss)


def fit_state(key: tuple[Any, ...]) -> FitState:
    return key[0], key[1], key[2]


def reduce(
    key: tuple[Any, ...], placements: Sequence[tuple[Placement, tuple[tuple[int, int], ...]]]
) -> Reduced:
    """What choose() keeps of a group's placements (see Reduced); it picks the same option from
    them. Options are made for those kept only. Equal losses are one object (DemandIndex._interned)."""
    if not placements:
        return Reduced(0.0, ())
    quality = max(placement[3] for placement, _ in placements)
    least: dict[int, tuple[tuple[tuple[int, int], ...], Tail, Placement]] = {}
    for placement, delta in placements:
        if placement[3] != quality:
            continue
        tail = (placement[5], placement[6], placement[7], placement[0])
        kept = least.get(id(delta))
        if kept is None or tail < kept[1]:
            least[id(delta)] = (delta, tail, placement)
    found = list(least.values())
    if len(found) > 1:
        spent = [dict(delta) for delta, _, _ in found]
        found = [found[n] for n in range(len(found)) if not _dominated(n, found[n][1], spent, found)]
    entries = tuple((delta, tail, _option(key, placement)) for delta, tail, placement in found)
    monotone = all(lost >= 0 for delta, _, _ in entries for _, lost in delta)
    return Reduced(quality, entries, monotone)


def _dominated(
    n: int,
    tail: Tail,
    spent: list[dict[int, int]],
    entries: list[tuple[tuple[tuple[int, int], ...], Tail, Placement]],
) -> bool:
    """Another entry has a lesser tail and takes no more from any kind than entry n."""
    mine = spent[n]
    for m, (_, other_tail, _) in enumerate(entries):
        if m == n or not other_tail < tail:
            continue
        other = spent[m]
        if all(other.get(i, 0) <= lost for i, lost in mine.items()) and all(
            i in mine or lost <= 0 for i, lost in other.items()
        ):
            return True
    return False


def options_on(node: NodeState, key: tuple[Any, ...], kind: ClaimKind, want: Want) -> tuple[Option, ...]:
    """Every placement of the kind on the node (whose group key is `key`)."""
    return tuple(_options(node, key, want))


def _options(node: NodeState, key: tuple[Any, ...], want: Want) -> Iterator[Option]:
    for placement in placements(node, key, want):
        yield _option(key, placement)


def _option(key: tuple[Any, ...], placement: Placement) -> Option:
    devices, bits, changes, quality, set_score, mode_changes, creates, leaves = placement
    return Option(
        devices=devices,
        after=(key[0], bits, after_changes(key[2], changes)),
        quality=quality,
        set_score=set_score,
        mode_changes=mode_changes,
        creates=creates,
        leaves=leaves,
    )


def after_changes(occupied: tuple[int, ...], changes: tuple[tuple[int, int, int], ...]) -> tuple[int, ...]:
    after = list(occupied)
    for p, _, b in changes:
        after[p] = b
    return tuple(after)


def placements(node: NodeState, key: tuple[Any, ...], want: Want) -> Iterator[Placement]:
    """Every placement of the kind on the node, as the fields of its Option, with the GPUs it
    changes as (position, occupied slices before, after) in place of the state after."""
    shape = node.shape
    available = node.available
    _, free_whole, occupied = fit_state(key)
    order = shape.gpu_order
    positions = shape.gpu_positions
    # What each option leaves (Option.leaves), counted from what the node has free now: an option
    # changes only the GPUs it takes.
    widths = shape.gpu_widths
    free_slices: list[int] = []
    all_free_slices = 0
    free_gpus = bin(free_whole).count("1")
    if want.kind == "gpu":
        free = [
            g
            for g in order
            if want.whole >> g & 1 and shape.gpus[g].whole is not None and available[shape.gpus[g].whole or 0]
        ]
        if want.paired:
            # The pairwise compatible sets in the order of combinations(free, count), found without
            # trying every combination (C(128, 8) is 1.4e12).
            free_bits = 0
            for g in free:
                free_bits |= 1 << g
            groups: Iterator[tuple[int, ...]] = (
                _members(bits) for bits in cliques_in_order(free_bits, want.count, want.compatible)
            )
        else:
            groups = combinations(free, want.count)
        ideal = shape.best_set_score(want.count)
        for n, gpus in enumerate(groups):
            if n >= _COMBINATIONS_LIMIT:
                break
            if not free_slices:
                free_slices = [_free_slices(occupied[p], width) for p, width in enumerate(widths)]
                all_free_slices = sum(free_slices)
            bits = free_whole
            left = all_free_slices
            taken: dict[int, int] = {}
            for g in gpus:
                bits &= ~(1 << g)
                position = positions[g]
                taken[position] = (1 << widths[position]) - 1 if widths[position] else 0
                left -= free_slices[position]
            changes = tuple((p, occupied[p], b) for p, b in sorted(taken.items()) if occupied[p] != b)
            score = shape.pairs.set_score(gpus) if len(gpus) > 1 else 0
            yield (
                tuple(shape.gpus[g].whole or 0 for g in gpus),
                bits,
                changes,
                score / ideal if ideal else 1.0,
                score,
                sum(node.mig_mode >> g & 1 for g in gpus),
                0,
                (bin(bits).count("1"), left),
            )
        return
    for d in [d for d in want.ordered or sorted(want.devices) if available[d]]:
        device = shape.devices[d]
        g = device.gpu_index
        position = positions[g]
        if not free_slices:
            free_slices = [_free_slices(occupied[p], width) for p, width in enumerate(widths)]
            all_free_slices = sum(free_slices)
        used = occupied[position]
        now = used | device.mask
        bits = free_whole & ~(1 << g)
        left = all_free_slices - free_slices[position] + _free_slices(now, widths[position])
        create = node.instance_for(device) is None
        yield (
            (d,),
            bits,
            ((position, used, now),) if now != used else (),
            1.0,
            0,
            int(create and not (node.mig_mode >> g & 1) and bool(free_whole >> g & 1)),
            int(create),
            (free_gpus - (free_whole >> g & 1), left),
        )


def _free_slices(used: int, width: int) -> int:
    return width - bin(used & ((1 << width) - 1)).count("1") if width else 0


def _members(bits: int) -> tuple[int, ...]:
    """The GPU indexes set in bits, lowest first."""
    out = []
    while bits:
        low = bits & -bits
        out.append(low.bit_length() - 1)
        bits ^= low
    return tuple(out)
