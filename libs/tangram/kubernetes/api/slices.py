"""Keep the API server's ResourceSlices of one node's pool equal to the rendered ones.

The pool is found by field selector (`spec.nodeName`, `spec.driver`), so slices left behind by an
older layout or an older run are found and deleted too. Whenever anything in the pool changes,
every slice is written with one new pool generation: the scheduler only trusts the slices of the
newest generation, so a slice left at an older one would hide its devices. Each slice carries a
hash of its spec without the generation, which tells "same content" apart without comparing
against whatever defaults the API server filled in.

Slices are owned by their Node (so they go when the Node goes) and watched: a slice of the pool
deleted, added or edited by anyone else is put back within the time one watch event takes. The
publisher remembers the resourceVersion of every slice it wrote, so an edit that leaves the
hash annotation alone is still seen as someone else's.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

from tangram.kubernetes.api.client import KubeApiError, call
from tangram.kubernetes.api.watching import list_then_watch

log = logging.getLogger("tangram.kubernetes.api.slices")

SPEC_HASH_ANNOTATION = "gpu.tangram.dev/spec-hash"
FIELD_MANAGER = "tangram-discovery"


class SliceInputError(ValueError):
    """Slices handed to the publisher that are not this node's pool; the message says which and why."""


@dataclass(frozen=True, kw_only=True)
class SyncReport:
    """What one sync did. `error` is set when it stopped early; the next sync picks up from there."""

    created: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    conflicts: int = 0  # replace attempts refused because someone else wrote first
    generation: int | None = None  # the pool generation on the server after the sync
    error: str | None = None
    retry_in_s: float | None = None  # with an error: when `retry_if_due` will try again

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class _Progress:
    created: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    conflicts: int = 0
    generation: int | None = None

    def report(self, error: str | None = None, retry_in_s: float | None = None) -> SyncReport:
        return SyncReport(
            created=tuple(self.created),
            replaced=tuple(self.replaced),
            deleted=tuple(self.deleted),
            unchanged=tuple(self.unchanged),
            conflicts=self.conflicts,
            generation=self.generation,
            error=error,
            retry_in_s=retry_in_s,
        )


@dataclass(frozen=True)
class _Stored:
    """The little the publisher needs to know about a slice on the server."""

    name: str
    resource_version: str
    spec_hash: str | None
    generation: int
    labels: dict[str, str]
    annotations: dict[str, str]
    owners: tuple[str, ...]  # uids of the owner references


def spec_hash(resource_slice: dict[str, Any]) -> str:
    """A hash of the slice's spec with the pool generation left out."""
    spec = copy.deepcopy(resource_slice["spec"])
    spec.get("pool", {}).pop("generation", None)
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _stored(item: Any) -> _Stored:
    annotations = item.metadata.annotations or {}
    return _Stored(
        name=item.metadata.name,
        resource_version=item.metadata.resource_version,
        spec_hash=annotations.get(SPEC_HASH_ANNOTATION),
        generation=int(item.spec.pool.generation),
        labels=dict(item.metadata.labels or {}),
        annotations=dict(annotations),
        owners=tuple(ref.uid for ref in item.metadata.owner_references or ()),
    )


