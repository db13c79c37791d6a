"""The allocator's state of the whole fleet and its decisions: pure, deterministic, no I/O.

Nodes are indexed by shape and by (free whole GPUs, longest free MIG slice run), so a claim looks
at the few nodes that can possibly fit it, in policy order, never at every device of the fleet.

FleetState is the public face; the work is done by its parts: the node index (nodeindex), the
claims' holds (holdings), the search for a claim's node (search), the decision committed and its
MIG plans (plans), and the holding of decisions made elsewhere (adoption).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from tangram import DRIVER_NAME
from tangram.allocation import adoption
from tangram.allocation.demand import ClaimKind, counts_as_demand
from tangram.allocation.eligibility import NodeEligibility
from tangram.allocation.holdings import Holdings
from tangram.allocation.model import (
    Allocated,
    Claim,
    Decision,
    Failed,
    FleetMetrics,
    PartitionPlan,
    Policy,
    Release,
    internal_failure,
)
from tangram.allocation.node import NodeState
from tangram.allocation.nodeindex import BucketKey, NodeIndex
from tangram.allocation.placement import DemandIndex
from tangram.allocation.plans import mig_plan
from tangram.allocation.requests import ClaimError
from tangram.allocation.resolutions import Resolutions
from tangram.allocation.search import EXPLAINED_CANDIDATES, TANGRAM_NODES_COMPARED, Search
from tangram.allocation.shape import NodeShape, shape_signature
from tangram.allocation.sharing import place_share, share_requests
from tangram.allocation.solver import solve
from tangram.allocation.spec import DeviceClass
from tangram.allocation.templates import DeviceTemplates
from tangram.dra.model import NodeDevices
from tangram.events.catalogue import AllocatedDevice, DeviceShare
from tangram.events.inventory import NodeHardware
from tangram.kubernetes.objects.names import InvalidName, validate_claim_uid

__all__ = [
    "DESTROYED_REMEMBERED",
    "EXPLAINED_CANDIDATES",
    "TANGRAM_NODES_COMPARED",
    "BucketKey",
    "FleetState",
]

# MIG instances destroyed that a node's late inventories are checked against, per node.
DESTROYED_REMEMBERED = 4096


class FleetState:
    """`reconfigure_foreign_instances`: free MIG instances that Tangram did not create (made by hand
    or by another tool before Tangram ran) may be destroyed to make room for a claim. Off by
    default: only instances Tangram created itself are reconfigured."""

    def __init__(
        self,
        *,
        driver: str = DRIVER_NAME,
        reconfigure_foreign_instances: bool = False,
        _shared: FleetState | None = None,
    ) -> None:
        self.driver = driver
        self.reconfigure_foreign_instances = reconfigure_foreign_instances
        # A trial fleet reads the shapes, device templates and eligibility its fleet computed:
        # the same hardware gives the same answers, and a trial must cost a decision, not a rebuild.
        self._shapes: dict[str, NodeShape] = {} if _shared is None else _shared._shapes
        self._templates: DeviceTemplates = DeviceTemplates(driver) if _shared is None else _shared._templates
        self._eligibility: NodeEligibility = (
            NodeEligibility(driver) if _shared is None else _shared._eligibility
        )
        self._index = DemandIndex(self._shapes, self._eligibility.on)
        self._nodes = NodeIndex(self._index)
        self._holdings = Holdings()
        self._resolutions: Resolutions = Resolutions(driver) if _shared is None else _shared._resolutions
        self._noted: set[str] = set()  # claims counted in the demand mix
        self._last_note: tuple[str, Callable[[], None]] | None = None  # what uncount() undoes
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
        for uid in self._holdings.on(hw.node):
            held = self._holdings.held[uid]
            node.take_held(uid, held.decision.devices, held.devices)
        self._nodes.put(node, old)

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

    def trial(self, node_name: str, *, without: Iterable[str] = ()) -> FleetState | None:
        """A fleet of the one node as it would be once the claims `without` were released and
        their MIG instances destroyed: what preempting them would leave there. For asking whether a
        claim would fit then and how; nothing decided in it is ever held in this fleet.

        The released claims' instances stay on the node, free and Tangram's: a claim in the trial
        reuses them or has them reconfigured, as it could once they are destroyed."""
        if self._nodes.get(node_name) is None:
            return None
        return self.trial_of([node_name], without=without)

    def trial_of(self, node_names: Iterable[str], *, without: Iterable[str] = ()) -> FleetState:
        """A fleet of these nodes (those the fleet knows) as they are, less the claims `without`:
        claims decided in it are held there alone, so several can be tried together and dropped."""
        trial = FleetState(
            driver=self.driver, reconfigure_foreign_instances=self.reconfigure_foreign_instances, _shared=self
        )
        names = {name for name in node_names if self._nodes.get(name) is not None}
        gone = set(without)
        for name in sorted(names):
            node = self._nodes.get(name)
            assert node is not None
            devices = NodeDevices(
                node=node.name,
                driver=node.driver,
                pool=node.pool,
                devices=list(node.devices),
                counter_sets=[],
            )
            copy = NodeState(node.hw, devices, node.shape, generation=node.generation)
            # as the node is now: less the instances destroyed since its inventory was read
            copy.existing = {g: list(live) for g, live in node.existing.items()}
            copy.set_destroying(node.destroying)
            trial._nodes.put(copy, None)
        trial._holdings.made = {made for made in self._holdings.made if made[0] in names}
        for name in sorted(names):
            for uid in self._holdings.on(name):
                if uid not in gone:
                    adoption.adopt(trial._nodes, trial._holdings, self._holdings.held[uid].decision)
        return trial

    def decide_on(
        self, node_name: str, claim: Claim, classes: Mapping[str, DeviceClass], policy: Policy = "tangram"
    ) -> Decision | None:
        """The claim decided on one node alone (the node a preemption reserved for it), nothing
        held yet: the caller adopts the decision it carries out. None when the node is gone."""
        trial = self.trial(node_name)
        return None if trial is None else trial.allocate(claim, classes, policy)

    def remove_node(self, name: str) -> list[str]:
        """Forget the node; returns the uids of claims allocated there (their records stay)."""
        if self._nodes.remove(name) is None:
            return []
        return self._holdings.on(name)

    # --- decisions ------------------------------------------------------------------------------

    def allocate(
        self,
        claim: Claim,
        classes: Mapping[str, DeviceClass],
        policy: Policy = "tangram",
        *,
        explain: bool = False,
        fenced: Iterable[str] = (),
    ) -> Decision:
        """Decide the claim; nodes `fenced` (reserved for another claim) are left out of it."""
        removed = [node for node in (self._nodes.remove(name) for name in sorted(fenced)) if node is not None]
        try:
            return self._allocate(claim, classes, policy, explain=explain)
        finally:
            for node in removed:
                self._nodes.put(node, None)

    def _allocate(
        self,
        claim: Claim,
        classes: Mapping[str, DeviceClass],
        policy: Policy,
        *,
        explain: bool,
    ) -> Decision:
        held = self._holdings.get(claim.uid)
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
            resolution = self._resolutions.resolve(claim.spec, classes)
        except ValueError as error:
            return Failed(claim_uid=claim.uid, reason=f"invalid claim: {error}", cause="claim")
        except ClaimError as error:
            return Failed(claim_uid=claim.uid, reason=str(error), cause="claim")
        try:
            resolved = resolution.claim
            shares = share_requests(resolved, self._nodes.by_name.values(), self._eligibility)
            if shares:
                # Shares are not in the demand mix: they take no exclusive capacity's kind.
                return place_share(
                    claim,
                    resolved,
                    policy,
                    driver=self.driver,
                    nodes=self._nodes,
                    eligibility=self._eligibility,
                    holdings=self._holdings,
                    explain=explain,
                )
        except ClaimError as error:
            return Failed(claim_uid=claim.uid, reason=str(error), cause="claim")
        except Exception as error:
            return Failed(claim_uid=claim.uid, reason=internal_failure(error), cause="internal")
        # The claim's own kind counts while it is placed; taken back out, exactly, when the
        # decision shows the claim says nothing about demand.
        kind = resolution.kind
        undo = self._note(claim.uid, kind)
        decision: Decision
        try:
            decision = self._search().place(claim, resolved, policy, explain, kind)
        except ClaimError as error:
            decision = Failed(claim_uid=claim.uid, reason=str(error), cause="claim")
        except Exception as error:
            # Nothing is held before commit's last steps, so the fleet is as it was: the claim
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

    def forget(self, claim_uid: str) -> None:
        """The claim is gone for good (deleted, and not held): it is no longer remembered as
        counted in the demand mix, which only keeps a claim asked again from counting twice."""
        self._noted.discard(claim_uid)

    def note_demand(self, claim: Claim, classes: Mapping[str, DeviceClass]) -> None:
        """Count a claim read from the log in the demand mix, as allocate() did when it was live.

        The mix is part of the allocator's fold: a rebuild notes each claim at its decision, in
        log order, so the rebuilt allocator weighs placements exactly as the one that died.
        """
        if claim.uid in self._noted:
            return
        try:
            resolution = self._resolutions.resolve(claim.spec, classes)
            if share_requests(resolution.claim, self._nodes.by_name.values(), self._eligibility):
                return
        except (ValueError, ClaimError):
            return
        self._note(claim.uid, resolution.kind)

    def _note(self, uid: str, kind: ClaimKind | None) -> Callable[[], None] | None:
        """Count the claim's kind in the demand mix unless it was before; what undoes it."""
        if uid in self._noted:
            return None
        self._noted.add(uid)
        return None if kind is None else self._index.note(kind)

    def _search(self) -> Search:
        """The search for this decision, over the fleet's state as it is now. The solver is looked up
        at each decision: `solve` of this module is the one the fleet decides with."""
        return Search(
            driver=self.driver,
            nodes=self._nodes,
            demand=self._index,
            eligibility=self._eligibility,
            holdings=self._holdings,
            reconfigure_foreign_instances=self.reconfigure_foreign_instances,
            solve=solve,
        )

    def release(self, claim_uid: str, *, destroy_mig: bool = True) -> Release:
        """Free the claim's devices; with destroy_mig, its MIG instances are returned for destruction."""
        held = self._holdings.drop(claim_uid)
        if held is None:
            return Release(claim_uid=claim_uid)
        node = self._nodes.get(held.node)
        destroy: list[PartitionPlan] = []
        taken = [d for d in held.decision.devices if not d.admin_access]
        # a share host still carrying other claims' shares keeps its instance
        freed = node.give_back_held(claim_uid, held.devices) if node is not None else None
        if destroy_mig:
            for device in taken:
                if device.placement is None or device.profile is None or device.profile_id is None:
                    continue
                if device.share is not None and freed is not None and device.device not in freed:
                    continue
                mig_uuid = ""
                if node is not None and device.device in node.shape.index_by_name:
                    inst = node.instance_for(node.shape.devices[node.shape.index_by_name[device.device]])
                    mig_uuid = inst.uuid if inst is not None else ""
                    node.mark_destroying(device.gpu_index, device.profile_id, device.placement.start)
                destroy.append(mig_plan(device, mig_uuid=mig_uuid))
        if node is not None:
            adoption.hand_over(self._nodes, self._holdings, node.name, driver=self.driver)
            self._nodes.reindex(node)
        return Release(
            claim_uid=claim_uid, node=held.node, devices=list(held.decision.devices), destroy=destroy
        )

    def release_replayed(self, claim_uid: str) -> Release:
        """Apply a release read from the log: release()'s change of state, and the same destroy plans.

        A rebuild frees the devices and marks the claim's MIG placements as being destroyed. The
        plans are returned without the instance UUIDs the inventory showed then: the caller names
        the instance from the claim's own create, should the destroys have to be sent again.
        """
        held = self._holdings.drop(claim_uid)
        if held is None:
            return Release(claim_uid=claim_uid)
        node = self._nodes.get(held.node)
        destroy: list[PartitionPlan] = []
        if node is not None:
            index = node.shape.index_by_name
            freed = node.give_back_held(claim_uid, held.devices)
            for device in held.decision.devices:
                if (
                    device.admin_access
                    or device.placement is None
                    or device.profile is None
                    or device.profile_id is None
                    or device.device not in index
                    or (device.share is not None and device.device not in freed)
                ):
                    continue
                node.mark_destroying(device.gpu_index, device.profile_id, device.placement.start)
                destroy.append(mig_plan(device))
            adoption.hand_over(self._nodes, self._holdings, node.name, driver=self.driver)
            self._nodes.changed(node.name)
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
        self._nodes.changed(node_name)

    def destroy_refused(self, node_name: str, gpu_uuid: str, start: int) -> None:
        """The node refused to destroy an instance: it is no longer counted as on its way out, so
        its slices are not handed out again while it is still there. Something outside Tangram
        holds it (processes still run on it), so it is no longer Tangram's to reconfigure either."""
        node = self._nodes.get(node_name)
        if node is None:
            return
        node.keep(gpu_uuid, start)
        self._holdings.made = {
            made
            for made in self._holdings.made
            if not (made[0] == node_name and node.gpu_uuid.get(made[1]) == gpu_uuid and made[3] == start)
        }
        self._nodes.changed(node_name)

    def holders(self, node_name: str) -> list[str]:
        """The uids of the claims held on the node, in order."""
        return self._holdings.on(node_name)

    def allocation(self, claim_uid: str) -> Allocated | None:
        held = self._holdings.get(claim_uid)
        return held.decision if held else None

    def holds_on_a_node(self, claim_uid: str) -> bool:
        """The claim holds devices on a node of the fleet (not only on one not seen yet, or gone)."""
        held = self._holdings.get(claim_uid)
        return held is not None and held.node in self._nodes.by_name

    def name_devices(self, claim_uid: str, devices: list[AllocatedDevice]) -> None:
        """Name the held claim's devices as its allocation does (with their partition commands)."""
        self._holdings.name_devices(claim_uid, devices)

    # --- adoption -------------------------------------------------------------------------------

    def adopt(self, decision: Allocated) -> None:
        """Take back a decision made earlier (read from the log), without deciding again.

        The allocator's state is a fold over its log: at start it re-adopts every allocation the
        log holds, so a restart never hands the same devices out twice. Devices the node no longer
        advertises are still recorded and are taken again when its inventory brings them back.
        """
        adoption.adopt(self._nodes, self._holdings, decision)

    def adopt_prepared(
        self,
        claim_uid: str,
        node_name: str,
        devices: list[tuple[str, str]],
        shares: Mapping[str, DeviceShare] | None = None,
    ) -> list[str]:
        """Hold the devices of a claim allocated outside the allocator (by kube-scheduler), learned
        when its node prepared it. `devices` are (request, device name) of the node's pool.

        Returns the names of devices another claim already held, which are left to that claim: two
        deciders gave them out at once, and counting them twice would corrupt the counters.
        """
        return adoption.adopt_prepared(
            self._nodes, self._holdings, claim_uid, node_name, devices, driver=self.driver, shares=shares
        )

    # --- reporting ------------------------------------------------------------------------------

    def metrics(self) -> FleetMetrics:
        gpus = free = partial = 0
        stranded = 0.0
        for node in self._nodes.by_name.values():
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
            nodes=len(self._nodes.by_name),
            gpus=gpus,
            free_gpus=free,
            partially_used_gpus=partial,
            stranded_gpus=round(stranded, 3),
            claims=len(self._holdings.held),
            allocated_devices=sum(len(n.allocated) for n in self._nodes.by_name.values()),
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
                for name, node in sorted(self._nodes.by_name.items())
            },
            "claims": {uid: held.node for uid, held in sorted(self._holdings.held.items())},
        }

    def node(self, name: str) -> NodeState | None:
        return self._nodes.get(name)

    @property
    def node_names(self) -> list[str]:
        return sorted(self._nodes.by_name)
