"""The live allocator keeps each decision the claim's own, through a real nats-server.

The same traces as tests/allocation/test_isolation.py, published as events: every plain claim must
get exactly what it gets when the hostile claims are absent (node, devices, configs, partition
commands), each hostile claim fails with its reason, nothing is dead-lettered, and the allocator
goes on deciding.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram.bus import Bus, BusConfig
from tangram.events import (
    DEADLETTER_STREAM,
    NODES_STREAM,
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    ClaimRequested,
    Event,
    NodeInventory,
    PartitionRequested,
    subject_token,
)
from tangram.events.codec import encode
from tangram.local.natsserver import NatsServer
from tests.allocation.machines import request
from tests.allocation.tenants import (
    CEL_RUNTIME_ERRORS,
    HOSTILE_CONFIGS,
    PLAIN,
    Step,
    fleet_nodes,
    hostile,
    hostile_specs,
    selector_claim,
    whole,
)
from tests.support.driver import DRIVER

from .helpers import allocator, decisions, log, log_until

# After the trace, a claim every run can place: once it is decided, everything before it was.
LAST = whole(99, 1)


class Outcome(msgspec.Struct, frozen=True):
    """What the live allocator made of one trace: per claim uid its decision (without what differs
    between runs: event ids, times, stream positions, command ids) and the partition commands."""

    decided: dict[str, tuple[Any, ...]]
    commands: list[tuple[Any, ...]]
    dead_letters: int


def _as_events(steps: Sequence[Step]) -> list[Event]:
    events: list[Event] = []
    names: dict[str, tuple[str, str]] = {}
    for step in [*steps, LAST]:
        if isinstance(step, str):
            namespace, name = names[step]
            events.append(ClaimReleased(key=step, namespace=namespace, name=name, uid=step))
            continue
        names[step.uid] = (step.namespace, step.name)
        events.append(
            ClaimRequested(
                key=step.uid, namespace=step.namespace, name=step.name, uid=step.uid, spec=step.spec
            )
        )
    return events


async def _publish(bus: Bus, event: Event) -> None:
    """Plain events as any client sends them; a hostile claim as its bytes, whatever its spec holds
    (numbers past 64 bits, NaN, a spec that is not an object): what a peer can put on the wire."""
    if isinstance(event, ClaimRequested) and event.uid.startswith("hostile-"):
        wire = json.loads(encode(msgspec.structs.replace(event, spec={})))
        wire["spec"] = event.spec
        await bus.jetstream.publish(
            event.subject,
            json.dumps(wire).encode(),
            stream=event.stream,
            headers={"Nats-Msg-Id": event.event_id},
        )
    else:
        await bus.publish(event)


def _decision(event: Event) -> tuple[Any, ...]:
    if isinstance(event, ClaimAllocated):
        devices = tuple(msgspec.to_builtins(d) for d in event.devices)
        return ("allocated", event.node, devices, len(event.partitions), msgspec.to_builtins(event.config))
    assert isinstance(event, ClaimFailed)
    return ("failed", event.cause, event.reason)


async def decide_live(steps: Sequence[Step]) -> Outcome:
    """A fresh nats-server and allocator for one trace, the fleet's inventories published first."""
    events = _as_events(steps)
    with tempfile.TemporaryDirectory(prefix="tangram-nats-") as store, NatsServer(Path(store)) as server:
        bus = await Bus.connect(
            BusConfig(servers=(server.url,), name="test", producer="test", publish_retry_s=20.0), wait_s=30
        )
        try:
            await bus.ensure_streams()
            for hw in fleet_nodes():
                await bus.publish(NodeInventory(key=subject_token(hw.node), hardware=hw))
            async with allocator(bus, server.url):
                for event in events:
                    await _publish(bus, event)
                # claims are decided in the order they were sent
                decided = decisions(
                    await log_until(bus, lambda e: any(d.uid == LAST.uid for d in decisions(e)))  # type: ignore[attr-defined]
                )
            commands = [e for e in await log(bus, NODES_STREAM) if isinstance(e, PartitionRequested)]
            letters = await log(bus, DEADLETTER_STREAM)
        finally:
            await bus.close()
    return Outcome(
        decided={e.uid: _decision(e) for e in decided},  # type: ignore[attr-defined]
        commands=[
            (c.node, c.action, c.gpu_uuid, c.profile, msgspec.to_builtins(c.placement), c.claim_uid)
            for c in commands
        ],
        dead_letters=len(letters),
    )


