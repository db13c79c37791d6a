"""What a ResourceClaim read from the API server asks this node to prepare. Pure: no I/O.

Kubelet names a claim (namespace, name, uid); the claim's `status.allocation`, written by
kube-scheduler (or later by Tangram's allocator), says which devices of which pools it holds and
which opaque configs apply. Only the results of this driver are this plugin's; a result of this
driver in another node's pool, or an opaque config of this driver that does not validate, is an
error naming the field, so kubelet reports it on the pod instead of running it on the wrong devices.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Any

from tangram.cdi.devices import ClaimRef
from tangram.dra.config import (
    PARAMETER_KINDS,
    SHARING_KIND,
    SharingConfig,
    TopologyConfig,
    parse_sharing_config,
    parse_topology_config,
)
from tangram.dra.imex import IMEX_KIND, ImexChannel, imex_of
from tangram.dra.model import Device
from tangram.dra.names import names_result
from tangram.dra.sharing import read_share
from tangram.events import DeviceShare, NodeHardware
from tangram.kubernetes.objects.limits import DNS_SUBDOMAIN, MAX_SUBDOMAIN


class ClaimRefused(ValueError):
    """The claim cannot be prepared on this node as it stands; the message says why, naming the field."""


@dataclass(frozen=True)
class DeviceResult:
    """One entry of status.allocation.devices.results for this driver."""

    request: str
    pool: str
    device: str
    admin_access: bool = False
    share: DeviceShare | None = None  # a share of a share host: its id, strategy and limits


@dataclass(frozen=True)
class SharingRule:
    requests: frozenset[str] | None  # None: every request
    config: SharingConfig


@dataclass(frozen=True)
class TopologyRule:
    requests: frozenset[str] | None  # None: every request
    config: TopologyConfig
    where: str


@dataclass(frozen=True)
class ClaimAllocation:
    results: tuple[DeviceResult, ...]
    topology: tuple[TopologyRule, ...]
    imex: ImexChannel | None = None  # the IMEX channel of the claim's NVLink domain (the allocator's)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ClaimRefused(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ClaimRefused(f"{where}: expected a list, got {type(value).__name__}")
    return value


def read_allocation(obj: Any, claim: ClaimRef, *, driver: str, pool: str) -> ClaimAllocation:
    """This driver's part of the claim's allocation; ClaimRefused when it is not this node's to prepare."""
    what = f"ResourceClaim {claim.namespace}/{claim.name}"
    body = _mapping(obj, what)
    metadata = _mapping(body.get("metadata") or {}, f"{what} metadata")
    uid = metadata.get("uid")
    if uid != claim.uid:
        raise ClaimRefused(
            f"{what} has uid {uid!r}, kubelet asked for {claim.uid!r}: the claim was deleted and made again"
        )
    allocation = (body.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimRefused(f"{what} is not allocated (status.allocation is empty)")
    devices = _mapping(
        _mapping(allocation, "status.allocation").get("devices") or {}, "status.allocation.devices"
    )
    results: list[DeviceResult] = []
    raw_results: list[dict[str, Any]] = []
    drivers: set[str] = set()
    for index, raw in enumerate(_list(devices.get("results"), "status.allocation.devices.results")):
        where = f"status.allocation.devices.results[{index}]"
        entry = _mapping(raw, where)
        result_driver = str(entry.get("driver", ""))
        drivers.add(result_driver)
        if result_driver != driver:
            continue
        if entry.get("pool") != pool:
            raise ClaimRefused(
                f"{what}: {where}.pool is {entry.get('pool')!r}, but this is node {pool!r} (pool {pool!r})"
            )
        for field in ("request", "device"):
            if not isinstance(entry.get(field), str) or not entry[field]:
                raise ClaimRefused(f"{what}: {where}.{field} is missing")
        results.append(
            DeviceResult(
                request=entry["request"],
                pool=pool,
                device=entry["device"],
                admin_access=bool(entry.get("adminAccess")),
            )
        )
        raw_results.append(entry)
    if not results:
        named = ", ".join(sorted(d for d in drivers if d)) or "no driver"
        raise ClaimRefused(f"{what} holds no device of driver {driver} (its devices are from {named})")
    topology, sharing = _configs(devices, driver, what)
    shared = tuple(
        _with_share(result, entry, sharing, claim_uid=claim.uid, what=what, position=position)
        for position, (result, entry) in enumerate(zip(results, raw_results, strict=True))
    )
    return ClaimAllocation(results=shared, topology=topology, imex=_imex(body, devices, driver, what))


def _imex(body: dict[str, Any], devices: dict[str, Any], driver: str, what: str) -> ImexChannel | None:
    """The allocator's IMEX channel in the allocation. Only Tangram's allocator writes one: a claim
    (or a DeviceClass) carrying the kind itself would have kube-scheduler copy it into the
    allocation, and get an IMEX channel no allocator gave it."""
    spec_devices = (body.get("spec") or {}).get("devices") or {}
    try:
        asked = imex_of(spec_devices.get("config") or [], driver) if isinstance(spec_devices, dict) else None
        entries = _list(devices.get("config"), "status.allocation.devices.config")
        channel = imex_of(entries, driver)
    except ValueError as error:
        raise ClaimRefused(f"{what}: invalid {IMEX_KIND}: {error}") from None
    if channel is None:
        return None
    from_class = any(
        isinstance(e, dict)
        and e.get("source") == "FromClass"
        and isinstance(e.get("opaque"), dict)
        and isinstance(e["opaque"].get("parameters"), dict)
        and e["opaque"]["parameters"].get("kind") == IMEX_KIND
        for e in entries
    )
    if asked is not None or from_class:
        raise ClaimRefused(
            f"{what}: an {IMEX_KIND} config is Tangram's own, written by its allocator for a group's "
            "NVLink domain; one from the claim or its DeviceClass is refused"
        )
    return channel


def _with_share(
    result: DeviceResult,
    entry: dict[str, Any],
    sharing: list[SharingRule],
    *,
    claim_uid: str,
    what: str,
    position: int,
) -> DeviceResult:
    """A share host's result with its share; any other result as it is."""
    config = None
    for rule in sharing:
        if names_result(rule.requests, result.request):
            config = rule.config
    try:
        share = read_share(
            entry, where=f"status.allocation.devices.results[{position}]", claim_uid=claim_uid, config=config
        )
    except ValueError as error:
        raise ClaimRefused(f"{what}: {error}") from None
    if share is None:
        return result
    return DeviceResult(
        request=result.request,
        pool=result.pool,
        device=result.device,
        admin_access=result.admin_access,
        share=share,
    )


def _configs(
    devices: dict[str, Any], driver: str, what: str
) -> tuple[tuple[TopologyRule, ...], list[SharingRule]]:
    """Tangram's opaque configs of the allocation, in the order DRA applies them."""
    rules: list[TopologyRule] = []
    sharing: list[SharingRule] = []
    for index, raw in enumerate(_list(devices.get("config"), "status.allocation.devices.config")):
        where = f"status.allocation.devices.config[{index}]"
        entry = _mapping(raw, where)
        opaque = entry.get("opaque")
        if opaque is None:
            continue
        opaque = _mapping(opaque, f"{where}.opaque")
        if opaque.get("driver") != driver:
            continue
        parameters = opaque.get("parameters")
        if not isinstance(parameters, dict):
            raise ClaimRefused(f"{what}: {where}.opaque.parameters: expected an object")
        kind = parameters.get("kind")
        if kind == IMEX_KIND:
            continue  # the allocator's own (_imex)
        if kind not in PARAMETER_KINDS:
            raise ClaimRefused(
                f"{what}: {where}.opaque.parameters.kind: {kind!r} is not a {driver} parameter kind "
                f"(expected {' or '.join(PARAMETER_KINDS)})"
            )
        names = frozenset(str(n) for n in _list(entry.get("requests"), f"{where}.requests")) or None
        try:
            if kind == SHARING_KIND:
                sharing.append(
                    SharingRule(names, parse_sharing_config(parameters, f"{where}.opaque.parameters"))
                )
            else:
                config = parse_topology_config(parameters, f"{where}.opaque.parameters")
                rules.append(TopologyRule(requests=names, config=config, where=where))
        except ValueError as error:
            raise ClaimRefused(f"{what}: invalid {kind}: {error}") from None
    return tuple(rules), sharing


def check_topology(
    allocation: ClaimAllocation, devices: dict[str, Device], hardware: NodeHardware, claim: ClaimRef
) -> None:
    """Tangram's TopologyConfig is opaque to kube-scheduler, so the node is where it is enforced."""
    links = {(link.a, link.b): link for link in hardware.links}
    for rule in allocation.topology:
        config = rule.config
        if config.interconnect != "NVLink" and config.minPairBandwidthGBps <= 0:
            continue
        gpus = sorted(
            {
                devices[r.device].gpu_index
                for r in allocation.results
                if names_result(rule.requests, r.request)
            }
        )
        for a, b in combinations(gpus, 2):
            link = links.get((a, b))
            if config.interconnect == "NVLink" and (link is None or link.nvlinks == 0):
                raise ClaimRefused(
                    f"ResourceClaim {claim.namespace}/{claim.name}: {rule.where} asks for NVLink between "
                    f"its GPUs, but GPUs {a} and {b} of node {hardware.node} are not NVLink-connected"
                )
            bandwidth = link.bandwidth_gbps if link is not None else 0.0
            if bandwidth < config.minPairBandwidthGBps:
                raise ClaimRefused(
                    f"ResourceClaim {claim.namespace}/{claim.name}: {rule.where} asks for at least "
                    f"{config.minPairBandwidthGBps:g} GB/s between each pair of its GPUs, but GPUs {a} "
                    f"and {b} of node {hardware.node} have {bandwidth:g} GB/s"
                )


def reserved_pods(obj: Any) -> list[str]:
    """The names of the pods the claim is reserved for (`status.reservedFor`, resource "pods"), in
    order; entries that are not well-formed pod references are left out (the API server writes
    this field, and what it says is only ever shown, never acted on)."""
    status = obj.get("status") if isinstance(obj, dict) else None
    entries = status.get("reservedFor") if isinstance(status, dict) else None
    if not isinstance(entries, list):
        return []
    names = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("resource") != "pods" or entry.get("apiGroup", ""):
            continue
        name = entry.get("name")
        if isinstance(name, str) and DNS_SUBDOMAIN.match(name) and len(name) <= MAX_SUBDOMAIN:
            names.append(name)
    return names
