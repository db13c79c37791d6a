"""What the claim bridge has seen of the cluster: DeviceClasses, ResourceClaims, and which kinds it
has listed at least once (the pods are kept by `services.allocator.gates.PodGates`).

Shared by the bridge's parts: the bridge's listings and watches fill it, the others read it (and
the claim writer keeps the claim it wrote).
"""

from __future__ import annotations

from typing import Any

Key = tuple[str, str]  # (namespace, name)
KINDS = frozenset({"classes", "claims", "pods"})
# A write against an object someone changed meanwhile is read again and retried this many times.
WRITE_TRIES = 8


def key_of(obj: dict[str, Any]) -> Key:
    metadata = obj.get("metadata") or {}
    return (str(metadata.get("namespace", "")), str(metadata.get("name", "")))


def uid_of(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def older(obj: dict[str, Any], than: dict[str, Any]) -> bool:
    """Whether `obj` is an older version of the same object than `than`: a watch event can reach
    the bridge after the claim writer kept the newer claim its own write returned. The API server's
    resourceVersions come from etcd's revision, which only grows; one that is not a number is
    never judged older."""
    if uid_of(obj) != uid_of(than):
        return False
    mine = str((obj.get("metadata") or {}).get("resourceVersion", ""))
    kept = str((than.get("metadata") or {}).get("resourceVersion", ""))
    return mine.isdigit() and kept.isdigit() and int(mine) < int(kept)


class ClusterView:
    def __init__(self) -> None:
        self.classes: dict[str, dict[str, Any]] = {}
        self.claims: dict[Key, dict[str, Any]] = {}
        self.listed: set[str] = set()

    def ready(self) -> bool:
        """Every kind listed once: what one listing found may depend on another's, so nothing is
        judged before."""
        return self.listed >= KINDS
