"""Fleets and claim traces shared by the allocator benchmarks: deterministic for a seed.

A trace is a list of arrivals and departures. Each arrival has a lifetime counted in arrivals, so
the number of claims alive settles near the mean lifetime (Little's law) whatever the policy does;
a departure of a claim the policy did not admit releases nothing.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from typing import Any

import msgspec

from tangram import DRIVER_NAME
from tangram.allocation import DeviceClass
from tangram.events.inventory import GpuInfo, NodeHardware, renamed_machine

GPU_CLASS = "gpu.tangram.dev"
MIG_CLASS = "mig.gpu.tangram.dev"
SHARED_CLASS = "shared.gpu.tangram.dev"
# A share's demand in GPUs, for sizing traces: its memory over this much
SHARE_GPU_GIB = 48


@dataclass(frozen=True, slots=True)
class ClaimShape:
    """What a claim asks for: `count` whole GPUs (NVLink-connected when `nvlink`), one MIG device
    of `compute` compute slices and `slices` memory slices (never the media-extensions profile), or
    a share of `memory_gib` of one device (and `percent` of its compute when not 0)."""

    kind: str  # "gpu" | "mig" | "share"
    count: int = 1
    nvlink: bool = False
    compute: int = 0
    slices: int = 0
    memory_gib: int = 0
    percent: int = 0

    @property
    def label(self) -> str:
        if self.kind == "gpu":
            return f"{self.count}gpu" + ("-nvlink" if self.nvlink else "")
        if self.kind == "share":
            return f"share-{self.memory_gib}gib" + (f"-{self.percent}pct" if self.percent else "")
        return f"mig-{self.compute}g-{self.slices}s"

    def gpus(self, slices_per_gpu: int = 8) -> float:
        """Demand in GPUs: MIG claims count their share of a GPU's memory slices, shares their
        memory over SHARE_GPU_GIB."""
        if self.kind == "share":
            return self.memory_gib / SHARE_GPU_GIB
        return float(self.count) if self.kind == "gpu" else self.slices / slices_per_gpu


@dataclass(frozen=True, slots=True)
class Arrival:
    uid: str
    shape: ClaimShape


@dataclass(frozen=True, slots=True)
class Departure:
    uid: str


Op = Arrival | Departure

# (shape, weight): whole-GPU claims of 1/2/4/8 (multi-GPU ones ask for NVLink) and MIG claims.
FLEET_MIX: tuple[tuple[ClaimShape, float], ...] = (
    (ClaimShape("gpu", 1), 0.20),
    (ClaimShape("gpu", 2, nvlink=True), 0.10),
    (ClaimShape("gpu", 4, nvlink=True), 0.06),
    (ClaimShape("gpu", 8, nvlink=True), 0.03),
    (ClaimShape("mig", compute=1, slices=1), 0.25),
    (ClaimShape("mig", compute=1, slices=2), 0.06),
    (ClaimShape("mig", compute=2, slices=2), 0.14),
    (ClaimShape("mig", compute=3, slices=4), 0.12),
    (ClaimShape("mig", compute=4, slices=4), 0.04),
)
# Small mixed fleets: NVLink is not everywhere, so multi-GPU claims do not all ask for it.
QUALITY_MIX: tuple[tuple[ClaimShape, float], ...] = (
    (ClaimShape("gpu", 1), 0.22),
    (ClaimShape("gpu", 2, nvlink=True), 0.10),
    (ClaimShape("gpu", 2), 0.05),
    (ClaimShape("gpu", 4), 0.06),
    (ClaimShape("gpu", 8, nvlink=True), 0.02),
    (ClaimShape("mig", compute=1, slices=1), 0.25),
    (ClaimShape("mig", compute=1, slices=2), 0.05),
    (ClaimShape("mig", compute=2, slices=2), 0.12),
    (ClaimShape("mig", compute=3, slices=4), 0.10),
    (ClaimShape("mig", compute=4, slices=4), 0.03),
)

# The quality benchmark's demand on mixed fleets: MIG 1g/2g/3g/4g, whole 1/2/4/8 GPUs, multi-GPU
# claims mostly on NVLink, and enough 8-GPU NVLink claims that keeping NVSwitch nodes whole matters.
BENCH_MIX: tuple[tuple[ClaimShape, float], ...] = (
    (ClaimShape("gpu", 1), 0.20),
    (ClaimShape("gpu", 2, nvlink=True), 0.08),
    (ClaimShape("gpu", 2), 0.04),
    (ClaimShape("gpu", 4, nvlink=True), 0.05),
    (ClaimShape("gpu", 4), 0.02),
    (ClaimShape("gpu", 8, nvlink=True), 0.04),
    (ClaimShape("mig", compute=1, slices=1), 0.24),
    (ClaimShape("mig", compute=1, slices=2), 0.04),
    (ClaimShape("mig", compute=2, slices=2), 0.12),
    (ClaimShape("mig", compute=3, slices=4), 0.10),
    (ClaimShape("mig", compute=4, slices=4), 0.03),
)


def mean_demand(mix: tuple[tuple[ClaimShape, float], ...]) -> float:
    total = sum(weight for _, weight in mix)
    return sum(shape.gpus() * weight for shape, weight in mix) / total


def _lifetime(rng: random.Random, mean: float) -> int:
    return max(1, round(rng.expovariate(1.0 / mean)))


def churn_trace(
    seed: int, claims: int, mean_alive: float, mix: tuple[tuple[ClaimShape, float], ...] = FLEET_MIX
) -> list[Op]:
    """`claims` arrivals, each departing after an exponential number of later arrivals."""
    if claims < 0 or mean_alive <= 0:
        raise ValueError("claims must be >= 0 and mean_alive > 0")
    rng = random.Random(seed)  # noqa: S311 - a reproducible trace, not a secret
    shapes = [shape for shape, _ in mix]
    weights = [weight for _, weight in mix]
    ops: list[Op] = []
    due: list[tuple[int, str]] = []
    for n in range(claims):
        while due and due[0][0] <= n:
            ops.append(Departure(heapq.heappop(due)[1]))
        uid = f"claim-{seed}-{n}"
        ops.append(Arrival(uid, rng.choices(shapes, weights)[0]))
        heapq.heappush(due, (n + _lifetime(rng, mean_alive), uid))
    return ops


def saturating_trace(
    seed: int,
    capacity_gpus: float,
    *,
    churn_claims: int,
    churn_load: float = 0.6,
    saturation: float = 1.0,
    mix: tuple[tuple[ClaimShape, float], ...] = QUALITY_MIX,
) -> list[Op]:
    """Churn at `churn_load` of capacity, then arrivals only until the claims alive ask for
    `saturation` x the fleet's GPUs: the end of the trace is the saturation point."""
    mean_alive = max(1.0, churn_load * capacity_gpus / mean_demand(mix))
    ops = churn_trace(seed, churn_claims, mean_alive, mix)
    alive = alive_at_end(ops)
    demand = sum(shape.gpus() for shape in alive.values())
    rng = random.Random(seed * 7919 + 1)  # noqa: S311 - a reproducible trace
    shapes = [shape for shape, _ in mix]
    weights = [weight for _, weight in mix]
    n = churn_claims
    while demand < saturation * capacity_gpus:
        shape = rng.choices(shapes, weights)[0]
        ops.append(Arrival(f"claim-{seed}-{n}", shape))
        demand += shape.gpus()
        n += 1
    return ops


