"""What must hold after any fault, judged from the logs and from what the nodes show. No I/O.

Each check returns problems as lines a person can act on; the caller counts them by kind.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tangram.events import (
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    ClaimRequested,
    DeadLetter,
    Event,
    EventDecodeError,
    PartitionApplied,
    PartitionFailed,
    PartitionRequested,
    decode,
)


def overlapping_allocations(log: Iterable[Event]) -> list[str]:
    """Replays the claim log: every memory slice (or whole GPU) held by at most one live claim, or
    only by shares of one share host (several claims may hold shares of one device, never of a
    device that overlaps another claim's)."""
    # (node, GPU) -> claim uid -> (slices, the share host it holds a share of, or None)
    held: dict[tuple[str, int], dict[str, tuple[set[int], str | None]]] = defaultdict(dict)
    deleted: set[str] = set()
    problems = []
    for event in log:
        match event:
            case ClaimAllocated() if event.uid not in deleted:
                # (a decision after the claim's deletion was made before the allocator read it,
                # and holds nothing: it frees the claim as it reads the deletion)
                for device in event.devices:
                    if device.admin_access:
                        continue
                    key = (event.node, device.gpu_index)
                    slices = (
                        set(range(8))
                        if device.placement is None
                        else set(
                            range(device.placement.start, device.placement.start + device.placement.size)
                        )
                    )
                    host = device.device if device.share is not None else None
                    for other, (taken, other_host) in held[key].items():
                        if other == event.uid or not taken & slices:
                            continue
                        if host is not None and host == other_host:
                            continue
                        problems.append(
                            f"{event.uid} and {other} both hold GPU {key} slices {taken & slices}"
                        )
                    before = held[key].get(event.uid, (set(), host))[0]
                    held[key][event.uid] = (before | slices, host)
            case ClaimReleased() | ClaimFailed():
                if isinstance(event, ClaimReleased) and event.deleted:
                    deleted.add(event.uid)
                for owners in held.values():
                    owners.pop(event.uid, None)
            case _:
                pass
    return problems


@dataclass
class ClaimStory:
    """One claim as the log and the driver saw it."""

    requested: int = 0
    allocated: list[ClaimAllocated] = field(default_factory=list)
    failed: list[ClaimFailed] = field(default_factory=list)
    released: bool = False
    released_before_requested: bool = False


def claim_stories(log: Iterable[Event]) -> dict[str, ClaimStory]:
    stories: dict[str, ClaimStory] = defaultdict(ClaimStory)
    for event in log:
        match event:
            case ClaimRequested(uid=uid):
                stories[uid].requested += 1
            case ClaimAllocated(uid=uid):
                stories[uid].allocated.append(event)
            case ClaimFailed(uid=uid):
                stories[uid].failed.append(event)
            case ClaimReleased(uid=uid):
                story = stories[uid]
                story.released_before_requested = story.released_before_requested or not story.requested
                story.released = True
            case _:
                pass
    return dict(stories)


def settle_claims(
    stories: Mapping[str, ClaimStory], *, driven: Iterable[str], prepared: set[str], held: set[str]
) -> tuple[Counter[str], dict[str, list[str]]]:
    """Each driven claim's outcome, and what is wrong with any that did not settle.

    A claim ends allocated and prepared (still held), released, or failed with a reason; a claim
    released before it was requested is never decided. An allocated claim must never fail later
    (no failure in these runs is anything but transient), and no claim is decided twice.
    """
    outcomes: Counter[str] = Counter()
    problems: dict[str, list[str]] = defaultdict(list)
    for uid in driven:
        story = stories.get(uid, ClaimStory())
        decisions = len({e.event_id for e in story.allocated}) + len({e.event_id for e in story.failed})
        if story.released_before_requested:
            outcomes["released_before_requested"] += 1
            if story.allocated or story.failed:
                problems["decided_after_release"].append(f"{uid}: decided although released first")
            continue
        if not story.requested:
            problems["request_lost"].append(f"{uid}: its request is not in the log")
            continue
        if story.allocated and story.failed:
            outcomes["failed_after_allocation"] += 1
            problems["allocated_claim_failed"].append(f"{uid}: {story.failed[-1].reason}")
            continue
        if decisions > 1:
            problems["decided_twice"].append(f"{uid}: {decisions} decisions")
        if story.failed:
            outcomes["failed"] += 1
            if not story.failed[0].reason.strip():
                problems["failed_without_reason"].append(uid)
        elif story.allocated:
            if uid not in prepared:
                problems["allocated_not_prepared"].append(f"{uid} on {story.allocated[0].node}")
            if uid in held:
                outcomes["allocated_prepared_held"] += 1
            elif story.released:
                outcomes["released"] += 1
            else:
                problems["claim_unsettled"].append(f"{uid}: allocated, neither held nor released")
        else:
            problems["claim_undecided"].append(uid)
    return outcomes, dict(problems)


def live_claims(stories: Mapping[str, ClaimStory]) -> dict[str, ClaimAllocated]:
    """Claims allocated and neither released nor failed: what may hold devices now."""
    return {
        uid: story.allocated[0]
        for uid, story in stories.items()
        if story.allocated and not story.released and not story.failed
    }


def unanswered_commands(node_log: Iterable[Event], refused: Iterable[str] = ()) -> list[str]:
    """Partition commands without a result; `refused`: event ids of commands dead-lettered
    (a command for another node is refused that way, never answered)."""
    skip = set(refused)
    commands: dict[str, PartitionRequested] = {}
    answered: set[str] = set()
    for event in node_log:
        if isinstance(event, PartitionRequested) and event.event_id not in skip:
            commands.setdefault(event.command_id, event)
        elif isinstance(event, PartitionApplied | PartitionFailed):
            answered.add(event.command_id)
    return [
        f"{c.action} {c.command_id} on {c.node} (claim {c.claim_uid})"
        for command_id, c in commands.items()
        if command_id not in answered
    ]


def leaked_instances(
    present: Mapping[str, set[str]],
    before: Mapping[str, set[str]],
    node_log: Iterable[Event],
    live: Mapping[str, ClaimAllocated],
    *,
    warm: Mapping[str, set[str]],
    reused: Mapping[str, set[str]],
) -> tuple[list[str], list[str]]:
    """(instances no live claim or warm pool accounts for, live claims' instances that are gone).

    `present`/`before`/`warm`: MIG device UUIDs per node now, before the run, kept warm;
    `reused`: per node, the instances live claims were given without a create (found in place).
    """
    made_for: dict[str, tuple[str, str]] = {}  # create command id -> (node, MIG UUID)
    for event in node_log:
        if isinstance(event, PartitionApplied) and event.action == "create":
            made_for[event.command_id] = (event.node, event.mig_uuid)
    owned: dict[str, set[str]] = defaultdict(set)
    missing: list[str] = []
    for uid, allocation in live.items():
        for command_id in allocation.partitions:
            made = made_for.get(command_id)
            if made is None:
                continue
            node, mig_uuid = made
            owned[node].add(mig_uuid)
            if mig_uuid and mig_uuid not in present.get(node, set()):
                missing.append(f"{mig_uuid} of live claim {uid} on {node} is gone")
    leaked = [
        f"{mig_uuid} on {node}"
        for node, uuids in sorted(present.items())
        for mig_uuid in sorted(uuids)
        if mig_uuid not in before.get(node, set())
        and mig_uuid not in owned[node]
        and mig_uuid not in warm.get(node, set())
        and mig_uuid not in reused.get(node, set())
    ]
    return leaked, missing


def dead_lettered_ids(letters: Iterable[Event]) -> set[str]:
    """Event ids of the dead letters' original messages, where those decode."""
    ids = set()
    for letter in letters:
        if isinstance(letter, DeadLetter):
            try:
                ids.add(decode(letter.data).event_id)
            except EventDecodeError:
                continue
    return ids


def undead_lettered(injected: Mapping[tuple[str, int], str], letters: Iterable[Event]) -> list[str]:
    """Injected messages (stream, sequence) -> what they were, that no dead letter names."""
    lettered = {(e.original_stream, e.original_sequence) for e in letters if isinstance(e, DeadLetter)}
    return [
        f"{what} ({stream} #{seq})"
        for (stream, seq), what in injected.items()
        if (stream, seq) not in lettered
    ]


def state_differences(live: Mapping[str, Any], replayed: Mapping[str, Any]) -> list[str]:
    """Where the allocator's live state and the replay of its log disagree, key by key."""
    problems = []
    for key in sorted(set(live) | set(replayed)):
        mine, theirs = live.get(key), replayed.get(key)
        if mine == theirs:
            continue
        if isinstance(mine, dict) and isinstance(theirs, dict):
            for sub in sorted(set(mine) | set(theirs)):
                if mine.get(sub) != theirs.get(sub):
                    problems.append(f"{key}[{sub}]: live {mine.get(sub)!r}, replayed {theirs.get(sub)!r}")
        else:
            problems.append(f"{key}: live {mine!r}, replayed {theirs!r}")
    return problems
