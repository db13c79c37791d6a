"""A small Kubernetes API server for resource.k8s.io/v1 ResourceSlices (and reading ResourceClaims
and writing their status), over real HTTP on loopback.

It behaves like kube-apiserver where the publisher can tell the difference: resourceVersions on
every write and in lists, 409 AlreadyExists / Conflict, 404 NotFound, 422 Invalid with the
validation message, field and label selectors, and watch streams (JSON lines) resumable from a
resourceVersion. Every created or replaced object is validated strictly against the official
schema of the server's Kubernetes version and against the limits the API server enforces in code.

Tests steer it: `race_next_replaces` makes a concurrent writer win the next PUTs, `fail_next`
answers the next requests with an error status, `stop`/`start` take it down and bring it back;
`race_next_claim_status` has another writer change a claim before each of the next status
writes (or answer with the ApiError it raises), `hold_claims` keeps every claim request waiting
until `release_claims`, and `serves_device_status = False` drops `status.devices` on write, as a
server without the DRAResourceClaimDeviceStatus gate does.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kubernetes_validate
from aiohttp import web

from tangram.kubernetes.objects import check_limits

PREFIX = "/apis/resource.k8s.io/v1/resourceslices"
CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
FIELDS: dict[str, Callable[[dict[str, Any]], str]] = {
    "metadata.name": lambda o: str(o["metadata"]["name"]),
    "spec.nodeName": lambda o: str(o["spec"].get("nodeName", "")),
    "spec.driver": lambda o: str(o["spec"].get("driver", "")),
    "spec.pool.name": lambda o: str(o["spec"].get("pool", {}).get("name", "")),
}
_REQUIREMENT = re.compile(r"^\s*(!?)([A-Za-z0-9./_-]+)\s*(?:(==|!=|=)\s*([A-Za-z0-9._-]*))?\s*$")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.name = name

    def response(self) -> web.Response:
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.name is not None:
            status["details"] = {"name": self.name, "group": "resource.k8s.io", "kind": "resourceslices"}
        return web.json_response(status, status=self.code)


@dataclass(frozen=True)
class WatchEvent:
    resource_version: int
    type: str  # ADDED, MODIFIED, DELETED
    object: dict[str, Any]


def _selector(text: str | None, what: str) -> list[tuple[str, str, str | None]]:
    """`key=value`, `key==value`, `key!=value`, `key`, `!key`, comma-separated (ANDed)."""
    requirements: list[tuple[str, str, str | None]] = []
    for part in (text or "").split(","):
        if not part.strip():
            continue
        match = _REQUIREMENT.match(part)
        if match is None:
            raise ApiError(400, "BadRequest", f"unable to parse requirement {part!r} of {what}")
        negated, key, operator, value = match.groups()
        if negated and operator:
            raise ApiError(400, "BadRequest", f"unable to parse requirement {part!r} of {what}")
        if negated:
            requirements.append((key, "!exists", None))
        elif operator is None:
            requirements.append((key, "exists", None))
        else:
            requirements.append((key, "!=" if operator == "!=" else "=", value))
    return requirements


def _labels_match(obj: dict[str, Any], requirements: list[tuple[str, str, str | None]]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    for key, operator, value in requirements:
        if operator == "exists" and key not in labels:
            return False
        if operator == "!exists" and key in labels:
            return False
        if operator == "=" and labels.get(key) != value:
            return False
        if operator == "!=" and labels.get(key) == value:
            return False
    return True


def _fields_match(obj: dict[str, Any], requirements: list[tuple[str, str, str | None]]) -> bool:
    for key, operator, value in requirements:
        actual = FIELDS[key](obj)
        if (operator == "=") != (actual == value):
            return False
    return True


class LocalApiServer:
    def __init__(self, *, k8s_version: str = "1.36") -> None:
        self.k8s_version = k8s_version
        self.objects: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name): ResourceClaim
        self.events: list[WatchEvent] = []
        self.requests: list[tuple[str, str]] = []  # (method, path?query) in arrival order
        self._resource_version = 100
        self._tick = asyncio.Event()  # set (and replaced) whenever an event is recorded
        self._closing = False
        self._races = 0
        self._failures: list[int] = []
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.serves_device_status = True
        self._claims_open = asyncio.Event()
        self._claims_open.set()
        self._claim_races: list[Callable[[dict[str, Any]], None]] = []

    # ---- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Listen on a free loopback port, or on the same port again after `stop`."""
        app = web.Application()
        app.router.add_route("GET", PREFIX, self._collection_get)
        app.router.add_route("POST", PREFIX, self._create)
        app.router.add_route("GET", PREFIX + "/{name}", self._get)
        app.router.add_route("PUT", PREFIX + "/{name}", self._replace)
        app.router.add_route("DELETE", PREFIX + "/{name}", self._delete)
        app.router.add_route("GET", CLAIM_PATH, self._get_claim)
        app.router.add_route("PUT", CLAIM_PATH + "/status", self._replace_claim_status)
        self._closing = False
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        if self.port == 0:
            self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Close every connection (watches included); the stored objects survive a restart."""
        self._closing = True
        self._wake_watchers()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---- test controls ---------------------------------------------------------------------

    def slices(self, node: str | None = None) -> list[dict[str, Any]]:
        """Stored slices, sorted by name, optionally only those of one node."""
        return [
            copy.deepcopy(obj)
            for name, obj in sorted(self.objects.items())
            if node is None or obj["spec"].get("nodeName") == node
        ]

    def put_object(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object as another client would have created it (validated like any write)."""
        self._validate(obj)
        return self._store(copy.deepcopy(obj), "ADDED")

    def put_claim(self, claim: dict[str, Any]) -> dict[str, Any]:
        """Store a ResourceClaim, status included, as kube-scheduler leaves it after allocating.

        Validated against the official schema; a claim stored again under the same name keeps its
        uid unless `metadata.uid` says otherwise (a claim deleted and made again).
        """
        name = claim.get("metadata", {}).get("name")
        try:
            kubernetes_validate.validate(claim, self.k8s_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            raise ApiError(
                422, "Invalid", f"ResourceClaim {name!r} is invalid: {path}: {error.message}"
            ) from None
        stored = copy.deepcopy(claim)
        metadata = stored["metadata"]
        key = (metadata.get("namespace", "default"), metadata["name"])
        previous = self.claims.get(key)
        metadata.setdefault("uid", previous["metadata"]["uid"] if previous else str(uuid.uuid4()))
        self._resource_version += 1
        metadata["resourceVersion"] = str(self._resource_version)
        self.claims[key] = stored
        return copy.deepcopy(stored)

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The stored ResourceClaim, as a reader would get it."""
        return copy.deepcopy(self.claims[(namespace, name)])

    def delete_claim(self, namespace: str, name: str) -> None:
        del self.claims[(namespace, name)]

    def hold_claims(self) -> None:
        """Claim requests wait, unanswered, until `release_claims` (an API server that hangs)."""
        self._claims_open.clear()

    def release_claims(self) -> None:
        self._claims_open.set()

    def race_next_claim_status(self, *mutations: Callable[[dict[str, Any]], None]) -> None:
        """Before each of the next status writes, another writer changes the claim (a mutation
        each): a new resourceVersion, so the write in flight conflicts."""
        self._claim_races.extend(mutations)

    def modify(self, name: str, mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """A concurrent writer changes the object: a new resourceVersion and a MODIFIED event."""
        obj = copy.deepcopy(self.objects[name])
        mutate(obj)
        self._validate(obj)
        return self._store(obj, "MODIFIED")

    def race_next_replaces(self, count: int) -> None:
        """Before each of the next `count` PUTs, another writer updates the same object first."""
        self._races += count

    def fail_next(self, count: int, status: int = 500) -> None:
        """Answer the next `count` requests with `status` (an overloaded or broken API server)."""
        self._failures.extend([status] * count)

    # ---- storage ---------------------------------------------------------------------------

    def _store(self, obj: dict[str, Any], event: str) -> dict[str, Any]:
        self._resource_version += 1
        metadata = obj["metadata"]
        name = metadata["name"]
        previous = self.objects.get(name)
        if previous is None:
            metadata["uid"] = str(uuid.uuid4())
            metadata["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            metadata["generation"] = 1
        else:
            metadata["uid"] = previous["metadata"]["uid"]
            metadata["creationTimestamp"] = previous["metadata"]["creationTimestamp"]
            changed = previous.get("spec") != obj.get("spec")
            metadata["generation"] = previous["metadata"]["generation"] + int(changed)
        metadata["resourceVersion"] = str(self._resource_version)
        self.objects[name] = obj
        self._record(event, obj)
        return copy.deepcopy(obj)

    def _record(self, event: str, obj: dict[str, Any]) -> None:
        self.events.append(WatchEvent(int(obj["metadata"]["resourceVersion"]), event, copy.deepcopy(obj)))
        self._wake_watchers()

    def _wake_watchers(self) -> None:
        self._tick.set()
        self._tick = asyncio.Event()

    def _validate(self, obj: dict[str, Any]) -> None:
        name = obj.get("metadata", {}).get("name")
        if obj.get("apiVersion") != "resource.k8s.io/v1" or obj.get("kind") != "ResourceSlice":
            raise ApiError(
                400,
                "BadRequest",
                f"expected resource.k8s.io/v1 ResourceSlice, got {obj.get('apiVersion')} {obj.get('kind')}",
                name,
            )
        try:
            kubernetes_validate.validate(obj, self.k8s_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            raise ApiError(
                422, "Invalid", f"ResourceSlice {name!r} is invalid: {path}: {error.message}", name
            ) from None
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value", name)
        # the API server checks one object at a time: what needs the whole pool is not its business
        problems = [
            p
            for p in check_limits([obj], self.k8s_version)
            if not p.startswith("resourceSliceCount") and "which is not in the pool" not in p
        ]
        if problems:
            raise ApiError(422, "Invalid", f"ResourceSlice {name!r} is invalid: " + "; ".join(problems), name)

    # ---- HTTP ------------------------------------------------------------------------------

    async def _prologue(self, request: web.Request) -> None:
        self.requests.append((request.method, request.path_qs))
        if self._failures:
            code = self._failures.pop(0)
            raise ApiError(code, "InternalError", f"injected failure {code}")

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError as error:
            raise ApiError(400, "BadRequest", f"request body is not JSON: {error}") from error
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "request body is not an object")
        return body

    def _selectors(self, request: web.Request) -> Callable[[dict[str, Any]], bool]:
        labels = _selector(request.query.get("labelSelector"), "labelSelector")
        fields = _selector(request.query.get("fieldSelector"), "fieldSelector")
        for key, operator, _ in fields:
            if key not in FIELDS or operator not in ("=", "!="):
                raise ApiError(400, "BadRequest", f'field label not supported: "{key}"')
        return lambda obj: _labels_match(obj, labels) and _fields_match(obj, fields)

    async def _collection_get(self, request: web.Request) -> web.StreamResponse:
        try:
            await self._prologue(request)
            matches = self._selectors(request)
            if request.query.get("watch", "").lower() in ("true", "1"):
                return await self._watch(request, matches)
        except ApiError as error:
            return error.response()
        items = [copy.deepcopy(o) for _, o in sorted(self.objects.items()) if matches(o)]
        return web.json_response(
            {
                "kind": "ResourceSliceList",
                "apiVersion": "resource.k8s.io/v1",
                "metadata": {"resourceVersion": str(self._resource_version)},
                "items": items,
            }
        )

    async def _watch(
        self, request: web.Request, matches: Callable[[dict[str, Any]], bool]
    ) -> web.StreamResponse:
        since = request.query.get("resourceVersion", "")
        timeout = request.query.get("timeoutSeconds")
        deadline = None if timeout is None else asyncio.get_running_loop().time() + float(timeout)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if since in ("", "0"):
            # like kube-apiserver: synthetic ADDED events for the current state, then changes
            start = self._resource_version
            backlog = [WatchEvent(start, "ADDED", o) for _, o in sorted(self.objects.items())]
        else:
            start = int(since)
            backlog = []
        sent = start
        while not self._closing:
            tick = self._tick
            pending = backlog + [e for e in self.events if e.resource_version > sent]
            backlog = []
            for event in pending:
                sent = max(sent, event.resource_version)
                if matches(event.object):
                    line = json.dumps({"type": event.type, "object": event.object}) + "\n"
                    await response.write(line.encode())
            remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if remaining is not None and remaining <= 0:
                break
            if not any(e.resource_version > sent for e in self.events):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(tick.wait(), remaining)
        await response.write_eof()
        return response

    async def _get(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            await self._prologue(request)
            if name not in self.objects:
                raise ApiError(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found', name)
        except ApiError as error:
            return error.response()
        return web.json_response(self.objects[name])

    async def _get_claim(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        try:
            await self._prologue(request)
            await self._claims_open.wait()
            claim = self.claims.get((namespace, name))
            if claim is None:
                raise ApiError(404, "NotFound", f'resourceclaims.resource.k8s.io "{name}" not found', name)
        except ApiError as error:
            return error.response()
        return web.json_response(claim)

    async def _replace_claim_status(self, request: web.Request) -> web.Response:
        """PUT .../resourceclaims/{name}/status: only the status is taken from the body (the
        spec and metadata stay the server's), guarded by the resourceVersion in the body."""
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        try:
            await self._prologue(request)
            await self._claims_open.wait()
            body = await self._body(request)
            if body.get("metadata", {}).get("name") != name:
                raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
            stored = self.claims.get((namespace, name))
            if stored is None:
                raise ApiError(404, "NotFound", f'resourceclaims.resource.k8s.io "{name}" not found', name)
            if self._claim_races:
                changed = copy.deepcopy(stored)
                self._claim_races.pop(0)(changed)
                stored = self.put_claim(changed)
            given = body["metadata"].get("resourceVersion")
            if given and given != stored["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on resourceclaims.resource.k8s.io "{name}": '
                    "the object has been modified; please apply your changes to the latest version "
                    "and try again",
                    name,
                )
            status = copy.deepcopy(body.get("status") or {})
            if not self.serves_device_status:
                status.pop("devices", None)
            _check_device_status(name, status)
            written = self.put_claim({**copy.deepcopy(stored), "status": status})
        except ApiError as error:
            return error.response()
        return web.json_response(written)

    async def _create(self, request: web.Request) -> web.Response:
        try:
            await self._prologue(request)
            body = await self._body(request)
            name = body.get("metadata", {}).get("name")
            if body.get("metadata", {}).get("resourceVersion"):
                raise ApiError(
                    400, "BadRequest", "resourceVersion should not be set on objects to be created", name
                )
            self._validate(body)
            if name in self.objects:
                raise ApiError(
                    409, "AlreadyExists", f'resourceslices.resource.k8s.io "{name}" already exists', name
                )
            stored = self._store(body, "ADDED")
        except ApiError as error:
            return error.response()
        return web.json_response(stored, status=201)

    async def _replace(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            await self._prologue(request)
            body = await self._body(request)
            if body.get("metadata", {}).get("name") != name:
                raise ApiError(
                    400, "BadRequest", "the name of the object does not match the name on the URL", name
                )
            self._validate(body)
            if name not in self.objects:
                raise ApiError(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found', name)
            if self._races:
                self._races -= 1
                self.modify(name, _concurrent_edit)
            given = body["metadata"].get("resourceVersion")
            if given and given != self.objects[name]["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on resourceslices.resource.k8s.io "{name}": '
                    "the object has been modified; please apply your changes to the latest version "
                    "and try again",
                    name,
                )
            stored = self._store(body, "MODIFIED")
        except ApiError as error:
            return error.response()
        return web.json_response(stored)

    async def _delete(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            await self._prologue(request)
            if name not in self.objects:
                raise ApiError(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found', name)
            options = await self._body(request) if request.can_read_body else {}
            expected = (options.get("preconditions") or {}).get("resourceVersion")
            current = self.objects[name]
            if expected and expected != current["metadata"]["resourceVersion"]:
                raise ApiError(
                    409, "Conflict", f"Precondition failed: ResourceVersion in precondition: {expected}", name
                )
        except ApiError as error:
            return error.response()
        del self.objects[name]
        self._resource_version += 1
        gone = copy.deepcopy(current)
        gone["metadata"]["resourceVersion"] = str(self._resource_version)
        self._record("DELETED", gone)
        return web.json_response(gone)


def _check_device_status(name: str, status: dict[str, Any]) -> None:
    """What kube-apiserver checks of status.devices beyond the schema: each entry names an
    allocated device of the claim (driver, pool, device and shareID), once."""
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    allocated = {(r.get("driver"), r.get("pool"), r.get("device"), r.get("shareID")) for r in results}
    seen = set()
    for index, entry in enumerate(status.get("devices") or []):
        key = (entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID"))
        if key not in allocated:
            raise ApiError(
                422,
                "Invalid",
                f'ResourceClaim.resource.k8s.io "{name}" is invalid: status.devices[{index}]: '
                "Invalid value: must be an allocated device in the claim",
                name,
            )
        if key in seen:
            raise ApiError(
                422,
                "Invalid",
                f'ResourceClaim.resource.k8s.io "{name}" is invalid: status.devices[{index}]: '
                "Duplicate value",
                name,
            )
        seen.add(key)


def _concurrent_edit(obj: dict[str, Any]) -> None:
    """What another writer might do: touch a label, leaving the spec alone."""
    labels = obj["metadata"].setdefault("labels", {})
    labels["example.com/touched"] = str(int(labels.get("example.com/touched", "0")) + 1)
