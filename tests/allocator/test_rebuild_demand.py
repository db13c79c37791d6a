"""A rebuilt allocator weighs placements by the same demand mix and decides as the one that died."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import msgspec

from tangram.allocation import FleetState
from tangram.allocation.ledger import Ledger
from tangram.events import ClaimAllocated, ClaimFailed, ClaimReleased, Event

from .helpers import CLASSES, gpus, inventory, member, mig, request

INVENTORIES = [
    inventory("hgx-h200", "n-hgx"),
    inventory("h100-nvl-4x2", "n-nvl"),
    inventory("l40s-8", "n-l40s"),
]
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
SPECS = [gpus(1), gpus(2), gpus(4), gpus(8), mig("1g.18gb"), mig("2g.35gb"), mig("3g.71gb"), mig("1g.12gb")]


def trace(seed: int, claims: int) -> list[Event]:
    """Requests and releases: each claim leaves after a random number of later arrivals."""
    rng = random.Random(seed)
    events: list[Event] = []
    due: dict[int, list[int]] = {}
    for n in range(claims):
        for gone in due.pop(n, []):
            uid = f"00000000-0000-4000-8000-{gone:012d}"
            events.append(ClaimReleased(key=uid, namespace="team", name=f"claim-{gone}", uid=uid))
        events.append(request(n, rng.choices(SPECS, weights=(6, 3, 2, 1, 8, 4, 3, 2))[0]))
        due.setdefault(n + rng.randint(3, 25), []).append(n)
    return events


def untimed(events: list[Event]) -> list[Event]:
    """Events without their publication time, the one field that is not a decision."""
    return [msgspec.structs.replace(e, time=EPOCH) for e in events]


def live_ledger() -> Ledger:
    book = Ledger(fleet=FleetState(), classes=CLASSES)
    for event in INVENTORIES:
        book.apply(event, live=False)
    return book


def test_rebuilt_from_the_log_mid_trace_the_allocator_makes_the_remaining_decisions_alike() -> None:
    events = trace(7, 160)
    middle = len(events) // 2
    live = live_ledger()
    log: list[Event] = []  # what the claims stream holds: requests, releases and the decisions
    for event in events[:middle]:
        log.append(event)
        log.extend(e for e in live.apply(event) if isinstance(e, ClaimAllocated | ClaimFailed))
    rebuilt = live_ledger()
    for event in log:
        rebuilt.apply(event, live=False)
    assert rebuilt.fleet.snapshot() == live.fleet.snapshot()
    for event in events[middle:]:
        assert untimed(rebuilt.apply(event)) == untimed(live.apply(event))


def test_a_rebuild_that_skipped_the_demand_mix_would_decide_differently() -> None:
    # The check above is only worth something if the mix changes decisions: fold the same log
    # without its requests (so no demand is noted) and the remaining decisions differ.
    events = trace(7, 160)
    middle = len(events) // 2
    live = live_ledger()
    log: list[Event] = []
    for event in events[:middle]:
        log.append(event)
        log.extend(e for e in live.apply(event) if isinstance(e, ClaimAllocated | ClaimFailed))
    forgetful = live_ledger()
    for event in log:
        if isinstance(event, ClaimAllocated | ClaimFailed | ClaimReleased):
            forgetful.apply(event, live=False)
    assert forgetful.fleet.snapshot() == live.fleet.snapshot()
    differ = 0
    for event in events[middle:]:
        differ += untimed(forgetful.apply(event)) != untimed(live.apply(event))
    assert differ > 0


HOSTILE = [
    # a selector that fails at run time, a count no node has, an opaque config that does not parse
    {
        "devices": {
            "requests": [
                {
                    "name": "gpus",
                    "exactly": {
                        "deviceClassName": "gpu.tangram.dev",
                        "selectors": [
                            {"cel": {"expression": 'device.attributes["gpu.tangram.dev"].index / 0 == 1'}}
                        ],
                    },
                }
            ]
        }
    },
    gpus(9),
    {
        **gpus(2),
        "devices": {
            **gpus(2)["devices"],
            "config": [
                {
                    "opaque": {
                        "driver": "gpu.tangram.dev",
                        "parameters": {
                            "apiVersion": "gpu.tangram.dev/v1alpha1",
                            "kind": "TopologyConfig",
                            "interconnect": "warp",
                        },
                    }
                }
            ],
        },
    },
]


def test_a_rebuild_counts_no_hostile_claim_in_the_demand_mix_as_the_live_fold_did_not() -> None:
    """Hostile claims fail live without entering the mix; a rebuild reads their failures (with
    the cause) and leaves them out too, so the rebuilt allocator decides what comes next alike."""
    events = trace(11, 120)
    for n, at in enumerate(range(5, len(events), 9)):
        events.insert(at, request(1000 + n, HOSTILE[n % len(HOSTILE)], namespace="tenant"))
    middle = len(events) // 2
    live = live_ledger()
    log: list[Event] = []
    causes: set[str] = set()
    for event in events[:middle]:
        log.append(event)
        decided = [e for e in live.apply(event) if isinstance(e, ClaimAllocated | ClaimFailed)]
        causes |= {e.cause for e in decided if isinstance(e, ClaimFailed) and e.namespace == "tenant"}
        log.extend(decided)
    assert causes == {"claim", "hardware"}
    rebuilt = live_ledger()
    for event in log:
        rebuilt.apply(event, live=False)
    assert rebuilt.fleet.snapshot() == live.fleet.snapshot()
    weights = [(k.order, live.fleet._index.demand.weight(k.key)) for k in live.fleet._index.tracked]
    assert [
        (k.order, rebuilt.fleet._index.demand.weight(k.key)) for k in rebuilt.fleet._index.tracked
    ] == weights
    for event in events[middle:]:
        assert untimed(rebuilt.apply(event)) == untimed(live.apply(event))


def test_a_rebuild_counts_a_group_member_that_waited_for_its_group_as_the_live_fold_did() -> None:
    """The first claim of a group of pods fails while it waits for the others, which says nothing
    about demand; it is allocated, and counted in the mix, when the last member's request places
    the whole group. The rebuild reads that allocation with no request of the claim after its
    failure: it must still count the claim then, or it weighs the next placements differently."""
    live = live_ledger()
    log: list[Event] = []
    for event in [request(1, mig("1g.18gb")), member(2, "group", 2), member(3, "group", 2)]:
        log.append(event)
        log.extend(e for e in live.apply(event) if isinstance(e, ClaimAllocated | ClaimFailed))
    waited = [e for e in log if isinstance(e, ClaimFailed)]
    assert [(e.uid, e.cause) for e in waited] == [(member(2, "group", 2).uid, "gang")]
    rebuilt = live_ledger()
    for event in log:
        rebuilt.apply(event, live=False)
    weights = [(k.order, live.fleet._index.demand.weight(k.key)) for k in live.fleet._index.tracked]
    assert [
        (k.order, rebuilt.fleet._index.demand.weight(k.key)) for k in rebuilt.fleet._index.tracked
    ] == weights
    # counted short, the rebuild put the two whole GPUs on another node than the live fold did
    for event in [request(4, mig("1g.18gb")), request(5, gpus(2))]:
        assert untimed(rebuilt.apply(event)) == untimed(live.apply(event))
