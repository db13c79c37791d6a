"""Which ResourceSlice layout the API server takes, found by asking it rather than assumed.

Three things decide what discovery may publish, and a version number alone tells none of them
for sure (feature gates differ between clusters of the same version):

- the served versions of `resource.k8s.io` (discovery): Tangram writes `v1` only;
- which layout the server validates: 1.34 wants a counter set in the slice of the devices that
  consume it, 1.35 and later want counter sets in slices of their own. The server's version says
  which to try first; a server-side dry-run of a small probe slice in that layout confirms it (a
  refused probe tries the other layouts);
- whether the server keeps what it is sent: with `DRAPartitionableDevices` off the API server
  silently drops `sharedCounters` and `consumesCounters`, with `DRADeviceTaints` off it drops
  device taints, with `DRAConsumableCapacity` off it drops `allowMultipleAllocations`. The
  dry-run answer shows whether they survived.

Without partitionable devices Tangram degrades to whole GPUs and existing MIG instances only;
without taints it leaves unhealthy devices out instead of offering them untainted; without
consumable capacity (or without counters, which keep a share host and its exclusive device apart)
it publishes no share host, and shares are asked for in Tangram's opaque config instead.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import ResourceApi, ResourceV1Api, VersionApi

from tangram.dra import node_devices, untainted_only, whole_devices_only
from tangram.events import NodeHardware
from tangram.kubernetes.api.client import KubeApiError, call
from tangram.kubernetes.objects import K8S_VERSIONS, K8sVersion, render_slices

log = logging.getLogger("tangram.kubernetes.api.layout")

_GROUP = "resource.k8s.io"
_MINOR = re.compile(r"^(\d+)")


class LayoutError(RuntimeError):
    """The API server serves no ResourceSlice layout Tangram can write; the message says why."""


@dataclass(frozen=True, kw_only=True)
class SliceLayout:
    """What discovery publishes: the layout's version and which optional fields the server keeps."""

    k8s_version: K8sVersion
    partitionable: bool  # counter sets and devices consuming them (MIG placements) survive
    taints: bool  # device taints survive
    consumable: bool = False  # allowMultipleAllocations survives: share hosts can be published
    server_version: str = ""
    detected: bool = True  # False when the layout was given as an override

    @property
    def degraded(self) -> bool:
        return not self.partitionable


def layout_slices(
    layout: SliceLayout, hardware: NodeHardware, *, generation: int, driver: str
) -> list[dict[str, Any]]:
    """The node's ResourceSlices as a server of `layout` keeps them: without partitionable devices,
    whole GPUs and existing MIG instances only; without device taints, no taints (raises
    SliceRenderError when they cannot be rendered)."""
    devices = node_devices(hardware, driver=driver, shared=layout.consumable and layout.partitionable)
    if not layout.partitionable:
        devices = whole_devices_only(devices)
    if not layout.taints:
        devices = untainted_only(devices)
    return render_slices(devices, k8s_version=layout.k8s_version, generation=generation, driver=driver)


def layout_for_server(major: str, minor: str) -> K8sVersion:
    """The layout a server of this version validates: its own, clamped to the ones Tangram knows."""
    match = _MINOR.match(minor)
    if major != "1" or match is None:
        raise LayoutError(f"unrecognised Kubernetes version {major}.{minor}")
    number = int(match.group(1))
    known = sorted(int(v.split(".")[1]) for v in K8S_VERSIONS)
    if number < known[0]:
        raise LayoutError(
            f"Kubernetes 1.{number} does not serve resource.k8s.io/v1; Tangram needs 1.34 or later"
        )
    chosen = max(v for v in known if v <= number)
    return f"1.{chosen}"  # type: ignore[return-value]


def probe_slices(layout: K8sVersion, *, node: str, driver: str) -> list[dict[str, Any]]:
    """The smallest pool that shows what the server keeps: a counter set and a tainted device consuming it."""
    suffix = secrets.token_hex(4)
    counters = {"name": "probe", "counters": {"slice": {"value": "1"}}}
    device = {
        "name": "probe",
        "consumesCounters": [{"counterSet": "probe", "counters": {"slice": {"value": "1"}}}],
        "taints": [{"key": f"{driver}/probe", "effect": "NoSchedule"}],
        "allowMultipleAllocations": True,
    }

    def body(index: int, spec: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": f"{_GROUP}/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"tangram-layout-probe-{suffix}-{index}"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": f"tangram-layout-probe-{suffix}", "generation": 1, "resourceSliceCount": 1},
                **spec,
            },
        }

    if layout == "1.34":
        return [body(0, {"sharedCounters": [counters], "devices": [device]})]
    # 1.35 and later: the device slice alone is what may lose fields; the counter slice is checked too
    return [body(0, {"sharedCounters": [counters]}), body(1, {"devices": [device]})]


