"""The API server's ResourceSlice limits per Kubernetes version, and a check of rendered slices against them.

Schema validation does not catch these: the API server enforces them in code, so a slice that
passes the JSON schema can still be rejected at publish time.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal, get_args

K8sVersion = Literal["1.34", "1.35", "1.36", "1.37"]
K8S_VERSIONS: tuple[K8sVersion, ...] = get_args(K8sVersion)

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_SUBDOMAIN = 253
MAX_IDENTIFIER = 32
MAX_STRING_ATTRIBUTE = 64


@dataclass(frozen=True, kw_only=True)
class SliceLimits:
    max_devices: int = 128
    max_devices_with_counters_or_taints: int = 128
    max_attributes_and_capacities: int = 32
    max_taints_per_device: int = 4
    # 1.34: counter sets live in the slice of the devices that consume them
    counters_with_devices: bool = True
    max_shared_counters_per_slice: int | None = 32
    max_counter_sets_per_slice: int | None = None
    max_counters_per_set: int = 32
    max_consumptions_per_device: int | None = None
    max_counters_per_device: int | None = 32
    max_counters_per_consumption: int = 32
    max_consumed_counters_per_slice: int | None = 1024


LIMITS: dict[K8sVersion, SliceLimits] = {
    "1.34": SliceLimits(),
    "1.35": SliceLimits(
        max_devices_with_counters_or_taints=64,
        max_taints_per_device=16,
        counters_with_devices=False,
        max_shared_counters_per_slice=None,
        max_counter_sets_per_slice=8,
        max_consumptions_per_device=2,
        max_counters_per_device=None,
        max_consumed_counters_per_slice=None,
    ),
}
LIMITS["1.36"] = LIMITS["1.37"] = LIMITS["1.35"]


def limits_for(k8s_version: str) -> SliceLimits:
    if k8s_version not in LIMITS:
        raise ValueError(
            f"unsupported Kubernetes version {k8s_version!r}; supported: {', '.join(K8S_VERSIONS)}"
        )
    return LIMITS[k8s_version]


def _qualified_name_problem(name: str, driver: str) -> str | None:
    """Attribute and capacity names: `identifier` (driver's domain implied) or `domain/identifier`."""
    domain, _, local = name.rpartition("/")
    if domain and (len(domain) > 63 or not DNS_SUBDOMAIN.match(domain)):
        return f"domain {domain!r} is not a DNS subdomain of at most 63 characters"
    if len(local) > MAX_IDENTIFIER or not C_IDENTIFIER.match(local):
        return f"{local!r} is not a C identifier of at most {MAX_IDENTIFIER} characters"
    if domain == driver:
        return f"{name!r} is in the driver's own domain and should be written unqualified"
    return None


def _device_problems(where: str, device: dict[str, Any], limits: SliceLimits, driver: str) -> list[str]:
    problems: list[str] = []
    name = device.get("name", "")
    if not DNS_LABEL.match(name):
        problems.append(f"{where}: device name {name!r} is not a DNS label")
    attributes: dict[str, dict[str, Any]] = device.get("attributes") or {}
    capacity: dict[str, Any] = device.get("capacity") or {}
    if len(attributes) + len(capacity) > limits.max_attributes_and_capacities:
        problems.append(
            f"{where}: {len(attributes)} attributes + {len(capacity)} capacities "
            f"> {limits.max_attributes_and_capacities}"
        )
    for key in [*attributes, *capacity]:
        problem = _qualified_name_problem(key, driver)
        if problem:
            problems.append(f"{where}: attribute or capacity {key!r}: {problem}")
    for key, value in attributes.items():
        for kind in ("string", "version"):
            text = value.get(kind)
            if isinstance(text, str) and len(text) > MAX_STRING_ATTRIBUTE:
                problems.append(
                    f"{where}: attribute {key!r} is {len(text)} characters > {MAX_STRING_ATTRIBUTE}"
                )
    taints = device.get("taints") or []
    if len(taints) > limits.max_taints_per_device:
        problems.append(f"{where}: {len(taints)} taints > {limits.max_taints_per_device}")
    consumes: list[dict[str, Any]] = device.get("consumesCounters") or []
    sets = Counter(c["counterSet"] for c in consumes)
    problems.extend(f"{where}: counter set {s!r} consumed twice" for s, n in sets.items() if n > 1)
    if limits.max_consumptions_per_device is not None and len(consumes) > limits.max_consumptions_per_device:
        problems.append(
            f"{where}: {len(consumes)} counter consumptions > {limits.max_consumptions_per_device}"
        )
    for entry in consumes:
        if len(entry["counters"]) > limits.max_counters_per_consumption:
            problems.append(
                f"{where}: consumes {len(entry['counters'])} counters of {entry['counterSet']!r} "
                f"> {limits.max_counters_per_consumption}"
            )
    total = sum(len(c["counters"]) for c in consumes)
    if limits.max_counters_per_device is not None and total > limits.max_counters_per_device:
        problems.append(f"{where}: consumes {total} counters > {limits.max_counters_per_device}")
    return problems


def _counter_references(
    where: str, device: dict[str, Any], visible_sets: dict[str, set[str]], scope: str
) -> list[str]:
    problems: list[str] = []
    for entry in device.get("consumesCounters") or []:
        set_name = entry["counterSet"]
        if set_name not in visible_sets:
            problems.append(f"{where}: consumes counter set {set_name!r}, which is not in the {scope}")
            continue
        unknown = sorted(set(entry["counters"]) - visible_sets[set_name])
        if unknown:
            problems.append(f"{where}: counters {unknown} are not in counter set {set_name!r}")
    return problems


def _slice_problems(index: int, spec: dict[str, Any], limits: SliceLimits, driver: str) -> list[str]:
    where = f"slice {index}"
    problems: list[str] = []
    devices: list[dict[str, Any]] = spec.get("devices") or []
    counter_sets: list[dict[str, Any]] = spec.get("sharedCounters") or []
    if not limits.counters_with_devices and devices and counter_sets:
        problems.append(f"{where}: carries both devices and shared counters")
    busy = any(d.get("consumesCounters") or d.get("taints") for d in devices)
    max_devices = limits.max_devices_with_counters_or_taints if busy else limits.max_devices
    if len(devices) > max_devices:
        reason = " (devices consume counters or carry taints)" if busy else ""
        problems.append(f"{where}: {len(devices)} devices > {max_devices}{reason}")
    for cs in counter_sets:
        if not DNS_LABEL.match(cs.get("name", "")):
            problems.append(f"{where}: counter set name {cs.get('name')!r} is not a DNS label")
        if len(cs["counters"]) > limits.max_counters_per_set:
            problems.append(
                f"{where}: counter set {cs['name']!r} has {len(cs['counters'])} counters "
                f"> {limits.max_counters_per_set}"
            )
        problems.extend(
            f"{where}: counter name {c!r} in set {cs['name']!r} is not a DNS label"
            for c in cs["counters"]
            if not DNS_LABEL.match(c)
        )
    if (
        limits.max_counter_sets_per_slice is not None
        and len(counter_sets) > limits.max_counter_sets_per_slice
    ):
        problems.append(f"{where}: {len(counter_sets)} counter sets > {limits.max_counter_sets_per_slice}")
    shared = sum(len(cs["counters"]) for cs in counter_sets)
    if limits.max_shared_counters_per_slice is not None and shared > limits.max_shared_counters_per_slice:
        problems.append(f"{where}: {shared} shared counters > {limits.max_shared_counters_per_slice}")
    consumed = sum(len(c["counters"]) for d in devices for c in d.get("consumesCounters") or [])
    if (
        limits.max_consumed_counters_per_slice is not None
        and consumed > limits.max_consumed_counters_per_slice
    ):
        problems.append(f"{where}: {consumed} consumed counters > {limits.max_consumed_counters_per_slice}")
    for d in devices:
        problems.extend(_device_problems(f"{where} device {d.get('name')!r}", d, limits, driver))
    return problems


def check_limits(slices: list[dict[str, Any]], k8s_version: str) -> list[str]:
    """Every way the slices of one pool would be rejected by (or mislead) the API server of that version."""
    limits = limits_for(k8s_version)
    problems: list[str] = []
    if not slices:
        return ["no slices: a pool needs at least one ResourceSlice"]
    specs = [s["spec"] for s in slices]
    pools = {(s["driver"], s["pool"]["name"]) for s in specs}
    if len(pools) != 1:
        problems.append(f"slices span {len(pools)} pools; check one pool at a time")
    generations = {s["pool"]["generation"] for s in specs}
    if len(generations) != 1:
        problems.append(f"slices disagree on the pool generation: {sorted(generations)}")
    counts = {s["pool"]["resourceSliceCount"] for s in specs}
    if counts != {len(slices)}:
        problems.append(f"resourceSliceCount {sorted(counts)} but the pool has {len(slices)} slices")
    names = Counter(s["metadata"]["name"] for s in slices)
    for name, n in names.items():
        if n > 1:
            problems.append(f"slice name {name!r} used {n} times")
        if len(name) > MAX_SUBDOMAIN or not DNS_SUBDOMAIN.match(name):
            problems.append(f"slice name {name!r} is not a DNS subdomain")
    device_names = Counter(d["name"] for s in specs for d in s.get("devices") or [])
    problems.extend(f"device name {n!r} used {c} times in the pool" for n, c in device_names.items() if c > 1)
    set_names = Counter(cs["name"] for s in specs for cs in s.get("sharedCounters") or [])
    if not limits.counters_with_devices:
        problems.extend(
            f"counter set name {n!r} used {c} times in the pool" for n, c in set_names.items() if c > 1
        )
    pool_sets = {cs["name"]: set(cs["counters"]) for s in specs for cs in s.get("sharedCounters") or []}
    for index, spec in enumerate(specs):
        problems.extend(_slice_problems(index, spec, limits, spec["driver"]))
        local_sets = {cs["name"]: set(cs["counters"]) for cs in spec.get("sharedCounters") or []}
        if len(local_sets) != len(spec.get("sharedCounters") or []):
            problems.append(f"slice {index}: counter set names repeat within the slice")
        visible, scope = (local_sets, "same slice") if limits.counters_with_devices else (pool_sets, "pool")
        for d in spec.get("devices") or []:
            problems.extend(_counter_references(f"slice {index} device {d.get('name')!r}", d, visible, scope))
    return problems
