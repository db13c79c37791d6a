"""Demand-aware placement (after FGD, USENIX ATC'23): put a claim where it costs expected demand least.

For every kind of claim in the demand mix, the fleet's supply is how many such claims still fit
(each kind counted alone, summed over nodes). A placement's loss is what it takes from that:

    loss = sum over kinds k of  demand(k) / supply(k) * (fits_k(node before) - fits_k(node after))

so a kind that is wanted much and offered little (8 NVLink-connected GPUs on a fleet with a few
NVSwitch nodes) weighs most, and a placement that spends nothing anybody wants costs nothing.
Candidates are compared by (free instances destroyed, loss, NVLink quality normalised per
hardware, MIG mode changes, MIG instances created, how full the node is left, its state), all of
which are facts of the node's hardware and state: node names and GPU order never decide, except
between nodes in exactly the same state, where either choice leaves the same fleet up to names.

Nodes are grouped by that state (NodeState.group_key): a decision scores one node per group, and
each group's options and fit counts are cached per state, so a fleet of thousands of nodes with
few distinct states costs a few dozen scores per decision.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import combinations
from math import inf
from typing import Any

from tangram.allocation.capacity import FitState, Want, cliques_in_order, fit, placements_fit, want_on
from tangram.allocation.demand import ClaimKind, Demand
from tangram.allocation.eligibility import Eligible
from tangram.allocation.model import CandidateScore, LossTerm
from tangram.allocation.node import NodeState
from tangram.allocation.requests import Alternative
from tangram.allocation.shape import NodeShape

_LOST_CACHED = 100_000  # what a change of a GPU or of the free whole GPUs takes, by change
_RETIRED_KEPT = 10_000  # groups gone (no node in that state now) whose options stay cached
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


TrackedWants = tuple[tuple[tuple[int, Want], ...], tuple[tuple[int, Want], ...], tuple[tuple[int, Want], ...]]
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


class _Group:
    """A group's members (the list in DemandIndex.groups) and its reduced options per kind."""

    __slots__ = ("key", "members", "reduced", "signature")

    def __init__(self, key: tuple[Any, ...], members: list[str]) -> None:
        self.key = key
        self.signature: str = key[0]
        self.members = members
        self.reduced: dict[int, Reduced] = {}  # by DemandIndex._kind_ids


class _KindView:
    """The groups a kind fits on, and those not yet looked at for it: most groups fit a given kind
    nowhere (no room for 8 GPUs, no MIG slice of the size), and a decision walks only the others."""

    __slots__ = ("fit", "last", "pending")

    def __init__(self, records: Iterable[_Group]) -> None:
        # Keyed by the group itself (its identity), not by its state key: no hashing of that.
        self.fit: dict[_Group, None] = {}
        self.pending: dict[_Group, None] = dict.fromkeys(records)
        self.last: _Group | None = None  # the group chosen last


@dataclass(frozen=True, slots=True)
class Choice:
    group: tuple[Any, ...]
    node: NodeState
    option: Option
    rank: tuple[Any, ...]
    loss: float


def fit_state(key: tuple[Any, ...]) -> FitState:
    return key[0], key[1], key[2]


