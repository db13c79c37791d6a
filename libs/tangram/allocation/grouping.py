"""The ledger's groups of pods (pure): a group's claims decided together once every pod's are
asked, the room kept for the first group to wait, and the IMEX channels of NVLink domains.

`Ledger` folds them in with the rest of its state; they live here so that the fold reads as one
thing, and what groups add to it as another (as `reserving` does for preemption).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from tangram.allocation.fleet import FleetState
from tangram.allocation.gangs import GangPlaced, domain_troubles, node_clique, nodes_to_hold, place_gang
from tangram.allocation.model import Allocated, Claim, Failed, Policy
from tangram.allocation.preemption import plan_gang_preemption
from tangram.allocation.reserving import GangHold, Reservation
from tangram.allocation.spec import DeviceClass
from tangram.dra.imex import ImexChannel, free_channel, imex_config, imex_of
from tangram.events import ClaimFailed, ClaimPreempting, ClaimRequested, Event, FailureCause, PreemptionVictim
from tangram.events.ids import derived_id


def claim_of(request: ClaimRequested) -> Claim:
    return Claim(namespace=request.namespace, name=request.name, uid=request.uid, spec=request.spec)


class Grouping:
    """What the ledger's groups read and keep; `Ledger` holds each of these as a field."""

    fleet: FleetState
    policy: Policy
    producer: str
    positions: dict[str, int]
    decided: dict[str, str]
    attempts: dict[str, int]
    released: set[str]
    outside: dict[str, str]
    priorities: dict[str, int]
    gangs: dict[tuple[str, str], dict[str, ClaimRequested]]
    domains: dict[str, ImexChannel]
    _domain_members: dict[str, set[str]]
    gang_holds: dict[tuple[str, str], GangHold]
    reservations: dict[str, Reservation]

    def classes_for(self, request: ClaimRequested) -> Mapping[str, DeviceClass]:
        raise NotImplementedError

    def _fenced_for(self, request: ClaimRequested) -> set[str]:
        raise NotImplementedError

    def _companions(self) -> dict[str, tuple[str, ...]]:
        raise NotImplementedError

    def _may_be_lower(self, priority: int) -> bool:
        raise NotImplementedError

    def _claim_name(self, uid: str) -> str:
        raise NotImplementedError

    def victim(self, uid: str) -> PreemptionVictim:
        raise NotImplementedError

    def _allocated(
        self,
        request: ClaimRequested,
        decision: Allocated,
        *,
        adopt: bool,
        classes: Mapping[str, DeviceClass],
    ) -> list[Event]:
        raise NotImplementedError

    def _decide_in_gang(self, request: ClaimRequested) -> list[Event]:
        """A claim of a group of pods: the group's open claims are decided together once every pod
        of the group has its claims asked; until then the claim waits, holding nothing."""
        gang = request.gang
        assert gang is not None
        self.attempts[request.uid] = request.attempt
        if gang.problem:
            self.decided[request.uid] = "failed"
            return [self._gang_failure(request, request, f"invalid group of pods: {gang.problem}", "claim")]
        if gang.size <= 0:
            self.decided[request.uid] = "failed"
            reason = (
                f"group {gang.group}: its PodGroup is not known yet; the claim waits for it, holding nothing"
            )
            return [self._gang_failure(request, request, reason, "gang")]
        members = self._gang_members(request.namespace, gang.group)
        pods: dict[str, set[str]] = {}
        wanted: dict[str, int] = {}
        for uid, member in members.items():
            assert member.gang is not None
            pods.setdefault(member.gang.pod, set()).add(uid)
            wanted[member.gang.pod] = max(wanted.get(member.gang.pod, 0), member.gang.pod_claims)
        # the latest request counts its pod's claims as they are now (a claim from a template made
        # since, or found not Tangram's)
        wanted[gang.pod] = gang.pod_claims
        claims_missing = sum(max(0, wanted[pod] - len(uids)) for pod, uids in pods.items())
        if len(pods) < gang.size or claims_missing:
            self.decided[request.uid] = "failed"
            reason = (
                f"group {gang.group}: {len(pods)} of its {gang.size} pods have all their claims asked"
                + (f" ({claims_missing} claims of those pods not yet)" if claims_missing else "")
                + "; its claims are allocated together once every pod's are, and hold nothing till then"
            )
            return [self._gang_failure(request, request, reason, "gang")]
        open_requests = sorted(
            (m for uid, m in members.items() if self.decided.get(uid) != "allocated"),
            key=lambda m: (m.gang.pod if m.gang else "", m.name, m.uid),
        )
        held_cliques = {
            node_clique(self.fleet, held.node)
            for uid in members
            if self.decided.get(uid) == "allocated" and (held := self.fleet.allocation(uid)) is not None
        }
        classes: dict[str, DeviceClass] = {}
        for member in open_requests:
            classes.update(self.classes_for(member))
        for member in open_requests:
            self.attempts[member.uid] = max(self.attempts.get(member.uid, 0), member.attempt)
        domain = f"{request.namespace}/{gang.group}"
        fenced = self._fenced_for(request)
        if gang.nvlink_domain:
            # a node serves one NVLink domain at a time: its IMEX daemon's nodes config is one list
            fenced |= {n for other, channel in self.domains.items() if other != domain for n in channel.nodes}
        claims = [claim_of(m) for m in open_requests]
        placed: GangPlaced | Failed = place_gang(
            self.fleet,
            claims,
            classes,
            self.policy,
            group=gang.group,
            nvlink_domain=gang.nvlink_domain,
            fenced=fenced,
            within=next(iter(held_cliques)) if gang.nvlink_domain and len(held_cliques) == 1 else None,
        )
        if isinstance(placed, GangPlaced) and gang.nvlink_domain:
            placed = self._with_channel(domain, placed, open_requests[0].uid)
        outputs: list[Event] = []
        if isinstance(placed, GangPlaced):
            self.gang_holds.pop((request.namespace, gang.group), None)
            for member, decision in zip(open_requests, placed.decisions, strict=True):
                outputs += self._allocated(member, decision, adopt=True, classes=classes)
            return outputs
        own = (request.namespace, gang.group)
        preempting: list[Event] = []
        reason = placed.reason
        kept: list[str] = []
        if placed.cause == "capacity":
            preempting, reason, kept = self._preempt_for_group(
                request, open_requests, classes, claims=claims, fenced=fenced, failed=placed
            )
        first_in_line = not any(
            key != own and hold.priority >= request.priority for key, hold in self.gang_holds.items()
        )
        # one group at a time is kept room for (the first to wait, per priority): room kept for every
        # waiting group would fence most of the fleet, and nothing else could run meanwhile
        if placed.cause == "capacity" and first_in_line and not kept:
            kept = nodes_to_hold(
                self.fleet,
                claims,
                classes,
                self.policy,
                nvlink_domain=gang.nvlink_domain,
                fenced=fenced,
            )
            if kept:
                self.gang_holds[(request.namespace, gang.group)] = GangHold(
                    nodes=frozenset(kept), priority=request.priority
                )
        reason += f"; nodes {', '.join(kept)} are kept for it meanwhile" if kept else ""
        outputs += preempting
        for member, claim in zip(open_requests, claims, strict=True):
            self.decided[member.uid] = "failed"
            if placed.cause == "capacity":
                # counted in the demand mix as a replay of the failure counts it
                self.fleet.note_demand(claim, classes)
            failure = self._gang_failure(member, request, reason, placed.cause)
            standing = self.reservations.get(member.uid)
            outputs.append(
                msgspec.structs.replace(
                    failure, held_for_group=kept, reserved_node=standing.node if standing is not None else ""
                )
            )
        return outputs

    def _preempt_for_group(
        self,
        request: ClaimRequested,
        members: list[ClaimRequested],
        classes: Mapping[str, DeviceClass],
        *,
        claims: list[Claim],
        fenced: set[str],
        failed: Failed,
    ) -> tuple[list[Event], str, list[str]]:
        """A group that did not fit for want of capacity: the preemption under way for it, or the
        one planned now, as (its events, the reason its claims wait, the nodes kept for it); no
        events and no nodes when it may preempt nobody.

        As for a claim alone (`Reserving._preempt`), a preemption is planned once and the group
        waits while any victim still holds its devices. Each victim's node is reserved for the
        member placed there, and every node of the placement is kept for the group, so no claim of
        its priority or lower takes what the group waits for."""
        gang = request.gang
        assert gang is not None
        own = (request.namespace, gang.group)
        uids = [m.uid for m in members]
        protected = {p for m in members for p in m.protected}
        standing = {uid: r for uid in uids if (r := self.reservations.get(uid)) is not None}
        if standing:
            holding = sorted(
                {v for r in standing.values() for v in r.victims if self.fleet.allocation(v) is not None}
            )
            hold = self.gang_holds.get(own)
            if holding and not set(holding) & protected and hold is not None:
                count = f"{len(holding)} claim{'s' if len(holding) != 1 else ''}"
                named = ", ".join(self._claim_name(v) for v in holding)
                why = f"{failed.reason}; preempting {count} of lower priority ({named}): "
                why += "waits for their devices"
                return [], why, sorted(hold.nodes)
            for uid in standing:
                del self.reservations[uid]
        priority = min(m.priority for m in members)
        if any(m.preemption_policy == "Never" for m in members) or not self._may_be_lower(priority):
            return [], failed.reason, []
        plan = plan_gang_preemption(
            self.fleet,
            claims,
            classes,
            self.policy,
            nvlink_domain=gang.nvlink_domain,
            priority=priority,
            priorities=self.priorities,
            protected=protected,
            fenced=fenced | {r.node for uid, r in self.reservations.items() if uid not in uids},
            companions=self._companions(),
        )
        if plan is None:
            return [], failed.reason, []
        placed_on = {d.node: m for m, d in reversed(list(zip(members, plan.decisions, strict=True)))}
        by_node: dict[str, list[str]] = {}
        for victim in plan.victims:
            held = self.fleet.allocation(victim)
            node = held.node if held is not None and held.node in placed_on else ""
            by_node.setdefault(node, []).append(victim)
        # a victim of no node of the placement (a claim of a preempted group, elsewhere) is named
        # with the first node's victims
        elsewhere = by_node.pop("", [])
        nodes = sorted(by_node) or plan.nodes[:1]
        by_node.setdefault(nodes[0], []).extend(elsewhere)
        events: list[Event] = []
        for node in nodes:
            member = placed_on[node]
            victims = by_node[node]
            self.reservations[member.uid] = Reservation(node=node, priority=priority, victims=tuple(victims))
            events.append(
                ClaimPreempting(
                    key=member.key,
                    event_id=derived_id(member.uid, "preempting", "gang", request.uid, request.attempt),
                    producer=self.producer,
                    namespace=member.namespace,
                    name=member.name,
                    uid=member.uid,
                    node=node,
                    priority=priority,
                    victims=[self.victim(v) for v in victims],
                    reason=failed.reason,
                    positions=dict(self.positions),
                    attempt=member.attempt,
                )
            )
        self.gang_holds[own] = GangHold(nodes=frozenset(plan.nodes), priority=priority)
        count = f"{len(plan.victims)} claim{'s' if len(plan.victims) != 1 else ''}"
        named = ", ".join(
            f"{self._claim_name(v)} (priority {self.priorities.get(v, 0)})" for v in plan.victims
        )
        why = f"{failed.reason}; preempting {count} of lower priority on nodes {', '.join(nodes)}: {named}"
        return events, why, plan.nodes

    def _with_channel(self, domain: str, placed: GangPlaced, first: str) -> GangPlaced | Failed:
        """The group's decisions, each carrying the domain's IMEX channel: the one the domain holds
        already (a member placed again joins it), else the lowest free in the clique."""
        assert placed.clique is not None
        held = self.domains.get(domain)
        nodes = set(placed.nodes) | set(held.nodes if held is not None else ())
        channel = (
            held.channel
            if held is not None
            else free_channel(c.channel for c in self.domains.values() if c.clique == placed.clique)
        )
        if channel is None:
            return Failed(
                claim_uid=first,
                reason=f"group {domain}: every IMEX channel of clique {placed.clique} is taken",
                cause="capacity",
            )
        entry = imex_config(
            ImexChannel(domain=domain, clique=placed.clique, channel=channel, nodes=tuple(sorted(nodes))),
            self.fleet.driver,
        )
        return GangPlaced(
            decisions=tuple(msgspec.structs.replace(d, config=[*d.config, entry]) for d in placed.decisions),
            clique=placed.clique,
        )

    def domain_troubles(self) -> dict[tuple[str, str], str]:
        """(domain, node) -> what went wrong on that node of a live NVLink domain (`gangs`)."""
        return domain_troubles(
            self.fleet,
            {domain: (c.clique, c.nodes) for domain, c in self.domains.items()},
            self._domain_members,
        )

    def domain_members(self, domain: str) -> list[str]:
        """The claims holding the domain, in a fixed order."""
        return sorted(self._domain_members.get(domain, ()))

    def _join_domain(self, uid: str, config: list[dict[str, Any]]) -> None:
        try:
            channel = imex_of(config, self.fleet.driver)
        except ValueError:
            return  # written by this allocator: a config it cannot read back is none of its own
        if channel is None:
            return
        self.domains[channel.domain] = channel
        self._domain_members.setdefault(channel.domain, set()).add(uid)

    def _leave_domain(self, uid: str) -> None:
        for domain, members in list(self._domain_members.items()):
            if uid in members:
                members.discard(uid)
                if not members:
                    del self._domain_members[domain]
                    self.domains.pop(domain, None)

    def _gang_members(self, namespace: str, group: str) -> dict[str, ClaimRequested]:
        """The group's claims still to be placed or held: released ones are gone from it."""
        members = self.gangs.get((namespace, group), {})
        return {uid: m for uid, m in members.items() if uid not in self.released and uid not in self.outside}

    def _leave_gang(self, uid: str) -> None:
        for key, members in list(self.gangs.items()):
            if members.pop(uid, None) is not None and not members:
                del self.gangs[key]
                self.gang_holds.pop(key, None)

    def _gang_of(self, uid: str) -> tuple[str, str] | None:
        return next((key for key, members in self.gangs.items() if uid in members), None)

    def _hold(self, uid: str, nodes: list[str]) -> None:
        """A group's failure read from the log keeps its clique, as the live decision did."""
        key = self._gang_of(uid)
        if key is not None:
            self.gang_holds[key] = GangHold(nodes=frozenset(nodes), priority=self.priorities.get(uid, 0))

    def _drop_hold(self, uid: str) -> None:
        key = self._gang_of(uid)
        if key is not None:
            self.gang_holds.pop(key, None)

    def _gang_failure(
        self, member: ClaimRequested, trigger: ClaimRequested, reason: str, cause: FailureCause
    ) -> ClaimFailed:
        """The member's failure in the group decision `trigger`'s request made (each decision of a
        group is another event, whichever member's request made it)."""
        return ClaimFailed(
            key=member.key,
            event_id=derived_id(member.uid, "failed", "gang", trigger.uid, trigger.attempt),
            producer=self.producer,
            namespace=member.namespace,
            name=member.name,
            uid=member.uid,
            reason=reason,
            positions=dict(self.positions),
            attempt=member.attempt,
            cause=cause,
        )
