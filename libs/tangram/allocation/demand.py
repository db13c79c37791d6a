"""Expected demand: the claim log folded into a decayed mix of claim kinds, with a cold-start prior.

A claim kind is what a simple claim asks for (one request, one way to satisfy it, an exact count):
its class and selectors, how many devices, and whether they must be NVLink-connected. Two claims
of one kind are interchangeable for placement, so the mix says how much of each kind the fleet
should keep room for. Each claim noted adds 1 to its kind; every weight decays by DECAY per claim
noted, so the mix follows a workload that changes (half-life about 350 claims).

A claim is counted as it is decided, its own kind included, and taken out again when the
decision shows it says nothing about demand (`counts_as_demand`).

The prior stands in for history the allocator has not seen (a fresh cluster): a small fixed
pseudo-demand, PRIOR_CLAIMS claims in all, over whole GPUs of 1/2/4/8 (multi-GPU ones on NVLink)
and MIG devices of the 1g, 2g, 3g and 4g profiles. It never decays, so it fades relative to real demand
(steady state of the decayed mix: 1 / (1 - DECAY) = 500 claims) without ever reaching zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tangram.allocation.model import Allocated, Decision
from tangram.allocation.requests import Alternative, ResolvedClaim, covers

DECAY = 0.998
PRIOR_CLAIMS = 20.0
# (kind, whole GPUs or NVML GPU-instance profile id, NVLink, share of PRIOR_CLAIMS). MIG kinds are
# named by the profile ids every MIG GPU shares (19 1g, 15 1g with two memory slices, 14 2g,
# 9 3g, 5 4g), so that 4g, placeable at slice 0 only, is told apart from 3g of the same size.
PRIOR: tuple[tuple[str, int, bool, float], ...] = (
    ("gpu", 1, False, 0.20),
    ("gpu", 2, True, 0.10),
    ("gpu", 4, True, 0.06),
    ("gpu", 8, True, 0.04),
    ("mig", 19, False, 0.25),
    ("mig", 15, False, 0.05),
    ("mig", 14, False, 0.12),
    ("mig", 9, False, 0.12),
    ("mig", 5, False, 0.06),
)
_RESCALE_AT = 1e150


@dataclass(frozen=True, slots=True)
class ClaimKind:
    """What a simple claim asks for; `alt` None is a prior kind (any whole GPU, any MIG size)."""

    key: tuple[Any, ...]
    label: str
    alt: Alternative | None
    count: int  # whole GPUs, or MIG devices
    nvlink: bool
    min_bandwidth_gbps: float
    mig_profile: int = -1  # prior MIG kinds: the GPU-instance profile id

    @property
    def order(self) -> str:
        """A canonical order of kinds: sums over kinds run in it, so a rebuilt allocator adds in the
        same order as the one that died and gets bit-identical floats."""
        return repr(self.key)


def counts_as_demand(decision: Decision) -> bool:
    """A claim enters the mix once decided: when it was allocated, or failed only for want of free
    capacity. A claim at fault, or one no node could ever hold, says nothing about what the fleet
    should keep room for, and counting it would let one tenant's hostile claims shift every other
    tenant's placements."""
    return isinstance(decision, Allocated) or decision.cause == "capacity"


def prior_kinds() -> tuple[tuple[ClaimKind, float], ...]:
    out = []
    for kind, size, nvlink, share in PRIOR:
        if kind == "gpu":
            label = f"prior: {size} whole GPU{'s' if size > 1 else ''}{' on NVLink' if nvlink else ''}"
            claim_kind = ClaimKind(("prior", kind, size, nvlink), label, None, size, nvlink, 0.0)
        else:
            label = f"prior: MIG device of profile id {size}"
            claim_kind = ClaimKind(("prior", kind, size), label, None, 1, False, 0.0, mig_profile=size)
        out.append((claim_kind, share * PRIOR_CLAIMS))
    return tuple(out)