def alive_at_end(ops: list[Op]) -> dict[str, ClaimShape]:
    """The claims that arrived and did not depart, in arrival order."""
    alive: dict[str, ClaimShape] = {}
    for op in ops:
        if isinstance(op, Arrival):
            alive[op.uid] = op.shape
        else:
            alive.pop(op.uid, None)
    return alive


# --- claims as DRA sees them ---------------------------------------------------------------------


def claim_spec(shape: ClaimShape, driver: str = DRIVER_NAME) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceClaim spec asking for the shape."""
    if shape.kind == "share":
        return share_claim_spec(shape, driver)
    if shape.kind == "gpu":
        exactly: dict[str, Any] = {"deviceClassName": GPU_CLASS, "count": shape.count}
    else:
        attrs = f'device.attributes["{driver}"]'
        expression = (
            f'{attrs}.profile.startsWith("{shape.compute}g.") && {attrs}.placementSize == {shape.slices}'
            f' && !{attrs}.profile.endsWith("+me")'
        )
        exactly = {"deviceClassName": MIG_CLASS, "selectors": [{"cel": {"expression": expression}}]}
    devices: dict[str, Any] = {"requests": [{"name": "gpus", "exactly": exactly}]}
    if shape.nvlink:
        devices["config"] = [
            {
                "requests": ["gpus"],
                "opaque": {
                    "driver": driver,
                    "parameters": {
                        "apiVersion": "gpu.tangram.dev/v1alpha1",
                        "kind": "TopologyConfig",
                        "interconnect": "NVLink",
                    },
                },
            }
        ]
    return {"devices": devices}


def share_claim_spec(shape: ClaimShape, driver: str = DRIVER_NAME) -> dict[str, Any]:
    """One share: its memory as a capacity request, its compute in Tangram's SharingConfig."""
    exactly = {
        "deviceClassName": SHARED_CLASS,
        "capacity": {"requests": {"memory": f"{shape.memory_gib}Gi"}},
    }
    devices: dict[str, Any] = {"requests": [{"name": "share", "exactly": exactly}]}
    if shape.percent:
        parameters = {
            "apiVersion": "gpu.tangram.dev/v1alpha1",
            "kind": "SharingConfig",
            "computePercent": shape.percent,
        }
        devices["config"] = [{"requests": ["share"], "opaque": {"driver": driver, "parameters": parameters}}]
    return {"devices": devices}