class SlicePublisher:
    """Publishes one node's pool of ResourceSlices; API errors are reported and retried, never raised."""

    def __init__(
        self,
        api: Any,
        *,
        node: str,
        driver: str,
        max_conflict_retries: int = 5,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        request_timeout_s: float = 30.0,
    ) -> None:
        if max_conflict_retries < 0 or backoff_s <= 0 or max_backoff_s < backoff_s or request_timeout_s <= 0:
            raise ValueError("retries must be >= 0, backoff and timeout > 0, max backoff >= backoff")
        self._api = ResourceV1Api(api)
        self._core = CoreV1Api(api)
        self._node = node
        self._driver = driver
        self._max_conflict_retries = max_conflict_retries
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._timeout = request_timeout_s
        self._failures = 0
        self._next_attempt = 0.0
        self._desired: list[dict[str, Any]] | None = None
        self._pending = False
        self.synced_at: float | None = None  # monotonic time of the last sync that succeeded
        self._written: dict[str, str] = {}  # slice name -> resourceVersion of our last write
        self._lock = asyncio.Lock()
        self.repairs = 0  # syncs started because someone else changed the pool

    @property
    def pending(self) -> bool:
        """The last sync failed; `retry_if_due` will try the same slices again."""
        return self._pending

    async def sync(self, slices: list[dict[str, Any]]) -> SyncReport:
        """Make the server's slices of this node's pool exactly `slices` (rendered, one pool)."""
        self._check(slices)
        async with self._lock:
            self._desired = slices
            return await self._sync_locked(slices)

    async def _sync_locked(self, slices: list[dict[str, Any]]) -> SyncReport:
        progress = _Progress()
        try:
            await self._apply(slices, progress)
        except KubeApiError as error:
            self._failures += 1
            delay = min(self._max_backoff_s, self._backoff_s * 2 ** (self._failures - 1))
            self._next_attempt = asyncio.get_running_loop().time() + delay
            self._pending = True
            log.warning(
                "ResourceSlice sync failed",
                extra={
                    "node": self._node,
                    "error": str(error),
                    "retry_in_s": delay,
                    "failures": self._failures,
                },
            )
            return progress.report(error=str(error), retry_in_s=delay)
        self._failures = 0
        self._pending = False
        self.synced_at = time.monotonic()
        report = progress.report()
        log.info(
            "ResourceSlices synced",
            extra={
                "node": self._node,
                "generation": report.generation,
                # "created" is a LogRecord attribute: a key by that name makes logging raise.
                "slices_created": len(report.created),
                "slices_replaced": len(report.replaced),
                "slices_deleted": len(report.deleted),
                "conflicts": report.conflicts,
            },
        )
        return report

    async def retry_if_due(self) -> SyncReport | None:
        """After a failed sync, try the same slices again once its backoff has passed."""
        if not self._pending or self._desired is None:
            return None
        if asyncio.get_running_loop().time() < self._next_attempt:
            return None
        return await self.sync(self._desired)

    @property
    def _selector(self) -> str:
        return f"spec.nodeName={self._node},spec.driver={self._driver}"

    async def watch(self, *, timeout_s: int = 300, stop: asyncio.Event | None = None) -> None:
        """Repair drift until cancelled (or `stop` is set): any change to the pool that is not ours
        triggers a sync.

        Follows the pool (same field selector as the sync's list) with the shared list-then-watch
        loop, so a change made while the watch was down is found by the next list.
        """

        async def relist() -> str:
            listed = await call(
                f"list ResourceSlices of node {self._node}",
                self._api.list_resource_slice(field_selector=self._selector, _request_timeout=self._timeout),
            )
            seen = [(item.metadata.name, item.metadata.resource_version) for item in listed.items]
            await self._repair("listed pool differs", functools.partial(self._differs, seen))
            return str(listed.metadata.resource_version)

        async def on_change(kind: str, obj: dict[str, Any]) -> None:
            name, version = obj["metadata"].get("name"), obj["metadata"].get("resourceVersion")
            if not isinstance(name, str) or not self._foreign(kind, name, version):
                return
            # our own write may still be on its way back: decide again under the lock
            still = functools.partial(self._foreign, kind, name, version)
            await self._repair(f"{kind.lower()} {name}", still)

        await list_then_watch(
            f"ResourceSlices of node {self._node}",
            relist,
            functools.partial(self._api.list_resource_slice, field_selector=self._selector),
            on_change,
            stop or asyncio.Event(),
            watch_timeout_s=timeout_s,
            request_timeout_s=self._timeout,
        )

    def _foreign(self, kind: str, name: str, resource_version: str | None) -> bool:
        """A change to the pool that our own writes do not explain."""
        desired = self._desired
        if desired is None:
            return False
        ours = any(s["metadata"]["name"] == name for s in desired)
        if kind == "DELETED":
            return ours
        if kind not in ("ADDED", "MODIFIED"):
            return False
        return not ours or self._written.get(name) != resource_version

    def _differs(self, seen: list[tuple[str, str | None]]) -> bool:
        """Whether the listed pool (name, resourceVersion of each slice) is not what we wrote."""
        present = {name for name, _ in seen}
        missing = self._desired is not None and any(
            s["metadata"]["name"] not in present for s in self._desired
        )
        return missing or any(self._foreign("ADDED", name, version) for name, version in seen)

    async def _repair(self, why: str, still: Callable[[], bool]) -> None:
        async with self._lock:
            if self._desired is None or not still():
                return
            self.repairs += 1
            log.warning(
                "ResourceSlice pool changed by someone else; restoring it",
                extra={"node": self._node, "change": why},
            )
            await self._sync_locked(self._desired)

    def _check(self, slices: list[dict[str, Any]]) -> None:
        names: set[str] = set()
        for index, resource_slice in enumerate(slices):
            try:
                name = resource_slice["metadata"]["name"]
                spec = resource_slice["spec"]
                generation = spec["pool"]["generation"]
            except (KeyError, TypeError) as error:
                raise SliceInputError(f"slice {index} lacks {error}") from error
            if spec.get("nodeName") != self._node or spec.get("driver") != self._driver:
                raise SliceInputError(
                    f"slice {name!r} is for node {spec.get('nodeName')!r} and driver {spec.get('driver')!r}, "
                    f"this publisher serves {self._node!r} and {self._driver!r}"
                )
            if not isinstance(generation, int) or generation < 0:
                raise SliceInputError(f"slice {name!r}: pool generation must be a non-negative integer")
            if name in names:
                raise SliceInputError(f"slice name {name!r} repeats")
            names.add(name)

    async def _list(self) -> dict[str, _Stored]:
        result = await call(
            f"list ResourceSlices of node {self._node}",
            self._api.list_resource_slice(
                field_selector=self._selector,
                _request_timeout=self._timeout,
            ),
        )
        return {item.metadata.name: _stored(item) for item in result.items}

    async def _owner(self) -> dict[str, Any] | None:
        """The Node as owner, read each sync: a Node deleted and made again has a new uid."""
        try:
            node = await call(
                f"read Node {self._node}", self._core.read_node(self._node, _request_timeout=self._timeout)
            )
        except KubeApiError as error:
            if not error.not_found:
                raise
            log.warning(
                "Node not found: ResourceSlices published without an owner", extra={"node": self._node}
            )
            return None
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "name": self._node,
            "uid": node.metadata.uid,
            "controller": True,
        }

    def _unchanged(self, stored: _Stored, digest: str, owner: dict[str, Any] | None) -> bool:
        written = self._written.get(stored.name, stored.resource_version)
        owners = (owner["uid"],) if owner is not None else ()
        return stored.spec_hash == digest and stored.owners == owners and written == stored.resource_version

    async def _apply(self, slices: list[dict[str, Any]], progress: _Progress) -> None:
        owner = await self._owner()
        existing = await self._list()
        wanted = {s["metadata"]["name"]: spec_hash(s) for s in slices}
        generations = {stored.generation for stored in existing.values()}
        in_place = wanted.keys() == existing.keys() and all(
            self._unchanged(existing[name], digest, owner) for name, digest in wanted.items()
        )
        if in_place and len(generations) == 1:
            self._written.update((name, existing[name].resource_version) for name in wanted)
            progress.unchanged.extend(wanted)
            progress.generation = generations.pop()
            return
        requested = max((s["spec"]["pool"]["generation"] for s in slices), default=0)
        # a restarted discovery counts from 1 again; the pool's generation must still grow
        generation = max(requested, max(generations, default=0) + 1)
        progress.generation = generation
        for resource_slice in slices:
            name = resource_slice["metadata"]["name"]
            body = _with_generation(resource_slice, generation, wanted[name], owner)
            stored = existing.get(name)
            if stored is None:
                await self._create(body, progress)
            else:
                await self._replace(body, stored, progress)
        for name in existing.keys() - wanted.keys():
            await self._delete(name, progress)

    async def _create(self, body: dict[str, Any], progress: _Progress) -> None:
        name = body["metadata"]["name"]
        try:
            created = await call(
                f"create ResourceSlice {name}",
                self._api.create_resource_slice(
                    body, field_manager=FIELD_MANAGER, _request_timeout=self._timeout
                ),
            )
        except KubeApiError as error:
            if not error.already_exists:
                raise
            # created between our list and now (another replica or a slow earlier request)
            current = await self._read(name)
            if current is None:
                raise
            await self._replace(body, current, progress)
            return
        self._written[name] = created.metadata.resource_version
        progress.created.append(name)

    async def _replace(self, desired: dict[str, Any], stored: _Stored, progress: _Progress) -> None:
        name = desired["metadata"]["name"]
        for attempt in range(self._max_conflict_retries + 1):
            body = _merged_metadata(desired, stored)
            try:
                replaced = await call(
                    f"replace ResourceSlice {name}",
                    self._api.replace_resource_slice(
                        name, body, field_manager=FIELD_MANAGER, _request_timeout=self._timeout
                    ),
                )
            except KubeApiError as error:
                if not error.conflict or attempt == self._max_conflict_retries:
                    raise
                progress.conflicts += 1
                current = await self._read(name)
                if current is None:
                    await self._create(desired, progress)
                    return
                stored = current
                continue
            self._written[name] = replaced.metadata.resource_version
            progress.replaced.append(name)
            return

    async def _read(self, name: str) -> _Stored | None:
        try:
            item = await call(
                f"read ResourceSlice {name}",
                self._api.read_resource_slice(name, _request_timeout=self._timeout),
            )
        except KubeApiError as error:
            if error.not_found:
                return None
            raise
        return _stored(item)

    async def _delete(self, name: str, progress: _Progress) -> None:
        try:
            await call(
                f"delete ResourceSlice {name}",
                self._api.delete_resource_slice(name, _request_timeout=self._timeout),
            )
        except KubeApiError as error:
            if not error.not_found:
                raise
        self._written.pop(name, None)
        progress.deleted.append(name)


def _with_generation(
    resource_slice: dict[str, Any], generation: int, digest: str, owner: dict[str, Any] | None
) -> dict[str, Any]:
    body = copy.deepcopy(resource_slice)
    body["spec"]["pool"]["generation"] = generation
    metadata = body.setdefault("metadata", {})
    metadata.pop("resourceVersion", None)
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    metadata.setdefault("annotations", {})[SPEC_HASH_ANNOTATION] = digest
    return body


def _merged_metadata(desired: dict[str, Any], stored: _Stored) -> dict[str, Any]:
    """PUT replaces the whole object: keep the labels and annotations other writers put there."""
    body = dict(desired)
    metadata = dict(desired["metadata"])
    metadata["labels"] = {**stored.labels, **metadata.get("labels", {})}
    metadata["annotations"] = {**stored.annotations, **metadata.get("annotations", {})}
    if not metadata["labels"]:
        del metadata["labels"]
    metadata["resourceVersion"] = stored.resource_version
    body["metadata"] = metadata
    return body
