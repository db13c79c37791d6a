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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from math import inf
from typing import Any

from tangram.allocation.capacity import FitState, Want, fit, placements_fit, want_on
from tangram.allocation.demand import ClaimKind, Demand, DemandSaved
from tangram.allocation.eligibility import Eligible
from tangram.allocation.model import CandidateScore, LossTerm
from tangram.allocation.node import NodeState
from tangram.allocation.options import (
    Option,
    Reduced,
    Tail,
    after_changes,
    fit_state,
    placements,
    reduce,
)
from tangram.allocation.requests import Alternative
from tangram.allocation.shape import NodeShape

_LOST_CACHED = 100_000  # what a change of a GPU or of the free whole GPUs takes, by change
_RETIRED_KEPT = 10_000  # groups gone (no node in that state now) whose options stay cached


TrackedWants = tuple[tuple[tuple[int, Want], ...], tuple[tuple[int, Want], ...], tuple[tuple[int, Want], ...]]


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
        saved = (self.demand.saved(), self.tracked, self._position)
        if self.demand.note(kind):
            self._track(kind)

        def undo() -> None:
            demand, tracked, position = saved
            self.demand.restore(demand)
            if tracked is not self.tracked:
                # Counted again from the groups, never the list saved: nodes filed since the kind
                # was tracked (the decision in between files the nodes changed before it) moved the
                # new list only, and the saved one would keep supply as it was before them.
                self.tracked, self._position = tracked, position
                self._fits.clear()
                self._forget_options()
                self.supply = self._counted_supply()

        return undo

    def restore(self, saved: DemandSaved) -> None:
        """Back to a mix saved before (a ledger image), every kind of it tracked, as noting the
        same claims again would leave it."""
        self.demand.restore(saved)
        for kind in saved.kinds.values():
            self._track(kind)

    def _track(self, kind: ClaimKind) -> None:
        if kind.key in self._position:
            return
        before = (self.tracked, self._position, self.supply)
        self.tracked = sorted([*self.tracked, kind], key=lambda k: k.order)
        self._position = {k.key: i for i, k in enumerate(self.tracked)}
        self._fits.clear()
        self._forget_options()
        try:
            supply = self._counted_supply()
        except Exception:
            # The kind is not tracked after all; the caches are derived and fill again.
            self.tracked, self._position, self.supply = before
            self._fits.clear()
            self._forget_options()
            raise
        self.supply = supply

    def _counted_supply(self) -> list[int]:
        """The supply of every tracked kind, counted over the groups as they are filed now."""
        supply = [0] * len(self.tracked)
        for key, members in self.groups.items():
            fits = self.fits(fit_state(key))
            for i, value in enumerate(fits):
                supply[i] += value * len(members)
        return supply

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
        for placement in placements(node, key, want):
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
            occupied_after = after_changes(occupied, changed)
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