def shipped_classes() -> dict[str, DeviceClass]:
    from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes  # noqa: PLC0415

    classes = [DeviceClass.from_manifest(m) for m in load_shipped_device_classes()]
    return {c.name: c for c in classes}


# --- fleets --------------------------------------------------------------------------------------


def machine_hardware(machine: str, *, keep_instances: bool = False) -> NodeHardware:
    """One machine as discovery reports it. Unless `keep_instances`, a clean copy: no MIG instances,
    and MIG mode off where it can be toggled without a reset (Hopper and newer)."""
    from tangram.nvml import SimNvml  # noqa: PLC0415 - simulated NVML only for fleets
    from tangram.nvml.inventory import read_node_hardware  # noqa: PLC0415

    nvml = SimNvml.from_machine(machine)
    nvml.nvmlInit()
    hw = read_node_hardware(nvml, "template")
    if keep_instances:
        return hw
    return msgspec.structs.replace(hw, gpus=[_clean(g) for g in hw.gpus])


def _clean(gpu: GpuInfo) -> GpuInfo:
    enabled = gpu.mig_enabled and gpu.mig_toggle_needs_reset
    return msgspec.structs.replace(gpu, mig_instances=[], mig_enabled=enabled)


def build_fleet(machines: list[tuple[str, int]], *, keep_instances: bool = False) -> list[NodeHardware]:
    """`count` nodes of each machine, named `<machine>-<n>`, each with its own GPU UUIDs."""
    nodes: list[NodeHardware] = []
    for machine, count in machines:
        template = machine_hardware(machine, keep_instances=keep_instances)
        nodes.extend(renamed_machine(template, f"{machine}-{n}") for n in range(count))
    return nodes


def fleet_gpus(nodes: list[NodeHardware]) -> int:
    return sum(len(hw.gpus) for hw in nodes)
