"""The fault kinds of a chaos run and their seeded order. No I/O."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Literal

FaultKind = Literal[
    "kill-service",  # kill -9 of a random Tangram service, then restart it
    "kill-nats",  # kill -9 of one NATS server (never a quorum), then restart it
    "duplicate",  # an event stored again: with its own Msg-Id (de-duplicated) and as a redelivery
    "reorder",  # a claim's release published before its request
    "malformed",  # bytes that are no event, and an event missing a field
    "forged",  # a command for one node sent to another; a result for a command never issued
    "delay-results",  # a partitioner frozen (SIGSTOP) for a while: its results come late
]

FAULT_KINDS: tuple[FaultKind, ...] = (
    "kill-service",
    "kill-nats",
    "duplicate",
    "reorder",
    "malformed",
    "forged",
    "delay-results",
)


def fault_order(rng: random.Random) -> Iterator[FaultKind]:
    """Every kind once per round, each round in a seeded order: a run of at least one round has
    injected every kind, and the same seed gives the same order."""
    while True:
        kinds = list(FAULT_KINDS)
        rng.shuffle(kinds)
        yield from kinds
