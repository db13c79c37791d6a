"""What the claim bridge has seen of the cluster: DeviceClasses, ResourceClaims, and which kinds it
has listed at least once (the pods are kept by `services.allocator.gates.PodGates`).

Shared by the bridge's parts: the bridge's listings and watches fill it, the others read it (and
the claim writer keeps the claim it wrote).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Any

from tangram.kubernetes.objects.claimbridge import DeviceKey, allocation_of, held_devices

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


class ClaimsSeen(MutableMapping[Key, dict[str, Any]]):
    """The claims as last seen, by (namespace, name), and which of them hold each allocated device:
    a decision's devices are checked against the claims that hold them, not against every claim
    (at thousands of claims, walking them all for each write cost more than the rest of the write)."""

    def __init__(self, claims: Mapping[Key, dict[str, Any]] | None = None) -> None:
        self._by_key: dict[Key, dict[str, Any]] = {}
        self._holders: dict[DeviceKey, set[Key]] = {}
        for key, claim in (claims or {}).items():
            self[key] = claim

    def __getitem__(self, key: Key) -> dict[str, Any]:
        return self._by_key[key]

    def __setitem__(self, key: Key, claim: dict[str, Any]) -> None:
        self._unindex(key)
        self._by_key[key] = claim
        allocation = allocation_of(claim)
        for device in held_devices(allocation) if allocation is not None else ():
            self._holders.setdefault(device, set()).add(key)

    def __delitem__(self, key: Key) -> None:
        self._unindex(key)
        del self._by_key[key]

    def __iter__(self) -> Iterator[Key]:
        return iter(self._by_key)

    def __len__(self) -> int:
        return len(self._by_key)

    def holding(self, devices: Iterable[DeviceKey]) -> list[dict[str, Any]]:
        """The claims whose allocation holds one of `devices`, in a fixed order."""
        keys: set[Key] = set()
        for device in devices:
            keys |= self._holders.get(device, set())
        return [self._by_key[key] for key in sorted(keys)]

    def _unindex(self, key: Key) -> None:
        before = self._by_key.get(key)
        allocation = allocation_of(before) if before is not None else None
        for device in held_devices(allocation) if allocation is not None else ():
            holders = self._holders.get(device)
            if holders is not None:
                holders.discard(key)
                if not holders:
                    del self._holders[device]


class ClusterView:
    def __init__(self) -> None:
        self.classes: dict[str, dict[str, Any]] = {}
        self._claims = ClaimsSeen()
        self.listed: set[str] = set()

    @property
    def claims(self) -> ClaimsSeen:
        return self._claims

    @claims.setter
    def claims(self, claims: Mapping[Key, dict[str, Any]]) -> None:
        self._claims = claims if isinstance(claims, ClaimsSeen) else ClaimsSeen(claims)

    def ready(self) -> bool:
        """Every kind listed once: what one listing found may depend on another's, so nothing is
        judged before."""
        return self.listed >= KINDS
