"""Claim uids and device names Tangram accepts: one rule for the allocator and the node.

They become file names (CDI specs, checkpoints) and CDI device ids on the node, so the allocator
refuses a claim the node would refuse: otherwise its devices are held for a claim that can never
be prepared.
"""

from __future__ import annotations

import re

from tangram.kubernetes.objects.limits import DNS_LABEL

# RFC 4122 textual form, as Kubernetes writes metadata.uid.
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


class InvalidName(ValueError):
    """A claim uid, device name or CDI kind that Tangram refuses to use."""


def validate_claim_uid(uid: str) -> str:
    """Return `uid` if it is a UUID or a DNS label (what local-mode claim ids look like)."""
    if not isinstance(uid, str) or not uid:
        raise InvalidName("claim uid is empty")
    if _UUID.fullmatch(uid) or DNS_LABEL.fullmatch(uid):
        return uid
    shown = uid if len(uid) <= 80 else uid[:80] + "..."
    raise InvalidName(
        f"claim uid {shown!r} is neither an RFC 4122 UUID nor a DNS label of at most 63 characters "
        "(no '/', '..', NUL, upper case or spaces allowed)"
    )


def validate_device_name(name: str) -> str:
    """A ResourceSlice device name (DNS label) that becomes part of a CDI device name."""
    if not isinstance(name, str) or not DNS_LABEL.fullmatch(name):
        raise InvalidName(f"device name {name!r} is not a DNS label")
    return name


# The scheduling gate that holds a pod using Tangram's claims until the allocator has written their
# allocation: added at admission, removed by the allocator (or after its timeout, to let
# kube-scheduler decide instead).
SCHEDULING_GATE = "gpu.tangram.dev/allocation"