def claim_kind(claim: ResolvedClaim) -> ClaimKind | None:
    """The kind of a simple claim; None for claims with several requests, alternatives, constraints,
    admin access or allocationMode All, which the mix does not model."""
    if len(claim.requests) != 1 or claim.constraints:
        return None
    request = claim.requests[0]
    if len(request.alternatives) != 1:
        return None
    alt = request.alternatives[0]
    if alt.admin or alt.all_mode or alt.node_scoped or alt.count < 1:
        return None
    rules = [rule for rule in claim.topology if covers(rule.requests, alt)]
    nvlink = any(rule.nvlink for rule in rules)
    bandwidth = max((rule.min_bandwidth_gbps for rule in rules), default=0.0)
    return alternative_kind(alt, nvlink, bandwidth)


def alternative_kind(alt: Alternative, nvlink: bool, bandwidth: float) -> ClaimKind:
    """The kind of a claim of this one way to be satisfied: also how a ledger image names the
    kinds of its demand mix again (allocation.image)."""
    key = ("claim", alt.cache_key, alt.count, nvlink, bandwidth)
    selectors = sum(1 for where, _ in alt.selectors if where.startswith("request"))
    label = (
        f'{alt.count} x class "{alt.class_name}"'
        + (f" with {selectors} selector{'s' if selectors > 1 else ''}" if selectors else "")
        + (" on NVLink" if nvlink else "")
        + (f" >= {bandwidth:g} GB/s" if bandwidth else "")
    )
    return ClaimKind(key, label, alt, alt.count, nvlink, bandwidth)


@dataclass(frozen=True, slots=True)
class DemandSaved:
    value: dict[tuple[Any, ...], float]
    growth: float
    ticks: int
    kinds: dict[tuple[Any, ...], ClaimKind]


class Demand:
    """Decayed claim counts per kind. Pure: the same claims noted in the same order give the same
    weights, bit for bit, which is what lets a rebuilt allocator decide as the one that died."""

    def __init__(self) -> None:
        self._value: dict[tuple[Any, ...], float] = {}  # scaled: true weight = value * scale
        self._growth = 1.0  # DECAY ** -ticks since the last rescale
        self.ticks = 0
        self.prior: dict[tuple[Any, ...], float] = {}
        self.kinds: dict[tuple[Any, ...], ClaimKind] = {}
        for kind, weight in prior_kinds():
            self.prior[kind.key] = weight
            self.kinds[kind.key] = kind

    def note(self, kind: ClaimKind) -> bool:
        """Count one claim of this kind; True when the kind is new."""
        self.ticks += 1
        self._growth /= DECAY
        if self._growth > _RESCALE_AT:
            factor = 1.0 / self._growth
            for key in sorted(self._value, key=repr):
                self._value[key] *= factor
            self._growth = 1.0
        new = kind.key not in self.kinds
        if new:
            self.kinds[kind.key] = kind
        self._value[kind.key] = self._value.get(kind.key, 0.0) + self._growth
        return new

    def saved(self) -> DemandSaved:
        return DemandSaved(dict(self._value), self._growth, self.ticks, dict(self.kinds))

    def restore(self, saved: DemandSaved) -> None:
        """Back to exactly the weights saved: the same floats, not a recomputation of them."""
        self._value, self._growth, self.ticks, self.kinds = (
            dict(saved.value),
            saved.growth,
            saved.ticks,
            dict(saved.kinds),
        )

    def weight(self, key: tuple[Any, ...]) -> float:
        """Expected claims of this kind: decayed count plus prior."""
        return self._value.get(key, 0.0) / self._growth + self.prior.get(key, 0.0)

    def weights(self, keys: list[tuple[Any, ...]], supply: list[int]) -> list[float]:
        """weight() of each kind over its supply (at least 1), in order: the same floats, in one pass."""
        value, growth, prior = self._value, self._growth, self.prior
        return [
            (value.get(key, 0.0) / growth + prior.get(key, 0.0)) / (count if count > 1 else 1)
            for key, count in zip(keys, supply, strict=True)
        ]