class DemandIndex:
    """Nodes grouped by state, supply per claim kind, and the demand mix that weighs them."""

    def __init__(self, shapes: dict[str, NodeShape], eligible: Callable[[NodeState, Alternative], Eligible]):
        self.demand = Demand()
        self._shapes = shapes
        self._eligible = eligible
        self.groups: dict[tuple[Any, ...], list[str]] = {}
        # The same groups, in the same order, with what choose() keeps of their options: looked up
        # without hashing a group key (a few hundred ints) per group and decision.
        self._records: dict[tuple[Any, ...], _Group] = {}
        self._keeps_records = False
        self._kind_ids: dict[tuple[Any, ...], int] = {}
        self._views: dict[int, _KindView] = {}  # by kind id
        self._signature_members: dict[str, int] = {}  # nodes filed per shape signature
        self._group_of: dict[str, tuple[Any, ...]] = {}
        self._sample: dict[str, NodeState] = {}  # a node per shape signature, for eligibility
        self.tracked: list[ClaimKind] = []
        self._keys_of: list[ClaimKind] | None = None  # the tracked list _keys are the keys of
        self._keys: list[tuple[Any, ...]] = []
        self._position: dict[tuple[Any, ...], int] = {}
        self.supply: list[int] = []
        self._fits: dict[FitState, tuple[int, ...]] = {}
        self._wants: dict[tuple[str, tuple[Any, ...]], Want | None] = {}
        self._wants_by_shape: dict[str, TrackedWants] = {}  # by position: as tracked
        self._lost_cache: dict[tuple[Any, ...], tuple[tuple[int, int], ...]] = {}  # by position too
        self._deltas: dict[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]] = {}
        # Groups no node is in now, with their options: states come back (a claim released leaves
        # the node as it was before), and their options are not worked out again.
        self._retired: dict[tuple[Any, ...], _Group] = {}
        for kind in self.demand.kinds.values():
            self._track(kind)

    # --- the index -------------------------------------------------------------------------------

    def place(self, node: NodeState) -> None:
        """(Re)file the node under its current state; supply follows."""
        key = node.group_key()
        old = self._group_of.get(node.name)
        if old == key:
            return
        # Counting fits is the only step that can fail: done before anything moves, so a failure
        # leaves the node filed where it was and the index whole (a half-moved node was a KeyError
        # on every later decision).
        self.fits(fit_state(key))
        if old is not None:
            self.fits(fit_state(old))
            self._leave(node.name, old)
        members = self.groups.get(key)
        if members is None:
            members = self.groups[key] = []
            if self._keeps_records:
                record = self._retired.pop(key, None)
                if record is None:
                    record = _Group(key, members)
                else:
                    record.members = members
                self._records[key] = record
                for view in self._views.values():
                    view.pending[record] = None
        insort(members, node.name)
        self._signature_members[key[0]] = self._signature_members.get(key[0], 0) + 1
        self._group_of[node.name] = key
        self._add_supply(fit_state(key), 1)

    def remove(self, name: str) -> None:
        old = self._group_of.get(name)
        if old is not None:
            self.fits(fit_state(old))
            del self._group_of[name]
            self._leave(name, old)

    def sample_of(self, signature: str) -> NodeState | None:
        return self._sample.get(signature)

    def set_sample(self, signature: str, node: NodeState | None) -> None:
        """The node eligibility is read off for its shape; None when no node has the shape."""
        if node is None:
            self._sample.pop(signature, None)
        else:
            self._sample[signature] = node

    def _leave(self, name: str, key: tuple[Any, ...]) -> None:
        members = self.groups[key]
        position = bisect_left(members, name)
        if position < len(members) and members[position] == name:
            del members[position]
        self._signature_members[key[0]] -= 1
        if not members:
            del self.groups[key]
            if self._keeps_records:
                record = self._records.pop(key)
                for view in self._views.values():
                    view.fit.pop(record, None)
                    view.pending.pop(record, None)
                if len(self._retired) >= _RETIRED_KEPT:
                    self._retired.clear()
                self._retired[key] = record
        self._add_supply(fit_state(key), -1)

    def _add_supply(self, state: FitState, sign: int) -> None:
        fits = self.fits(state)
        supply = self.supply
        for i, value in enumerate(fits):
            if value:
                supply[i] += sign * value

    # --- kinds and their supply ------------------------------------------------------------------

    def note(self, kind: ClaimKind) -> Callable[[], None]:
        """Count one claim of the kind; returns what takes the count back out, exactly."""
        saved = (self.demand.saved(), self.tracked, self._position, self.supply)
        if self.demand.note(kind):
            self._track(kind)

        def undo() -> None:
            demand, tracked, position, supply = saved
            self.demand.restore(demand)
            if tracked is not self.tracked:
                self.tracked, self._position, self.supply = tracked, position, supply
                self._fits.clear()
                self._forget_options()

        return undo

    def _track(self, kind: ClaimKind) -> None:
        if kind.key in self._position:
            return
        before = (self.tracked, self._position, self.supply)
        self.tracked = sorted([*self.tracked, kind], key=lambda k: k.order)
        self._position = {k.key: i for i, k in enumerate(self.tracked)}
        self._fits.clear()
        self._forget_options()
        supply = [0] * len(self.tracked)
        try:
            for key, members in self.groups.items():
                fits = self.fits(fit_state(key))
                for i, value in enumerate(fits):
                    supply[i] += value * len(members)
        except Exception:
            # The kind is not tracked after all; the caches are derived and fill again.
            self.tracked, self._position, self.supply = before
            self._fits.clear()
            self._forget_options()
            raise
        self.supply = supply

    def _forget_options(self) -> None:
        """The options' losses are by kind position: gone when the kinds tracked change."""
        self._retired.clear()
        self._views.clear()
        self._wants_by_shape.clear()
        self._lost_cache.clear()
        self._deltas.clear()
        for record in self._records.values():
            record.reduced.clear()

    def want(self, signature: str, kind: ClaimKind) -> Want | None:
        cache_key = (signature, kind.key)
        if cache_key in self._wants:
            return self._wants[cache_key]
        shape = self._shapes[signature]
        sample = self._sample.get(signature)
        eligible = None
        if kind.alt is not None:
            eligible = self._eligible(sample, kind.alt) if sample is not None else None
        found = want_on(shape, kind, eligible) if kind.alt is None or eligible is not None else None
        if sample is not None or kind.alt is None:
            self._wants[cache_key] = found
        return found

    def fits(self, state: FitState) -> tuple[int, ...]:
        found = self._fits.get(state)
        if found is None:
            signature, free_whole, occupied = state
            values = []
            for kind in self.tracked:
                want = self.want(signature, kind)
                values.append(0 if want is None else fit(want, free_whole, occupied))
            found = self._fits[state] = tuple(values)
        return found

    def weights(self) -> list[float]:
        if self._keys_of is not self.tracked:  # the list is replaced, never changed in place
            self._keys_of, self._keys = self.tracked, [kind.key for kind in self.tracked]
        return self.demand.weights(self._keys, self.supply)

    # --- options on a group ----------------------------------------------------------------------

    def options(self, key: tuple[Any, ...], node: NodeState, kind: ClaimKind, want: Want) -> Reduced:
        """The group's placements choose() may pick, with what each takes from every kind."""
        if want.kind == "gpu" and bin(key[1] & want.whole).count("1") < want.count:
            return Reduced(0.0, ())  # fewer free whole GPUs it may take than it needs
        self._trim()
        before = fit_state(key)
        others = self._tracked_wants(key[0])[2]
        seen: set[tuple[Any, ...]] = set()
        kept = []
        for placement in _placements(node, key, want):
            _, bits, changes, quality, _, mode_changes, creates, leaves = placement
            delta = self._lost(before, bits, changes, others)  # equal losses are one object
            outcome = (id(delta), quality, mode_changes, creates, leaves)
            if outcome in seen:
                continue
            seen.add(outcome)
            kept.append((placement, delta))
        return reduce(key, kept)

    def _interned(self, delta: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
        """One object per loss taken (those kept in _lost_cache too, cleared with it): options
        are told apart by it, and choose() sums each once per decision."""
        found = self._deltas.get(delta)
        if found is None:
            found = self._deltas[delta] = delta
        return found

    def reduced(self, record: _Group, kind_id: int, node: NodeState, kind: ClaimKind, want: Want) -> Reduced:
        """The group's options that choose() may pick, cached on the group until the kinds change."""
        found = record.reduced.get(kind_id)
        if found is None:
            found = record.reduced[kind_id] = self.options(record.key, node, kind, want)
        return found

    def _tracked_wants(self, signature: str) -> TrackedWants:
        """(kind position, want) of every tracked kind something of the shape can serve, in order:
        whole-GPU kinds, one-device MIG kinds, and the other MIG kinds."""
        found = self._wants_by_shape.get(signature)
        if found is None:
            whole: list[tuple[int, Want]] = []
            single: list[tuple[int, Want]] = []
            other: list[tuple[int, Want]] = []
            for i, kind in enumerate(self.tracked):
                want = self.want(signature, kind)
                if want is None:
                    continue
                if want.kind == "gpu":
                    whole.append((i, want))
                elif want.count == 1:
                    single.append((i, want))
                else:
                    other.append((i, want))
            found = (tuple(whole), tuple(single), tuple(other))
            # Kept once the shape's sample is there (want() keeps its answers from then on too).
            if signature in self._sample:
                self._wants_by_shape[signature] = found
        return found

    def delta(self, before: FitState, option: Option) -> tuple[tuple[int, int], ...]:
        """(kind position, fits lost) for every kind the option takes room from."""
        self._trim()
        _, free_after, occupied_after = option.after
        changes = tuple(
            (p, a, b) for p, (a, b) in enumerate(zip(before[2], occupied_after, strict=True)) if a != b
        )
        return self._lost(before, free_after, changes, self._tracked_wants(before[0])[2])

    def _lost(
        self,
        before: FitState,
        free_after: int,
        changes: tuple[tuple[int, int, int], ...],
        others: tuple[tuple[int, Want], ...],
    ) -> tuple[tuple[int, int], ...]:
        """delta() of the placement that leaves the free whole GPUs `free_after` and changes the
        occupied slices of GPU position p from a to b for each (p, a, b) of `changes`.

        Only the GPUs the option touches change, so MIG kinds are recounted on those GPUs alone
        and whole-GPU kinds only when a free whole GPU is taken. What one GPU's change takes from
        the one-device MIG kinds, and what taking free whole GPUs takes from the whole-GPU kinds,
        are the same wherever they happen on the shape: both are kept, by change, and so is the
        whole answer where no other kind is tracked.
        """
        if others:
            return self._interned(self._delta(before, free_after, changes, others))
        cache_key = (before[0], before[1], free_after, changes)
        found = self._lost_cache.get(cache_key)
        if found is None:
            found = self._cache_lost(
                before[0], cache_key, self._interned(self._delta(before, free_after, changes, others))
            )
        return found

    def _delta(
        self,
        before: FitState,
        free_after: int,
        changed: tuple[tuple[int, int, int], ...],
        others: tuple[tuple[int, Want], ...],
    ) -> tuple[tuple[int, int], ...]:
        signature, free_whole, occupied = before
        lost_at: dict[int, int] = {}
        if free_after != free_whole:
            for i, lost in self._whole_lost(signature, free_whole, free_after, occupied):
                lost_at[i] = lost
        for p, a, b in changed:
            for i, lost in self._slices_lost(signature, p, a, b):
                lost_at[i] = lost_at.get(i, 0) + lost
        if others:
            old = self.fits(before)
            occupied_after = _after(occupied, changed)
            for i, want in others:
                if old[i]:
                    lost = old[i] - fit(want, free_after, occupied_after)
                    if lost:
                        lost_at[i] = lost
        # A one-device MIG kind that fits nowhere on the node loses nothing (the GPUs' counts are
        # all 0 and only fall), and _whole_lost leaves out the whole-GPU kinds that fit nowhere.
        return tuple([(i, lost) for i, lost in sorted(lost_at.items()) if lost])

    def _whole_lost(
        self, signature: str, free_whole: int, free_after: int, occupied: tuple[int, ...]
    ) -> tuple[tuple[int, int], ...]:
        """(kind position, fits lost) of the whole-GPU kinds that fit on the node when the free
        whole GPUs go from `free_whole` to `free_after` (their fits read nothing else)."""
        cache_key = (signature, free_whole, free_after)
        found = self._lost_cache.get(cache_key)
        if found is None:
            out = []
            for i, want in self._tracked_wants(signature)[0]:
                fits = fit(want, free_whole, occupied)
                lost = fits - fit(want, free_after, occupied)
                if lost and fits:
                    out.append((i, lost))
            found = self._cache_lost(signature, cache_key, tuple(out))
        return found

    def _slices_lost(
        self, signature: str, position: int, used: int, after: int
    ) -> tuple[tuple[int, int], ...]:
        """(kind position, placements lost) of the one-device MIG kinds on the GPU at `position`
        when its occupied slices go from `used` to `after`."""
        cache_key = (signature, position, used, after)
        found = self._lost_cache.get(cache_key)
        if found is None:
            out = []
            for i, want in self._tracked_wants(signature)[1]:
                masks = want.masks[position]
                if masks:
                    lost = placements_fit(masks, used) - placements_fit(masks, after)
                    if lost:
                        out.append((i, lost))
            found = self._cache_lost(signature, cache_key, tuple(out))
        return found

    def _cache_lost(
        self, signature: str, cache_key: tuple[Any, ...], lost: tuple[tuple[int, int], ...]
    ) -> tuple[tuple[int, int], ...]:
        # Kept, as _tracked_wants is, once the shape's sample is there.
        if signature in self._sample:
            self._lost_cache[cache_key] = lost
        return lost

    def _trim(self) -> None:
        """Bound the losses kept; only between two groups' options, never within them: equal
        losses of one group's options must be one object (see _interned)."""
        if len(self._lost_cache) >= _LOST_CACHED or len(self._deltas) >= _LOST_CACHED:
            self._lost_cache.clear()
            self._deltas.clear()

    def choose(
        self,
        kind: ClaimKind,
        nodes: dict[str, NodeState],
        rejected: dict[str, int],
        ranked: list[Choice] | None = None,
    ) -> Choice | None:
        """The best placement over every group, or None when no group has one."""
        weights = self.weights()
        best: Choice | None = None
        best_rank: tuple[Any, ...] | None = None
        wants = {signature: self.want(signature, kind) for signature in self._sample}
        kind_id = self._kind_ids.setdefault(kind.key, len(self._kind_ids))
        if not self._keeps_records:
            # Records are kept from the first placement by demand on: a fleet that never places
            # by demand (another policy) files its nodes as it did.
            self._keeps_records = True
            self._records = {key: _Group(key, members) for key, members in self.groups.items()}
        view = self._views.get(kind_id)
        if view is None:
            view = self._views[kind_id] = _KindView(self._records.values())
        if view.pending:
            # Groups new since this kind was last placed: on which of them it fits.
            for record in list(view.pending):
                want = wants.get(record.signature)
                if want is None:
                    continue
                found = record.reduced.get(kind_id)
                if found is None:
                    found = self.reduced(record, kind_id, nodes[record.members[0]], kind, want)
                del view.pending[record]
                if found.entries:
                    view.fit[record] = None
        unmatched = matched = 0
        for signature, count in self._signature_members.items():
            if wants.get(signature) is None:
                unmatched += count
            else:
                matched += count
        placeable = 0
        # Unless every placement is listed (ranked), a sum of losses that already exceeds the best
        # found is left there: it can only grow (weights and losses of a monotone group are never
        # negative). The group chosen last for the kind is looked at first: it usually still is.
        bound = inf
        losses: dict[int, float] = {}
        records = list(view.fit)
        if view.last is not None and view.last in view.fit:
            first = records.index(view.last)
            records[0], records[first] = records[first], records[0]
        for record in records:
            if wants.get(record.signature) is None:
                continue  # counted as unmatched
            members = record.members
            placeable += len(members)
            found = record.reduced[kind_id]
            prune = ranked is None and found.monotone
            # On the node, the claim gets the best GPU set it has (every entry has that quality);
            # then the least loss, then the least tail.
            least = -1.0
            tail: Tail | None = None
            chosen: Option | None = None
            for delta, entry_tail, option in found.entries:
                # Groups share placements that take the same (one object per loss taken): each
                # is summed once per decision. inf: it was left once it exceeded the best.
                loss = losses.get(id(delta))
                if loss is None:
                    loss = 0.0
                    for i, lost in delta:
                        loss += weights[i] * lost
                        if prune and loss > bound:
                            loss = inf
                            break
                    losses[id(delta)] = loss
                if tail is None or loss < least or (loss == least and entry_tail < tail):
                    least = loss
                    tail = entry_tail
                    chosen = option
            if tail is None or chosen is None:
                continue
            # Between nodes, the least loss first; `mine` is the node's own order.
            if best_rank is not None and least > bound and ranked is None:
                continue
            quality = -found.quality
            mine = (quality, least, *tail)
            rank = (least, quality, tail[0], tail[1], tail[2], record.key, mine)
            if ranked is not None:
                ranked.append(Choice(record.key, nodes[members[0]], chosen, rank, least))
            if best_rank is None or rank < best_rank:
                best_rank = rank
                bound = least
                best = Choice(record.key, nodes[members[0]], chosen, rank, least)
                view.last = record
        unfit = matched - placeable
        if unmatched:
            rejected["no device of this hardware matches the claim"] = unmatched
        if unfit:
            rejected["not enough free GPUs or MIG slices"] = unfit
        return best

    def explain(self, choice: Choice) -> list[LossTerm]:
        weights = self.weights()
        before = self.fits(fit_state(choice.group))
        after = self.fits(choice.option.after)
        return [
            LossTerm(
                kind=kind.label,
                demand=round(self.demand.weight(kind.key), 4),
                supply=self.supply[i],
                weight=round(weights[i], 6),
                fits_before=before[i],
                fits_after=after[i],
                loss=round(weights[i] * (before[i] - after[i]), 6),
            )
            for i, kind in enumerate(self.tracked)
            if before[i] != after[i]
        ]

    def score(self, choice: Choice, nodes_alike: int, reconfigurations: int = 0) -> CandidateScore:
        node = choice.node
        return CandidateScore(
            node=node.name,
            nodes_alike=nodes_alike,
            loss=choice.loss,
            nvlink_quality=round(choice.option.quality, 4),
            reconfigurations=reconfigurations,
            mode_changes=choice.option.mode_changes,
            creates=choice.option.creates,
            devices=[node.shape.devices[d].name for d in choice.option.devices],
        )


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
    for placement in _placements(node, key, want):
        yield _option(key, placement)


def _option(key: tuple[Any, ...], placement: Placement) -> Option:
    devices, bits, changes, quality, set_score, mode_changes, creates, leaves = placement
    return Option(
        devices=devices,
        after=(key[0], bits, _after(key[2], changes)),
        quality=quality,
        set_score=set_score,
        mode_changes=mode_changes,
        creates=creates,
        leaves=leaves,
    )


def _after(occupied: tuple[int, ...], changes: tuple[tuple[int, int, int], ...]) -> tuple[int, ...]:
    after = list(occupied)
    for p, _, b in changes:
        after[p] = b
    return tuple(after)


def _placements(node: NodeState, key: tuple[Any, ...], want: Want) -> Iterator[Placement]:
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