async def served_versions(api: Any) -> list[str]:
    group = await call(f"discover {_GROUP}", ResourceApi(api).get_api_group())
    return [v.version for v in group.versions]


async def detect_layout(api: Any, *, node: str, driver: str) -> SliceLayout:
    """Ask the server (discovery, version, then dry-run probes) which layout it takes and what it keeps."""
    try:
        versions = await served_versions(api)
    except KubeApiError as error:
        if error.not_found:
            raise LayoutError(
                f"the API server does not serve {_GROUP}: enable DynamicResourceAllocation"
            ) from error
        raise
    if "v1" not in versions:
        raise LayoutError(
            f"the API server serves {_GROUP} {', '.join(versions) or 'in no version'}, "
            "Tangram writes v1 (Kubernetes 1.34 or later)"
        )
    info = await call("read the API server version", VersionApi(api).get_code())
    server_version = str(info.git_version)
    first = layout_for_server(str(info.major), str(info.minor))
    candidates = [first, *(v for v in reversed(K8S_VERSIONS) if v != first)]
    refusals: list[str] = []
    for layout in candidates:
        kept = await _dry_run(api, probe_slices(layout, node=node, driver=driver))
        if kept is None:
            refusals.append(layout)
            continue
        partitionable, taints, consumable = kept
        return SliceLayout(
            k8s_version=layout,
            partitionable=partitionable,
            taints=taints,
            consumable=consumable,
            server_version=server_version,
        )
    raise LayoutError(
        f"the API server ({server_version}) refused the probe slice of every layout: {refusals}"
    )


async def _dry_run(api: Any, slices: list[dict[str, Any]]) -> tuple[bool, bool, bool] | None:
    """(counters kept, taints kept, multiple allocations kept) from the server's dry-run answers;
    None when it refuses the layout."""
    resource = ResourceV1Api(api)
    counters_kept = taints_kept = multiple_kept = True
    for body in slices:
        try:
            response = await call(
                f"dry-run create ResourceSlice {body['metadata']['name']}",
                resource.create_resource_slice(body, dry_run="All", _preload_content=False),
            )
        except KubeApiError as error:
            if error.status == 422:  # Invalid: this server validates another layout
                log.debug("layout probe refused", extra={"error": str(error)})
                return None
            raise
        created = json.loads(await response.read())
        spec = created.get("spec", {})
        if "sharedCounters" in body["spec"]:
            counters_kept = counters_kept and bool(spec.get("sharedCounters"))
        for device in spec.get("devices", []):
            counters_kept = counters_kept and bool(device.get("consumesCounters"))
            taints_kept = taints_kept and bool(device.get("taints"))
            multiple_kept = multiple_kept and bool(device.get("allowMultipleAllocations"))
    return counters_kept, taints_kept, multiple_kept


def overridden(k8s_version: K8sVersion) -> SliceLayout:
    """A layout given on the command line: trusted as is, every field assumed kept that the
    release keeps by default."""
    # consumable capacity is on by default from 1.36 only; earlier releases are assumed without it
    consumable = int(k8s_version.split(".")[1]) >= 36
    return SliceLayout(
        k8s_version=k8s_version, partitionable=True, taints=True, consumable=consumable, detected=False
    )


def announce(layout: SliceLayout, node: str) -> None:
    """One log line that says which layout was chosen and, when degraded, what that means."""
    fields = {
        "node": node,
        "layout": layout.k8s_version,
        "server": layout.server_version,
        "detected": layout.detected,
        "partitionable": layout.partitionable,
        "taints": layout.taints,
        "consumable": layout.consumable,
    }
    if layout.degraded:
        log.warning(
            "partitionable devices are off on this API server (feature gate DRAPartitionableDevices): "
            "publishing whole GPUs and existing MIG instances only; no MIG instance is created on demand",
            extra=fields,
        )
    else:
        log.info("ResourceSlice layout chosen", extra=fields)
    if not (layout.consumable and layout.partitionable):
        log.info(
            "consumable capacity (feature gate DRAConsumableCapacity) or partitionable devices are "
            "off on this API server: no share host is published; shares are decided by Tangram "
            "from the SharingConfig in a claim",
            extra=fields,
        )
    if not layout.taints:
        log.warning(
            "device taints are off on this API server (feature gate DRADeviceTaints): "
            "unhealthy devices are left out of the slices instead of tainted",
            extra=fields,
        )
