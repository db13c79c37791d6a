"""The allocator's state of the whole fleet and its decisions: pure, deterministic, no I/O.

Nodes are indexed by shape and by (free whole GPUs, longest free MIG slice run), so a claim looks
at the few nodes that can possibly fit it, in policy order, never at every device of the fleet.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgspec

from tangram import DRIVER_NAME
from tangram.allocation.demand import ClaimKind, claim_kind, counts_as_demand
from tangram.allocation.eligibility import EligibilityCache, Eligible, evaluate
from tangram.allocation.model import (
    Allocated,
    Claim,
    Decision,
    Explanation,
    Failed,
    FleetMetrics,
    PartitionPlan,
    Policy,
    Release,
    internal_failure,
)
from tangram.allocation.node import ExistingInstance, NodeState
from tangram.allocation.placement import Choice, DemandIndex, fit_state, options_on
from tangram.allocation.requests import Alternative, ClaimError, ResolvedClaim, covers, resolve
from tangram.allocation.shape import NodeShape, shape_signature
from tangram.allocation.solver import Solution, solve
from tangram.allocation.spec import DeviceClass, parse_claim_spec
from tangram.allocation.templates import DeviceTemplates
from tangram.dra.model import Device
from tangram.events.catalogue import AllocatedDevice, FailureCause
from tangram.events.inventory import MigPlacement, NodeHardware
from tangram.kubernetes.objects.names import InvalidName, validate_claim_uid

EXPLAINED_CANDIDATES = 5  # groups of nodes listed, best first, in an explanation
TANGRAM_NODES_COMPARED = 16  # feasible nodes Tangram compares when none has the ideal GPU set
_FILTERED = "not enough free GPUs or MIG slices"

BucketKey = tuple[int, int]


@dataclass(frozen=True, slots=True)
class _Held:
    decision: Allocated
    node: str
    devices: tuple[str, ...]  # device names taken (admin access excluded)


# MIG instances destroyed that a node's late inventories are checked against, per node.
DESTROYED_REMEMBERED = 4096


class FleetState:
    """`reconfigure_foreign_instances`: free MIG instances that Tangram did not create (made by hand
    or by another tool before Tangram ran) may be destroyed to make room for a claim. Off by
    default: only instances Tangram created itself are reconfigured."""

    def __init__(self, *, driver: str = DRIVER_NAME, reconfigure_foreign_instances: bool = False) -> None:
        self.driver = driver
        self.reconfigure_foreign_instances = reconfigure_foreign_instances
        self._nodes: dict[str, NodeState] = {}
        self._shapes: dict[str, NodeShape] = {}
        self._buckets: dict[str, dict[BucketKey, list[str]]] = {}
        self._bucket_of: dict[str, tuple[str, BucketKey]] = {}
        # Nodes changed by replayed history since they were last placed in a bucket: a rebuild
        # indexes each once, before the first decision, instead of after every event.
        self._unindexed: set[str] = set()
        self._templates = DeviceTemplates(driver)
        self._held: dict[str, _Held] = {}
        self._held_on: dict[str, set[str]] = {}
        self._eligible = EligibilityCache()
        self._index = DemandIndex(self._shapes, self._eligible_on)
        self._noted: set[str] = set()  # claims counted in the demand mix
        self._last_note: tuple[str, Callable[[], None]] | None = None  # what uncount() undoes
        self._made: set[tuple[str, int, int, int]] = set()  # (node, GPU, profile id, start) Tangram created
        # node -> UUIDs of the MIG instances destroyed last (UUIDs are never reused; the oldest are
        # forgotten, as no inventory is that late), in the order they were destroyed
        self._destroyed: dict[str, dict[str, None]] = {}

    # --- inventory -------------------------------------------------------------------------------

    def apply_inventory(self, hw: NodeHardware) -> None:
        """Replace the node's devices; claims allocated there keep their devices."""
        signature = shape_signature(hw)
        devices = self._templates.devices(signature, hw)
        shape = self._shapes.get(signature)
        if shape is None:
            shape = self._shapes[signature] = NodeShape(signature, hw, devices)
        old = self._nodes.get(hw.node)
        hw = self._without_destroyed(hw)
        node = NodeState(hw, devices, shape, generation=old.generation + 1 if old else 1)
        if old is not None and old.destroying:
            # Only the destroy's result ends "being destroyed": an inventory read before the
            # destroy (or before the create it undoes) says nothing about it.
            node.set_destroying(old.destroying)
        for uid in sorted(self._held_on.get(hw.node, ())):
            held = self._held[uid]
            node.take([shape.index_by_name[n] for n in held.devices if n in shape.index_by_name], uid)
        self._nodes[hw.node] = node
        self._resample(signature)
        if old is not None and old.shape.signature != signature:
            self._resample(old.shape.signature)
        # Indexed before the next decision reads the index: a rebuild folding a thousand
        # inventories then settles each node once, not once per inventory.
        self._unindexed.add(hw.node)

    def _without_destroyed(self, hw: NodeHardware) -> NodeHardware:
        """The inventory less the instances already destroyed: it may have been read before the
        destroy (discovery and the partitioner both publish, so inventories can arrive late)."""
        destroyed = self._destroyed.get(hw.node)
        if not destroyed or not any(m.uuid in destroyed for g in hw.gpus for m in g.mig_instances):
            return hw
        gpus = [
            msgspec.structs.replace(g, mig_instances=[m for m in g.mig_instances if m.uuid not in destroyed])
            for g in hw.gpus
        ]
        return msgspec.structs.replace(hw, gpus=gpus)

    def remove_node(self, name: str) -> list[str]:
        """Forget the node; returns the uids of claims allocated there (their records stay)."""
        node = self._nodes.pop(name, None)
        if node is None:
            return []
        self._unindexed.discard(name)
        self._index.remove(name)
        self._resample(node.shape.signature)
        place = self._bucket_of.pop(name, None)
        if place is not None:
            _remove(self._buckets[place[0]][place[1]], name)
        return sorted(self._held_on.get(name, ()))

    def _resample(self, signature: str) -> None:
        """Keep the index's sample node of a shape current the moment a node of it changes.

        Eligibility and the fits of every kind are read off the sample; a sample missing until
        the node is next indexed would make them depend on when inventories arrive relative to
        decisions, and a rebuilt allocator (or a replay) would weigh placements differently.
        """
        current = self._index.sample_of(signature)
        if current is not None and self._nodes.get(current.name) is current:
            return
        replacement = self._nodes.get(current.name) if current is not None else None
        if replacement is None or replacement.shape.signature != signature:
            replacement = next(
                (
                    self._nodes[name]
                    for name in sorted(self._nodes)
                    if self._nodes[name].shape.signature == signature
                ),
                None,
            )
        self._index.set_sample(signature, replacement)

    def _reindex_changed(self) -> None:
        """Place every node changed since the last decision in its bucket, in name order."""
        for name in sorted(self._unindexed):
            self._reindex(self._nodes[name])
        self._unindexed.clear()

    def _reindex(self, node: NodeState) -> None:
        self._index.place(node)
        place = (node.shape.signature, node.bucket_key())
        current = self._bucket_of.get(node.name)
        if current == place:
            return
        if current is not None:
            _remove(self._buckets[current[0]][current[1]], node.name)
        insort(self._buckets.setdefault(place[0], {}).setdefault(place[1], []), node.name)
        self._bucket_of[node.name] = place

    # --- decisions ------------------------------------------------------------------------------

    def allocate(
        self,
        claim: Claim,
        classes: Mapping[str, DeviceClass],
        policy: Policy = "tangram",
        *,
        explain: bool = False,
    ) -> Decision:
        held = self._held.get(claim.uid)
        if held is not None:
            return held.decision
        try:
            validate_claim_uid(claim.uid)
        except InvalidName as error:
            # The node names CDI files after the uid and refuses this one: holding devices for it
            # would hold them for a claim that can never be prepared.
            return Failed(
                claim_uid=claim.uid,
                reason=f"invalid claim: {error}; no node can prepare it",
                cause="claim",
            )
        try:
            spec = parse_claim_spec(claim.spec)
            resolved = resolve(spec, classes, self.driver)
        except ValueError as error:
            return Failed(claim_uid=claim.uid, reason=f"invalid claim: {error}", cause="claim")
        except ClaimError as error:
            return Failed(claim_uid=claim.uid, reason=str(error), cause="claim")
        # The claim's own kind counts while it is placed; taken back out, exactly, when the
        # decision shows the claim says nothing about demand.
        kind, undo = self._note(claim.uid, resolved)
        decision: Decision
        try:
            decision = self._place(claim, resolved, policy, explain, kind)
        except ClaimError as error:
            decision = Failed(claim_uid=claim.uid, reason=str(error), cause="claim")
        except Exception as error:
            # Nothing is held before _commit's last steps, so the fleet is as it was: the claim
            # fails alone and the next one is decided.
            decision = Failed(claim_uid=claim.uid, reason=internal_failure(error), cause="internal")
        self._last_note = None
        if undo is not None:
            if counts_as_demand(decision):
                self._last_note = (claim.uid, undo)
            else:
                undo()
                self._noted.discard(claim.uid)
        return decision

    def uncount(self, claim_uid: str) -> None:
        """Take the claim just decided back out of the demand mix, exactly (its decision could not
        be carried out after all). Only the last decision can be taken back."""
        if self._last_note is not None and self._last_note[0] == claim_uid:
            self._last_note[1]()
            self._noted.discard(claim_uid)
        self._last_note = None

    def note_demand(self, claim: Claim, classes: Mapping[str, DeviceClass]) -> None:
        """Count a claim read from the log in the demand mix, as allocate() did when it was live.

        The mix is part of the allocator's fold: a rebuild notes each claim at its decision, in
        log order, so the rebuilt allocator weighs placements exactly as the one that died.
        """
        if claim.uid in self._noted:
            return
        try:
            resolved = resolve(parse_claim_spec(claim.spec), classes, self.driver)
        except (ValueError, ClaimError):
            return
        self._note(claim.uid, resolved)

    def _note(self, uid: str, resolved: ResolvedClaim) -> tuple[ClaimKind | None, Callable[[], None] | None]:
        """The claim's kind, counted in the demand mix unless it was before; with what undoes it."""
        kind = claim_kind(resolved)
        if uid in self._noted:
            return kind, None
        self._noted.add(uid)
        return kind, None if kind is None else self._index.note(kind)

    def release(self, claim_uid: str, *, destroy_mig: bool = True) -> Release:
        """Free the claim's devices; with destroy_mig, its MIG instances are returned for destruction."""
        held = self._held.pop(claim_uid, None)
        if held is None:
            return Release(claim_uid=claim_uid)
        self._held_on[held.node].discard(claim_uid)
        node = self._nodes.get(held.node)
        destroy: list[PartitionPlan] = []
        taken = [d for d in held.decision.devices if not d.admin_access]
        if node is not None:
            node.give_back(node.shape.index_by_name[n] for n in held.devices if n in node.shape.index_by_name)
        if destroy_mig:
            for device in taken:
                if device.placement is None or device.profile is None or device.profile_id is None:
                    continue
                mig_uuid = ""
                if node is not None and device.device in node.shape.index_by_name:
                    inst = node.instance_for(node.shape.devices[node.shape.index_by_name[device.device]])
                    mig_uuid = inst.uuid if inst is not None else ""
                    node.mark_destroying(device.gpu_index, device.profile_id, device.placement.start)
                destroy.append(_mig_plan(device, mig_uuid=mig_uuid))
        if node is not None:
            self._unindexed.discard(node.name)
            self._reindex(node)
        return Release(
            claim_uid=claim_uid, node=held.node, devices=list(held.decision.devices), destroy=destroy
        )

    def release_replayed(self, claim_uid: str) -> Release:
        """Apply a release read from the log: release()'s change of state, and the same destroy plans.

        A rebuild frees the devices and marks the claim's MIG placements as being destroyed. The
        plans are returned without the instance UUIDs the inventory showed then: the caller names
        the instance from the claim's own create, should the destroys have to be sent again.
        """
        held = self._held.pop(claim_uid, None)
        if held is None:
            return Release(claim_uid=claim_uid)
        self._held_on[held.node].discard(claim_uid)
        node = self._nodes.get(held.node)
        destroy: list[PartitionPlan] = []
        if node is not None:
            index = node.shape.index_by_name
            node.give_back(index[n] for n in held.devices if n in index)
            for device in held.decision.devices:
                if (
                    device.admin_access
                    or device.placement is None
                    or device.profile is None
                    or device.profile_id is None
                    or device.device not in index
                ):
                    continue
                node.mark_destroying(device.gpu_index, device.profile_id, device.placement.start)
                destroy.append(_mig_plan(device))
            self._unindexed.add(node.name)
        return Release(
            claim_uid=claim_uid, node=held.node, devices=list(held.decision.devices), destroy=destroy
        )

    def destroy_done(
        self, node_name: str, gpu_uuid: str, start: int, mig_uuid: str, *, slot_freed: bool = True
    ) -> None:
        """The node destroyed the instance at `start` (`mig_uuid`, empty when none was there).

        `slot_freed` False: another destroy at that placement is still to come (a rebuild folds the
        results after every release), so the placement stays on its way out.
        """
        node = self._nodes.get(node_name)
        if node is None:
            return
        if mig_uuid:
            destroyed = self._destroyed.setdefault(node_name, {})
            destroyed[mig_uuid] = None
            if len(destroyed) > DESTROYED_REMEMBERED:
                del destroyed[next(iter(destroyed))]
        node.destroyed(gpu_uuid, start, mig_uuid, slot_freed=slot_freed)
        self._unindexed.add(node_name)

    def destroy_refused(self, node_name: str, gpu_uuid: str, start: int) -> None:
        """The node refused to destroy an instance: it is no longer counted as on its way out, so
        its slices are not handed out again while it is still there. Something outside Tangram
        holds it (processes still run on it), so it is no longer Tangram's to reconfigure either."""
        node = self._nodes.get(node_name)
        if node is None:
            return
        node.keep(gpu_uuid, start)
        self._made = {
            made
            for made in self._made
            if not (made[0] == node_name and node.gpu_uuid.get(made[1]) == gpu_uuid and made[3] == start)
        }
        self._unindexed.add(node_name)

    def allocation(self, claim_uid: str) -> Allocated | None:
        held = self._held.get(claim_uid)
        return held.decision if held else None

    # --- placement ------------------------------------------------------------------------------

    def _eligible_for(self, node: NodeState, alt: Alternative) -> Eligible:
        """What the claim asking for `alt` may take on the node: raises its selector's error."""
        return self._eligible_on(node, alt).for_claim(alt)

    def _eligible_on(self, node: NodeState, alt: Alternative) -> Eligible:
        key: tuple[Any, ...] = (
            (alt.cache_key, node.name, node.generation)
            if alt.node_scoped
            else (alt.cache_key, node.shape.signature)
        )
        found = self._eligible.get(key)
        if found is None:
            found = evaluate(alt, node.devices, self.driver)
            self._eligible.put(key, found)
        return found

    def _candidates(
        self, claim: ResolvedClaim, policy: Policy, rejected: Counter[str], hardware: set[str]
    ) -> Iterator[NodeState]:
        """Nodes that may fit the claim, in policy order. Reasons for the others go to `rejected`;
        those that no state of the node's hardware could change are also put in `hardware`."""
        self._reindex_changed()
        streams: list[Iterator[tuple[Any, ...]]] = []
        spread = policy == "tangram" and claim.spread
        for signature in sorted(self._buckets):
            buckets = {k: v for k, v in self._buckets[signature].items() if v}
            if not buckets:
                continue
            sample = self._nodes[buckets[next(iter(buckets))][0]]
            need_whole = 0
            need_slices = 0
            shape_reason = ""
            for request in claim.requests:
                sizes: list[int] = []
                reasons: list[str] = []
                for alt in request.alternatives:
                    found = None if alt.node_scoped else self._eligible_for(sample, alt)
                    if found is not None and found.reason:
                        reasons.append(f'request "{alt.result_name}": {found.reason}')
                    sizes.append(-1 if found is None else len(found.devices))
                if reasons and len(reasons) == len(request.alternatives):
                    shape_reason = reasons[0]
                    break
                if len(request.alternatives) != 1:
                    continue
                alt = request.alternatives[0]
                if alt.node_scoped or alt.admin or alt.all_mode:
                    continue
                if alt.count > sample.shape.largest_nvlink_set and any(
                    rule.nvlink and covers(rule.requests, alt) for rule in claim.topology
                ):
                    shape_reason = (
                        f'request "{alt.result_name}": at most {sample.shape.largest_nvlink_set} GPUs '
                        "of this hardware are NVLink-connected pairwise"
                    )
                    break
                matching = len(self._eligible_on(sample, alt).devices)
                if matching < alt.count:
                    shape_reason = (
                        f'request "{alt.result_name}": only {matching} device'
                        f"{'s' if matching != 1 else ''} of this hardware match (needs {alt.count})"
                    )
                    break
                kinds = {sample.shape.devices[d].kind for d in self._eligible_on(sample, alt).devices}
                if kinds == {"gpu"}:
                    need_whole += alt.count
                elif kinds == {"mig"}:
                    smallest = min(
                        sample.shape.devices[d].size for d in self._eligible_on(sample, alt).devices
                    )
                    need_slices = max(need_slices, smallest)
            members = sum(len(v) for v in buckets.values())
            if shape_reason:
                rejected[shape_reason] += members
                hardware.add(shape_reason)
                continue
            for (free_whole, run), names in buckets.items():
                fits = free_whole >= need_whole and (
                    need_slices == 0 or run >= need_slices or free_whole >= 1
                )
                if not fits:
                    rejected[_FILTERED] += len(names)
                    continue
                if policy == "first-fit":
                    streams.append(_keyed((), names))
                elif spread:
                    streams.append(_keyed((-free_whole, -run), names))
                else:
                    streams.append(_keyed((free_whole, run), names))
        for entry in heapq.merge(*streams):
            yield self._nodes[entry[-1]]

    def _place(
        self, claim: Claim, resolved: ResolvedClaim, policy: Policy, explain: bool, kind: ClaimKind | None
    ) -> Decision:
        if policy == "tangram" and kind is not None and not resolved.spread:
            decided = self._place_by_demand(claim, resolved, kind, explain)
            if decided is not None:
                return decided
        rejected: Counter[str] = Counter()
        hardware: set[str] = set()
        notes: list[str] = []
        best: tuple[NodeState, Solution] | None = None
        feasible = 0
        for node in self._candidates(resolved, policy, rejected, hardware):
            outcome = solve(node, resolved, partial(self._eligible_for, node), scored=policy == "tangram")
            if isinstance(outcome, str):
                rejected[outcome] += 1
                if explain:
                    notes.append(f"{node.name}: {outcome}")
                continue
            feasible += 1
            if explain:
                notes.append(
                    f"{node.name}: fits (GPU set score {outcome.set_score}, best {outcome.ideal_set_score})"
                )
            if best is None or outcome.set_score > best[1].set_score:
                best = (node, outcome)
            if policy != "tangram" or outcome.ideal or feasible >= TANGRAM_NODES_COMPARED:
                break
        if best is None:
            summary = "; ".join(
                f"{count} node{'s' if count != 1 else ''}: {reason}"
                for reason, count in sorted(rejected.items(), key=lambda item: (-item[1], item[0]))
            )
            reason = f"0/{len(self._nodes)} nodes fit" + (f": {summary}" if summary else "")
            if explain:
                notes.extend(f"{count} nodes: {reason}" for reason, count in sorted(rejected.items()))
            # Every node turned down for what its hardware is (or no node at all): freed
            # capacity cannot help, a new node might.
            cause: FailureCause = "hardware" if set(rejected) <= hardware else "capacity"
            return Failed(claim_uid=claim.uid, reason=reason, explanation=notes, cause=cause)
        if explain:
            notes.append(f"chosen {best[0].name}")
            notes.extend(f"{count} nodes: {reason}" for reason, count in sorted(rejected.items()))
        return self._commit(claim, resolved, best[0], best[1], notes)

    def _place_by_demand(
        self, claim: Claim, resolved: ResolvedClaim, kind: ClaimKind, explain: bool
    ) -> Decision | None:
        """Tangram's placement for a claim of a kind the demand mix models; None hands the claim
        to the general search (which also words the failure when nothing fits)."""
        self._reindex_changed()
        rejected: dict[str, int] = {}
        ranked: list[Choice] | None = [] if explain else None
        choice = self._index.choose(kind, self._nodes, rejected, ranked)
        destroy: list[PartitionPlan] = []
        saved: set[tuple[int, int, int]] | None = None
        if choice is None:
            found = self._reconfiguration(kind, ranked)
            if found is None:
                return None
            choice, needed = found
            saved = set(choice.node.destroying)
            choice.node.set_destroying(saved | {(g, inst.profile_id, inst.start) for g, inst in needed})
            destroy = [_destroy_plan(choice.node, g, inst) for g, inst in needed]
        decided: Allocated | None = None
        try:
            decided = self._settle(
                claim,
                resolved,
                choice,
                kind=kind,
                explain=explain,
                destroy=destroy,
                ranked=ranked,
                rejected=rejected,
            )
        finally:
            # Not placed there (or failed on the way): the instances marked are not destroyed.
            if decided is None and saved is not None:
                choice.node.set_destroying(saved)
        return decided

    def _settle(
        self,
        claim: Claim,
        resolved: ResolvedClaim,
        choice: Choice,
        *,
        kind: ClaimKind,
        explain: bool,
        destroy: list[PartitionPlan],
        ranked: list[Choice] | None,
        rejected: dict[str, int],
    ) -> Allocated | None:
        """The claim's devices on the chosen node, committed; None when they cannot be found there."""
        node = choice.node
        outcome = solve(
            node, resolved, partial(self._eligible_for, node), scored=True, first=choice.option.devices
        )
        if isinstance(outcome, str):
            return None
        why: Explanation | None = None
        notes: list[str] = []
        if explain:
            alike = len(self._index.groups.get(choice.group, ())) or 1
            chosen = self._index.score(choice, alike, len(destroy))
            best_per_group: dict[tuple[Any, ...], Choice] = {}
            for candidate in sorted(ranked or [], key=lambda c: c.rank):
                best_per_group.setdefault(candidate.group, candidate)
            why = Explanation(
                policy="tangram",
                claim_kind=kind.label,
                chosen=chosen,
                terms=self._index.explain(choice),
                candidates=[
                    self._index.score(c, len(self._index.groups.get(c.group, ())) or 1)
                    for c in list(best_per_group.values())[:EXPLAINED_CANDIDATES]
                ],
                rejected=dict(sorted(rejected.items())),
            )
            notes.append(
                f"chosen {node.name} (demand-weighted loss {choice.loss:g}, "
                f"{alike} node{'s' if alike != 1 else ''} in the same state)"
            )
            notes.extend(
                f"{term.kind}: fits {term.fits_before} -> {term.fits_after}, weight {term.weight:g} "
                f"(demand {term.demand:g} / supply {term.supply}), loss {term.loss:g}"
                for term in why.terms
            )
            notes.extend(f"{count} nodes: {reason}" for reason, count in sorted(rejected.items()))
        return self._commit(claim, resolved, node, outcome, notes, why=why, destroy=destroy)

    def _reconfiguration(
        self, kind: ClaimKind, ranked: list[Choice] | None
    ) -> tuple[Choice, list[tuple[int, ExistingInstance]]] | None:
        """Where destroying free MIG instances lets the claim fit: fewest destroyed, then least loss.

        Only instances Tangram created are destroyed, unless reconfigure_foreign_instances; an
        instance in use, claimed or already being destroyed is never touched.
        """
        best: tuple[tuple[Any, ...], Choice, list[tuple[int, ExistingInstance]]] | None = None
        weights = self._index.weights()
        for key, members in list(self._index.groups.items()):
            if not key[4]:
                continue
            node = self._nodes[members[0]]
            want = self._index.want(key[0], kind)
            if want is None:
                continue
            free = [
                (g, inst)
                for g, live in sorted(node.existing.items())
                for inst in live
                if (g, inst.profile_id, inst.start, False, False) in key[4]
                and (
                    self.reconfigure_foreign_instances
                    or (node.name, g, inst.profile_id, inst.start) in self._made
                )
            ]
            if not free:
                continue
            saved = set(node.destroying)
            node.set_destroying(saved | {(g, inst.profile_id, inst.start) for g, inst in free})
            try:
                options = options_on(node, node.group_key(), kind, want)
            finally:
                node.set_destroying(saved)
            before = fit_state(key)
            for option in options:
                needed = [
                    (g, inst)
                    for g, inst in free
                    if any(
                        node.shape.devices[d].gpu_index == g
                        and (node.shape.devices[d].kind == "gpu" or node.shape.devices[d].mask & inst.mask)
                        for d in option.devices
                    )
                ]
                loss = 0.0
                for i, lost in self._index.delta(before, option):
                    loss += weights[i] * lost
                rank = (
                    len(needed),
                    loss,
                    -option.quality,
                    option.mode_changes,
                    option.creates,
                    option.leaves,
                    key,
                    option.devices,
                )
                choice = Choice(key, node, option, rank[1:], loss)
                if ranked is not None:
                    ranked.append(choice)
                if best is None or rank < best[0]:
                    best = (rank, choice, needed)
        return None if best is None else (best[1], best[2])

    def _commit(
        self,
        claim: Claim,
        resolved: ResolvedClaim,
        node: NodeState,
        solution: Solution,
        notes: list[str],
        *,
        why: Explanation | None = None,
        destroy: list[PartitionPlan] | None = None,
    ) -> Allocated:
        shape = node.shape
        devices: list[AllocatedDevice] = []
        partitions: list[PartitionPlan] = list(destroy or ())
        taken: list[int] = []
        made: list[tuple[str, int, int, int]] = []
        for alt, choice in solution.picks:
            for d in choice:
                device = node.devices[d]
                devices.append(
                    AllocatedDevice(
                        request=alt.result_name,
                        driver=self.driver,
                        pool=node.pool,
                        device=device.name,
                        gpu_index=device.gpu_index,
                        gpu_uuid=device.gpu_uuid,
                        profile=device.profile,
                        profile_id=device.profile_id,
                        placement=device.placement,
                        admin_access=alt.admin,
                    )
                )
                if alt.admin:
                    continue
                taken.append(d)
                if device.placement is None and node.mig_enabled(device.gpu_index):
                    partitions.append(_disable_mig_plan(node, device.gpu_index, device.gpu_uuid))
                if (
                    device.placement is not None
                    and device.profile is not None
                    and device.profile_id is not None
                    and node.instance_for(shape.devices[d]) is None
                ):
                    partitions.append(_mig_plan(device))
                    made.append((node.name, device.gpu_index, device.profile_id, device.placement.start))
        decision = Allocated(
            claim_uid=claim.uid,
            node=node.name,
            devices=devices,
            partitions=partitions,
            config=list(resolved.config),
            set_score=solution.set_score,
            ideal_set_score=solution.ideal_set_score,
            best_available_set_score=solution.best_available_set_score,
            explanation=notes,
            why=why,
        )
        # State changes come last, after everything that could fail: a claim that fails to be
        # decided leaves the fleet as it found it.
        self._made.update(made)
        node.take(taken, claim.uid)
        self._reindex(node)
        self._held[claim.uid] = _Held(
            decision=decision, node=node.name, devices=tuple(shape.devices[d].name for d in taken)
        )
        self._held_on.setdefault(node.name, set()).add(claim.uid)
        return decision

    def adopt(self, decision: Allocated) -> None:
        """Take back a decision made earlier (read from the log), without deciding again.

        The allocator's state is a fold over its log: at start it re-adopts every allocation the
        log holds, so a restart never hands the same devices out twice. Devices the node no longer
        advertises are still recorded and are taken again when its inventory brings them back.
        """
        if decision.claim_uid in self._held:
            return
        taken = tuple(d.device for d in decision.devices if not d.admin_access)
        for device in decision.devices:
            if device.partition_command and device.placement is not None and device.profile_id is not None:
                self._made.add((decision.node, device.gpu_index, device.profile_id, device.placement.start))
        self._held[decision.claim_uid] = _Held(decision=decision, node=decision.node, devices=taken)
        self._held_on.setdefault(decision.node, set()).add(decision.claim_uid)
        node = self._nodes.get(decision.node)
        if node is not None:
            index = node.shape.index_by_name
            node.take([index[name] for name in taken if name in index], decision.claim_uid)
            self._unindexed.add(node.name)

    def adopt_prepared(self, claim_uid: str, node_name: str, devices: list[tuple[str, str]]) -> list[str]:
        """Hold the devices of a claim allocated outside the allocator (by kube-scheduler), learned
        when its node prepared it. `devices` are (request, device name) of the node's pool.

        Returns the names of devices another claim already held, which are left to that claim: two
        deciders gave them out at once, and counting them twice would corrupt the counters.
        """
        if claim_uid in self._held:
            return []
        node = self._nodes.get(node_name)
        allocated: list[AllocatedDevice] = []
        taken: list[str] = []
        conflicts: list[str] = []
        for request, name in devices:
            index = node.shape.index_by_name.get(name) if node is not None else None
            if node is None or index is None:
                # Not advertised now: recorded, and taken when the node's inventory brings it back.
                allocated.append(
                    AllocatedDevice(
                        request=request,
                        driver=self.driver,
                        pool=node_name,
                        device=name,
                        gpu_index=-1,
                        gpu_uuid="",
                    )
                )
                taken.append(name)
                continue
            if index in node.allocated and node.allocated[index] != claim_uid:
                conflicts.append(name)
                continue
            device = node.devices[index]
            allocated.append(
                AllocatedDevice(
                    request=request,
                    driver=self.driver,
                    pool=node.pool,
                    device=name,
                    gpu_index=device.gpu_index,
                    gpu_uuid=device.gpu_uuid,
                    profile=device.profile,
                    profile_id=device.profile_id,
                    placement=device.placement,
                )
            )
            taken.append(name)
        decision = Allocated(claim_uid=claim_uid, node=node_name, devices=allocated)
        self._held[claim_uid] = _Held(decision=decision, node=node_name, devices=tuple(taken))
        self._held_on.setdefault(node_name, set()).add(claim_uid)
        if node is not None:
            index_by_name = node.shape.index_by_name
            node.take([index_by_name[n] for n in taken if n in index_by_name], claim_uid)
            self._unindexed.add(node.name)
        return conflicts

    # --- reporting ------------------------------------------------------------------------------

    def metrics(self) -> FleetMetrics:
        gpus = free = partial = 0
        stranded = 0.0
        for node in self._nodes.values():
            for gpu in node.shape.gpus.values():
                gpus += 1
                if node.whole_free[gpu.index]:
                    free += 1
                    continue
                if not gpu.slices or (gpu.whole is not None and gpu.whole in node.allocated):
                    continue
                used = bin(node.occupied[gpu.index]).count("1")
                if 0 < used < gpu.slices:
                    partial += 1
                    stranded += (gpu.slices - used) / gpu.slices
        return FleetMetrics(
            nodes=len(self._nodes),
            gpus=gpus,
            free_gpus=free,
            partially_used_gpus=partial,
            stranded_gpus=round(stranded, 3),
            claims=len(self._held),
            allocated_devices=sum(len(n.allocated) for n in self._nodes.values()),
        )

    def snapshot(self) -> dict[str, Any]:
        """Every node's allocated devices and every claim's node, in a stable order."""
        return {
            "nodes": {
                name: {
                    "allocated": {
                        node.shape.devices[d].name: uid for d, uid in sorted(node.allocated.items())
                    },
                    "free_whole_gpus": node.bucket_key()[0],
                }
                for name, node in sorted(self._nodes.items())
            },
            "claims": {uid: held.node for uid, held in sorted(self._held.items())},
        }

    def node(self, name: str) -> NodeState | None:
        return self._nodes.get(name)

    @property
    def node_names(self) -> list[str]:
        return sorted(self._nodes)


