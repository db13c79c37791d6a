"""Ids derived from what they name, so that a retried or repeated publication is the same message.

A partition command's id depends only on the claim, the MIG slot it acts on and how many attempts
at that slot were closed (`attempts.SlotAttempts`): whichever path sends it (the allocator after
its decision, or the node preparing the claim), and however often, the partitioner runs it once and
JetStream stores it once.
"""

from __future__ import annotations

import uuid

_IDS = uuid.UUID("6d1f6a0e-2b8c-4e59-9a51-7b3f0c2d9e11")


def derived_id(*parts: object) -> str:
    return uuid.uuid5(_IDS, "/".join(str(p) for p in parts)).hex


def numbered_id(*parts: object, attempt: int) -> str:
    """The id of what `parts` name at `attempt`: attempt 0 keeps the id it had before attempts were
    counted, so that what was published then is still de-duplicated against."""
    return derived_id(*parts, attempt) if attempt else derived_id(*parts)


def partition_command_id(
    claim_uid: str, action: str, *, gpu_index: int, profile_id: int, start: int, attempt: int = 0
) -> str:
    """The command that creates, destroys or (disable-mig: profile -1, start 0) frees one slot for a
    claim. `attempt` counts the node's earlier creates of that slot for the claim that failed or were
    destroyed, so that preparing the claim again makes a new instance instead of finding the old
    command already answered."""
    return numbered_id(claim_uid, action, gpu_index, profile_id, start, attempt=attempt)


def command_event_id(command_id: str) -> str:
    """The Nats-Msg-Id of a partition command."""
    return derived_id(command_id, "command")
