"""A validated claim resolved against its DeviceClasses: what each request may take, and how."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tangram import DRIVER_NAME
from tangram.allocation.shape import IDENTITY_ATTRIBUTES
from tangram.allocation.spec import (
    DeviceClass,
    DeviceToleration,
    ResourceClaimSpec,
    _Selection,
)
from tangram.cel import CelCompileError, CelSelector, compile_selector
from tangram.dra.config import (
    PARAMETER_KINDS,
    SHARING_KIND,
    TOPOLOGY_KIND,
    SharingConfig,
    TopologyConfig,
    parse_sharing_config,
    parse_topology_config,
)


class ClaimError(Exception):
    """The claim cannot be allocated anywhere, whatever the fleet state: the message says why."""


@dataclass(frozen=True, slots=True)
class Alternative:
    """One way to satisfy a request: its `exactly` part, or one of its `firstAvailable` subrequests."""

    result_name: str  # "gpus" or "gpus/large"
    request: str  # the top-level request
    class_name: str
    selectors: tuple[tuple[str, CelSelector], ...]  # (where it comes from, selector): class first
    all_mode: bool
    count: int
    admin: bool
    tolerations: tuple[DeviceToleration, ...]
    capacity: tuple[tuple[str, int], ...]
    node_scoped: bool  # a selector names an identity attribute: cache per node, not per shape

    @property
    def cache_key(self) -> tuple[Any, ...]:
        return (
            self.class_name,
            tuple(s.expression for _, s in self.selectors),
            self.tolerations,
            self.capacity,
        )


@dataclass(frozen=True, slots=True)
class Request:
    name: str
    alternatives: tuple[Alternative, ...]


@dataclass(frozen=True, slots=True)
class Constraint:
    requests: frozenset[str] | None  # None: every request
    attribute: str
    match: bool  # matchAttribute; else distinctAttribute


@dataclass(frozen=True, slots=True)
class TopologyRule:
    requests: frozenset[str] | None
    nvlink: bool
    min_bandwidth_gbps: float


@dataclass(frozen=True, slots=True)
class SharingRule:
    requests: frozenset[str] | None
    config: SharingConfig


@dataclass(frozen=True, slots=True)
class ResolvedClaim:
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...]
    topology: tuple[TopologyRule, ...]
    spread: bool
    config: tuple[dict[str, Any], ...]
    # SharingConfigs in the order DRA applies configs (the class's, then the claim's): the last
    # one that covers a request is the one it gets
    sharing: tuple[SharingRule, ...] = ()

    def sharing_for(self, alt: Alternative) -> SharingConfig | None:
        found = None
        for rule in self.sharing:
            if covers(rule.requests, alt):
                found = rule.config
        return found


def _node_scoped(expression: str) -> bool:
    return any(name in expression for name in IDENTITY_ATTRIBUTES)


def _alternative(
    request: str,
    result_name: str,
    selection: _Selection,
    admin: bool,
    *,
    classes: Mapping[str, DeviceClass],
    driver: str,
) -> Alternative:
    device_class = classes.get(selection.deviceClassName)
    if device_class is None:
        raise ClaimError(
            f'request "{result_name}": device class "{selection.deviceClassName}" does not exist'
        )
    selectors: list[tuple[str, CelSelector]] = []
    sources = [(f'class "{device_class.name}"', s.cel.expression) for s in device_class.spec.selectors]
    sources += [(f'request "{result_name}" selector', s.cel.expression) for s in selection.selectors]
    for where, expression in sources:
        try:
            selectors.append((where, compile_selector(expression)))
        except CelCompileError as error:
            raise ClaimError(f'request "{result_name}": {where}: CEL compile error: {error}') from None
    return Alternative(
        result_name=result_name,
        request=request,
        class_name=device_class.name,
        selectors=tuple(selectors),
        all_mode=selection.allocationMode == "All",
        count=selection.wanted,
        admin=admin,
        tolerations=tuple(selection.tolerations),
        # a capacity named without a domain is the driver's own, as in a ResourceSlice
        capacity=tuple(
            sorted(
                (name if "/" in name else f"{driver}/{name}", amount)
                for name, amount in (selection.capacity.requests if selection.capacity else {}).items()
            )
        ),
        node_scoped=any(_node_scoped(s.expression) for _, s in selectors),
    )


def resolve(
    spec: ResourceClaimSpec, classes: Mapping[str, DeviceClass], driver: str = DRIVER_NAME
) -> ResolvedClaim:
    """Raises ClaimError for what no fleet state can fix: unknown classes, bad CEL, bad parameters."""
    devices = spec.devices
    if not devices.requests:
        raise ClaimError("the claim has no device requests")
    requests: list[Request] = []
    used_classes: dict[str, list[str]] = {}
    for req in devices.requests:
        alts: tuple[Alternative, ...]
        if req.exactly is not None:
            alts = (
                _alternative(
                    req.name,
                    req.name,
                    req.exactly,
                    bool(req.exactly.adminAccess),
                    classes=classes,
                    driver=driver,
                ),
            )
        else:
            alts = tuple(
                _alternative(req.name, f"{req.name}/{sub.name}", sub, False, classes=classes, driver=driver)
                for sub in req.firstAvailable or []
            )
        for alt in alts:
            used_classes.setdefault(alt.class_name, []).append(alt.request)
        requests.append(Request(name=req.name, alternatives=alts))
    constraints = tuple(
        Constraint(
            requests=_top_level(c.requests),
            attribute=c.attribute,
            match=c.matchAttribute is not None,
        )
        for c in devices.constraints
    )
    topology: list[TopologyRule] = []
    sharing: list[SharingRule] = []
    spread = False
    config: list[dict[str, Any]] = []
    for class_name in sorted(used_classes):
        for position, class_entry in enumerate(classes[class_name].spec.config):
            if class_entry.opaque is not None:
                config.append(
                    {
                        "source": "FromClass",
                        "requests": sorted(set(used_classes[class_name])),
                        "opaque": class_entry.opaque.model_dump(),
                    }
                )
                if (
                    class_entry.opaque.driver == driver
                    and class_entry.opaque.parameters.get("kind") == SHARING_KIND
                ):
                    try:
                        parsed_class = parse_sharing_config(
                            class_entry.opaque.parameters,
                            f'class "{class_name}" spec.config[{position}].opaque.parameters',
                        )
                    except ValueError as error:
                        raise ClaimError(f"invalid SharingConfig: {error}") from None
                    sharing.append(SharingRule(frozenset(used_classes[class_name]), parsed_class))
    for position, entry in enumerate(devices.config):
        if entry.opaque is None:
            continue
        config.append(
            {"source": "FromClaim", "requests": list(entry.requests), "opaque": entry.opaque.model_dump()}
        )
        if entry.opaque.driver == driver and entry.opaque.parameters.get("kind") == SHARING_KIND:
            try:
                parsed_sharing = parse_sharing_config(
                    entry.opaque.parameters, f"spec.devices.config[{position}].opaque.parameters"
                )
            except ValueError as error:
                raise ClaimError(f"invalid SharingConfig: {error}") from None
            sharing.append(SharingRule(_top_level(entry.requests), parsed_sharing))
            continue
        if entry.opaque.driver != driver or entry.opaque.parameters.get("kind") != TOPOLOGY_KIND:
            continue
        try:
            parsed: TopologyConfig = parse_topology_config(
                entry.opaque.parameters, f"spec.devices.config[{position}].opaque.parameters"
            )
        except ValueError as error:
            raise ClaimError(f"invalid TopologyConfig: {error}") from None
        topology.append(
            TopologyRule(
                requests=_top_level(entry.requests),
                nvlink=parsed.interconnect == "NVLink",
                min_bandwidth_gbps=parsed.minPairBandwidthGBps,
            )
        )
        spread = spread or parsed.placement == "Spread"
    for position, entry in enumerate(devices.config):
        opaque = entry.opaque
        if (
            opaque is not None
            and opaque.driver == driver
            and opaque.parameters.get("kind") not in PARAMETER_KINDS
        ):
            kind = opaque.parameters.get("kind")
            raise ClaimError(
                f"spec.devices.config[{position}].opaque.parameters.kind: {kind!r} is not a "
                f"{driver} parameter kind (expected {' or '.join(PARAMETER_KINDS)})"
            )
    return ResolvedClaim(
        requests=tuple(requests),
        constraints=constraints,
        topology=tuple(topology),
        spread=spread,
        config=tuple(config),
        sharing=tuple(sharing),
    )


def _top_level(names: list[str]) -> frozenset[str] | None:
    """Request or subrequest names as written; empty means every request."""
    if not names:
        return None
    return frozenset(names)


def covers(names: frozenset[str] | None, alt: Alternative) -> bool:
    """A rule naming a request binds whichever subrequest is chosen; naming a subrequest binds only it."""
    return names is None or alt.request in names or alt.result_name in names
