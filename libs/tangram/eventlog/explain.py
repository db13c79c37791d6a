"""Why a claim got what it got: its requests as understood, each candidate node, the devices, the steps.

Pure: built from a log by replaying it up to the claim's request and deciding that request again
with the engine's explanation on. Reasons come from the engine itself, the same text the allocator
put in ClaimFailed, so what a person reads here matches the Kubernetes Events word for word.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec

from tangram import DRIVER_NAME
from tangram.allocation import Allocated, Claim, Decision, DeviceClass, Policy, parse_claim_spec
from tangram.allocation.ledger import Ledger
from tangram.allocation.requests import ClaimError, ResolvedClaim, resolve
from tangram.eventlog.records import EventLog
from tangram.eventlog.replay import Outcome, Stored, ordered, replay
from tangram.events import ClaimRequested, PartitionApplied, PartitionFailed
from tangram.fleetview import FleetView


class ClaimNotInLog(LookupError):
    """No request for that claim in the log."""


class Step(msgspec.Struct, frozen=True, kw_only=True):
    step: str  # requested | decided | partition applied | prepared | released
    at: datetime
    after_ms: float  # since the request


class Command(msgspec.Struct, frozen=True, kw_only=True):
    command_id: str
    action: str
    node: str
    gpu_index: int
    profile: str
    start: int
    size: int
    result: str  # applied | failed | pending
    reason: str = ""
    duration_ms: float | None = None
    mig_uuid: str = ""


class Explanation(msgspec.Struct, kw_only=True):
    claim: str
    uid: str
    understood: dict[str, Any]  # requests, constraints, topology as the engine resolved them
    recorded: Outcome
    recomputed: Outcome
    # The engine's own explanation, as it serialises it: per candidate node, why it was rejected
    # or how it scored (with the demand-weighted loss where the engine computes one).
    candidates: Any
    scores: dict[str, Any]  # the chosen set's scores, when allocated
    devices: list[dict[str, Any]]
    commands: list[Command]
    steps: list[Step]
    losses: list[Any] = []  # every loss figure found in the engine's explanation, for the summary


def explain(
    log: EventLog, claim_key: str, classes: Mapping[str, DeviceClass], policy: Policy = "tangram"
) -> Explanation:
    events = ordered(log)
    requests = [
        s for s in events.events if isinstance(s.event, ClaimRequested) and _key(s.event) == claim_key
    ]
    if not requests:
        raise ClaimNotInLog(f"no claim {claim_key} in the log (expected NAMESPACE/NAME of a requested claim)")
    target = requests[-1].event
    assert isinstance(target, ClaimRequested)
    decided: list[Decision] = []

    def capture(ledger: Ledger, stored: Stored) -> None:
        event = stored.event
        if stored.record is requests[-1].record and isinstance(event, ClaimRequested) and not decided:
            claim = Claim(namespace=event.namespace, name=event.name, uid=event.uid, spec=event.spec)
            # Committed into the fleet like the ledger's own decision: the ledger then publishes
            # this same decision, so the replay goes on unchanged.
            decided.append(
                ledger.fleet.allocate(claim, ledger.classes_for(event), ledger.policy, explain=True)
            )

    report = replay(log, classes, policy, before_decision=capture)
    view = FleetView()
    for stored in events.events:
        view.apply(stored.event)
    claim_view = view.claims[target.uid]
    recorded = events.decision_of(target.uid, target.attempt)
    decision = decided[0] if decided else None
    divergence = next((d for d in report.divergences if d.uid == target.uid), None)
    recomputed = divergence.recomputed if divergence else Outcome.of(recorded.event if recorded else None)
    candidates = msgspec.to_builtins(decision.explanation) if decision is not None else []
    commands = []
    for command in view.commands.values():
        if command.claim_uid != target.uid or command.action == "destroy":
            continue
        result = view.results.get(command.command_id)
        commands.append(
            Command(
                command_id=command.command_id,
                action=command.action,
                node=command.node,
                gpu_index=command.gpu_index,
                profile=command.profile,
                start=command.placement.start,
                size=command.placement.size,
                result="applied"
                if isinstance(result, PartitionApplied)
                else "failed"
                if isinstance(result, PartitionFailed)
                else "pending",
                reason=result.reason if isinstance(result, PartitionFailed) else "",
                duration_ms=result.duration_ms if isinstance(result, PartitionApplied) else None,
                mig_uuid=result.mig_uuid if isinstance(result, PartitionApplied) else "",
            )
        )
    scores: dict[str, Any] = {}
    if isinstance(decision, Allocated):
        scores = {
            "set_score": decision.set_score,
            "ideal_set_score": decision.ideal_set_score,
            "best_available_set_score": decision.best_available_set_score,
        }
    return Explanation(
        claim=claim_key,
        uid=target.uid,
        understood=understood(target.spec, classes),
        recorded=Outcome.of(recorded.event if recorded else None),
        recomputed=recomputed,
        candidates=candidates,
        scores=scores,
        devices=[msgspec.to_builtins(d) for d in claim_view.devices],
        commands=sorted(commands, key=lambda c: (c.gpu_index, c.start)),
        steps=_steps(claim_view.requested_at or target.time, claim_view),
        losses=losses_in(candidates),
    )


def understood(spec: dict[str, Any], classes: Mapping[str, DeviceClass]) -> dict[str, Any]:
    """The claim as the engine resolved it, or the error that made it fail (ClaimFailed's words)."""
    try:
        resolved = resolve(parse_claim_spec(spec), classes, DRIVER_NAME)
    except ValueError as error:
        return {"error": f"invalid claim: {error}"}
    except ClaimError as error:
        return {"error": str(error)}
    return _resolved(resolved)


def _resolved(claim: ResolvedClaim) -> dict[str, Any]:
    def scope(requests: frozenset[str] | None) -> list[str] | str:
        return sorted(requests) if requests is not None else "all requests"

    return {
        "requests": [
            {
                "name": request.name,
                "alternatives": [
                    {
                        "name": alt.result_name,
                        "device_class": alt.class_name,
                        "count": "all" if alt.all_mode else alt.count,
                        "selectors": [f"{where}: {selector.expression}" for where, selector in alt.selectors],
                        "admin_access": alt.admin,
                        "capacity": dict(alt.capacity),
                    }
                    for alt in request.alternatives
                ],
            }
            for request in claim.requests
        ],
        "constraints": [
            {
                "requests": scope(c.requests),
                ("matchAttribute" if c.match else "distinctAttribute"): c.attribute,
            }
            for c in claim.constraints
        ],
        "topology": [
            {
                "requests": scope(t.requests),
                "interconnect": "NVLink" if t.nvlink else "Any",
                "min_pair_bandwidth_gbps": t.min_bandwidth_gbps,
            }
            for t in claim.topology
        ],
        "placement": "Spread" if claim.spread else "Pack",
    }


def _steps(start: datetime, claim: Any) -> list[Step]:
    named = [
        ("requested", claim.requested_at),
        ("decided", claim.decided_at),
        ("partition applied", claim.partition_applied_at),
        ("prepared", claim.prepared_at),
        ("released", claim.released_at),
    ]
    return [
        Step(step=name, at=at, after_ms=round((at - start).total_seconds() * 1000, 2))
        for name, at in named
        if at is not None
    ]


def losses_in(value: Any) -> list[Any]:
    """Values under any key naming a loss, anywhere in the explanation, in order."""
    found: list[Any] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if "loss" in str(key).lower() and not isinstance(item, dict | list):
                found.append(item)
            else:
                found.extend(losses_in(item))
    elif isinstance(value, list):
        for item in value:
            found.extend(losses_in(item))
    return found


def _key(event: ClaimRequested) -> str:
    return f"{event.namespace}/{event.name}"