def plain_part(outcome: Outcome) -> tuple[dict[str, tuple[Any, ...]], list[tuple[Any, ...]]]:
    decided = {uid: d for uid, d in outcome.decided.items() if not uid.startswith("hostile-")}
    commands = [c for c in outcome.commands if not c[-1].startswith("hostile-")]
    return decided, commands


_baseline: list[Outcome] = []


async def baseline() -> Outcome:
    """The plain trace alone, decided live once per test session."""
    if not _baseline:
        _baseline.append(await decide_live(PLAIN))
    return _baseline[0]


def interleave(plain: Sequence[Step], hostile_claims: Sequence[Step], every: int) -> list[Step]:
    """`every` hostile claims before each plain step, the rest after the trace."""
    mixed: list[Step] = []
    queue = list(hostile_claims)
    for step in plain:
        mixed.extend(queue[:every])
        del queue[:every]
        mixed.append(step)
    return [*mixed, *queue]


def every_hostile_kind() -> list[Step]:
    """Each CEL run-time error kind against whole GPUs and MIG instances, each hostile opaque
    config, and counts no node has."""
    claims: list[Step] = []
    for kind in sorted(CEL_RUNTIME_ERRORS):
        for device_class in ("gpu.tangram.dev", "mig.gpu.tangram.dev"):
            claims.append(selector_claim(len(claims), CEL_RUNTIME_ERRORS[kind], device_class))
    for config in HOSTILE_CONFIGS:
        spec = {
            "devices": {
                "requests": [request(count=2)],
                "config": [{"requests": ["gpus"], "opaque": {"driver": DRIVER, "parameters": config}}],
            }
        }
        claims.append(hostile(len(claims), spec))
    for count in (9, 16, 32):
        claims.append(hostile(len(claims), {"devices": {"requests": [request(count=count)]}}))
    return claims


async def test_the_live_baseline_places_claims_on_several_nodes_with_partitions() -> None:
    """The comparison below is not vacuous: the plain trace allocates, cuts MIG, and releases."""
    outcome = await baseline()
    allocated = [d for d in outcome.decided.values() if d[0] == "allocated"]
    assert len(allocated) == 11  # ten plain claims and the last one
    assert len({d[1] for d in allocated}) >= 3
    assert {c[1] for c in outcome.commands} >= {"create", "destroy"}
    assert outcome.dead_letters == 0


@pytest.mark.timeout(300)
async def test_every_hostile_kind_interleaved_changes_no_plain_decision_live() -> None:
    hostile_claims = every_hostile_kind()
    assert len(hostile_claims) == 2 * len(CEL_RUNTIME_ERRORS) + len(HOSTILE_CONFIGS) + 3
    outcome = await decide_live(interleave(PLAIN, hostile_claims, every=2))
    assert plain_part(outcome) == plain_part(await baseline())
    causes = {uid: d[1] for uid, d in outcome.decided.items() if uid.startswith("hostile-")}
    assert len(causes) == len(hostile_claims)
    assert set(causes.values()) == {"claim", "hardware"}, causes
    selector_failures = [
        d[2] for uid, d in outcome.decided.items() if uid.startswith("hostile-") and "selector" in d[2]
    ]
    assert len(selector_failures) == 2 * len(CEL_RUNTIME_ERRORS)
    assert all("CEL runtime error" in reason for reason in selector_failures)
    assert outcome.dead_letters == 0


# Each example runs a nats-server and an allocator: few examples, each a whole live trace.
@pytest.mark.timeout(600)
@settings(max_examples=6, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(st.integers(0, len(PLAIN)), hostile_specs), min_size=1, max_size=8))
async def test_generated_hostile_claims_change_no_plain_decision_live(
    inserted: list[tuple[int, Any]],
) -> None:
    mixed: list[Step] = list(PLAIN)
    for n, (position, spec) in enumerate(inserted):
        mixed.insert(min(position, len(mixed)), hostile(n, spec))
    outcome = await decide_live(mixed)
    assert plain_part(outcome) == plain_part(await baseline())
    # each hostile claim fails as the claim's or the hardware's fault, or, when its event is not a
    # claim at all (a spec that is not an object), is set aside as a dead letter
    failed = [
        outcome.decided[f"hostile-{n}"] for n in range(len(inserted)) if f"hostile-{n}" in outcome.decided
    ]
    assert all(d[:2] in (("failed", "claim"), ("failed", "hardware")) for d in failed), failed
    assert len(failed) + outcome.dead_letters == len(inserted)
    assert outcome.dead_letters == sum(not isinstance(spec, dict) for _, spec in inserted)