def _keyed(prefix: tuple[int, ...], names: list[str]) -> Iterator[tuple[Any, ...]]:
    for name in names:
        yield (*prefix, name)


def _remove(names: list[str], name: str) -> None:
    position = bisect_left(names, name)
    if position < len(names) and names[position] == name:
        del names[position]


def _mig_plan(device: Device | AllocatedDevice, *, mig_uuid: str = "") -> PartitionPlan:
    """The MIG instance a device stands for: to create when allocated, to destroy when released."""
    assert device.profile is not None and device.profile_id is not None and device.placement is not None
    return PartitionPlan(
        gpu_index=device.gpu_index,
        gpu_uuid=device.gpu_uuid,
        profile=device.profile,
        profile_id=device.profile_id,
        placement=device.placement,
        mig_uuid=mig_uuid,
    )


def _destroy_plan(node: NodeState, gpu_index: int, inst: ExistingInstance) -> PartitionPlan:
    """A free instance destroyed so that the claim's devices fit where it was."""
    return PartitionPlan(
        gpu_index=gpu_index,
        gpu_uuid=node.gpu_uuid.get(gpu_index, ""),
        profile=inst.profile,
        profile_id=inst.profile_id,
        placement=MigPlacement(start=inst.start, size=inst.size),
        mig_uuid=inst.uuid,
        action="destroy",
    )


def _disable_mig_plan(node: NodeState, gpu_index: int, gpu_uuid: str) -> PartitionPlan:
    """A whole GPU handed out while still in MIG mode: the partitioner turns MIG off first."""
    slices = max(node.memory_slices(gpu_index), 1)
    return PartitionPlan(
        gpu_index=gpu_index,
        gpu_uuid=gpu_uuid,
        profile="",
        profile_id=-1,
        placement=MigPlacement(start=0, size=slices),
        action="disable-mig",
    )
