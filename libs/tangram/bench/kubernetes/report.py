"""What a run of `tangram bench kubernetes` saw, and what it reports (pure): each pod's times, the
allocations laid on the nodes' hardware, a run's figures, the ratios of two runs and the table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tangram import DRIVER_NAME
from tangram.allocation import Allocated, FleetState, NvlinkTally
from tangram.bench.traces import ClaimShape
from tangram.events.inventory import NodeHardware
from tangram.stats import percentiles


@dataclass
class PodRecord:
    """One pod of the run; times are seconds on the run's monotonic clock."""

    name: str
    shape: ClaimShape
    created: float
    node: str | None = None
    scheduled: float | None = None  # first seen bound to a node
    prepared: float | None = None  # first seen Running: its claim prepared by the node
    unplaceable: str | None = None  # why the decider could not place it (last seen)
    unplaceable_at: float | None = None

    def declared_unplaceable(self, why: str, at: float) -> None:
        """The decider says it cannot place the pod (again): its latest reason, its first time."""
        self.unplaceable, self.unplaceable_at = why, self.unplaceable_at or at

    @property
    def decided(self) -> float | None:
        if self.scheduled is not None:
            return self.scheduled
        return self.unplaceable_at


class PlacementTally:
    """The allocations read back from the API server, laid on the nodes' hardware: stranded GPUs
    and, per multi-GPU claim, whether its GPUs are the best NVLink set (available, and ideal)."""

    def __init__(self, hardware: list[NodeHardware], driver: str = DRIVER_NAME) -> None:
        self.fleet = FleetState(driver=driver)
        for hw in hardware:
            self.fleet.apply_inventory(hw)
        self.nvlink = NvlinkTally()

    def placed(self, uid: str, node_name: str, devices: list[tuple[str, str]]) -> None:
        """A claim's devices, (request, device name) of the node's pool, as the decider chose them."""
        node = self.fleet.node(node_name)
        if node is not None:
            shape = node.shape
            chosen = [shape.devices[shape.index_by_name[d]] for _, d in devices if d in shape.index_by_name]
            gpus = {d.gpu_index for d in chosen if d.kind == "gpu"}
            if len(gpus) > 1:
                score = shape.pairs.set_score(gpus)
                offered = {index for index, free in node.whole_free.items() if free}
                best_available = max(score, shape.pairs.best_set_score(offered | gpus, len(gpus)))
                self.nvlink.count(
                    Allocated(
                        claim_uid=uid,
                        node=node_name,
                        devices=[],
                        set_score=score,
                        ideal_set_score=shape.best_set_score(len(gpus)),
                        best_available_set_score=best_available,
                    )
                )
        self.fleet.adopt_prepared(uid, node_name, devices)

    def released(self, uid: str) -> None:
        self.fleet.release(uid, destroy_mig=False)

    def stranded_gpus(self) -> float:
        return self.fleet.metrics().stranded_gpus


def latency_ms(seconds: list[float]) -> dict[str, float | None]:
    if not seconds:
        return {"p50_ms": None, "p99_ms": None}
    return dict(percentiles([s * 1000 for s in seconds]))


def run_report(
    records: list[PodRecord], *, stranded_gpus: float, nvlink: NvlinkTally, departures: int
) -> dict[str, Any]:
    """A run's figures from its pods in creation order. `stranded_gpus` is what the fleet had
    stranded when the first unplaceable pod came (at the end when none did); `nvlink` counts the
    multi-GPU claims of the whole run."""
    first = next((n for n, r in enumerate(records) if r.scheduled is None), None)
    admitted = records if first is None else records[:first]
    scheduled = [r for r in records if r.scheduled is not None]
    decided = [r for r in records if r.decided is not None]
    decision_s = sum(r.decided - r.created for r in decided if r.decided is not None)
    failed = records[first] if first is not None else None
    return {
        "pods_created": len(records),
        "pods_deleted": departures,  # departures of the trace (unplaceable pods are deleted too)
        "pods_scheduled": len(scheduled),
        "pods_unplaceable": len(records) - len(scheduled),
        "admitted_before_first_unplaceable": len(admitted),
        "first_unplaceable": None
        if failed is None
        else {"pod": failed.name, "claim": failed.shape.label, "reason": failed.unplaceable or ""},
        "admitted_gpus": round(sum(r.shape.gpus() for r in admitted), 3),
        "stranded_gpus": stranded_gpus,
        **nvlink.report(),
        "create_to_scheduled": latency_ms(
            [r.scheduled - r.created for r in scheduled if r.scheduled is not None]
        ),
        "create_to_prepared": latency_ms(
            [r.prepared - r.created for r in scheduled if r.prepared is not None]
        ),
        "prepared": sum(r.prepared is not None for r in scheduled),
        # scheduled pods never seen prepared (before their deletion, or by the end of the wait)
        "not_prepared": sum(r.prepared is None for r in scheduled),
        "decisions": len(decided),
        # One pod at a time: decisions over the time spent waiting for them.
        "decisions_per_s": round(len(decided) / decision_s, 2) if decision_s > 0 else None,
    }


RATIO_KEYS = (
    "admitted_before_first_unplaceable",
    "stranded_gpus",
    "multi_gpu_ideal_set_share",
    "multi_gpu_nvlink_optimal_share",
    "decisions_per_s",
)
LATENCY_KEYS = ("create_to_scheduled", "create_to_prepared")


def _ratio(a: Any, b: Any) -> float | None:
    if a is None or not b:
        return None
    return round(float(a) / float(b), 4)


def ratios(tangram: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, float | None]:
    """tangram / kube-scheduler per figure; None where the baseline is 0 or missing."""

    out = {key: _ratio(tangram.get(key), baseline.get(key)) for key in RATIO_KEYS}
    for key in LATENCY_KEYS:
        for p in ("p50_ms", "p99_ms"):
            out[f"{key}_{p}"] = _ratio(tangram[key][p], baseline[key][p])
    return out


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _grid(deciders: list[str], rows: list[tuple[str, list[Any], Any]], *, with_ratio: bool) -> list[str]:
    """The figures' rows under a header, one column per decider (and one for the ratio), aligned."""
    header = ["", *deciders, *(["tangram / kube-scheduler"] if with_ratio else [])]
    lines = [[label, *map(_cell, values), *([_cell(r)] if with_ratio else [])] for label, values, r in rows]
    widths = [max(len(str(row[i])) for row in [header, *lines]) for i in range(len(header))]
    return [
        "  ".join(
            str(cell).ljust(widths[i]) if i == 0 else str(cell).rjust(widths[i]) for i, cell in enumerate(row)
        )
        for row in [header, *lines]
    ]


def table(result: Mapping[str, Any]) -> str:
    """The report as a table: one row per figure, one column per decider (and the ratio)."""
    runs = result["runs"]
    deciders = list(runs)
    ratio = result.get("tangram_over_kube_scheduler")
    rows: list[tuple[str, list[Any], Any]] = []
    for key, label in (
        ("pods_created", "pods created"),
        ("pods_scheduled", "pods scheduled"),
        ("pods_unplaceable", "pods unplaceable"),
        ("pods_deleted", "pods deleted"),
        ("admitted_before_first_unplaceable", "admitted before first unplaceable"),
        ("admitted_gpus", "GPUs they asked for"),
        ("stranded_gpus", "stranded GPUs then"),
        ("multi_gpu_claims", "multi-GPU claims"),
        ("multi_gpu_ideal_set_share", "on an ideal NVLink set"),
        ("multi_gpu_nvlink_optimal_share", "on the best NVLink set available"),
        ("decisions_per_s", "decisions/s"),
        ("not_prepared", "scheduled, never prepared"),
    ):
        rows.append((label, [runs[d][key] for d in deciders], ratio.get(key) if ratio else None))
    for key, label in (
        ("create_to_scheduled", "create -> scheduled"),
        ("create_to_prepared", "create -> prepared"),
    ):
        for p in ("p50_ms", "p99_ms"):
            rows.append(
                (
                    f"{label} {p[:3]} ms",
                    [runs[d][key][p] for d in deciders],
                    ratio.get(f"{key}_{p}") if ratio else None,
                )
            )
    out = [
        f"tangram bench kubernetes: seed {result['seed']}, {result['gpus']} GPUs on "
        + ", ".join(f"{n} ({m})" for n, m in result["nodes"].items())
        + f", {result['trace_pods']} pods in the trace",
        *_grid(deciders, rows, with_ratio=bool(ratio)),
    ]
    for d in deciders:
        first = runs[d]["first_unplaceable"]
        if first is not None:
            out.append(f"{d}: first unplaceable {first['pod']} ({first['claim']}): {first['reason']}")
    return "\n".join(out)


SYNTHETIC_RATIO_KEYS = (
    "pods_scheduled_per_s",
    "api_requests_per_pod",
    "pods_scheduled",
    "admitted_before_first_unplaceable",
    "stranded_gpus",
    "multi_gpu_ideal_set_share",
    "multi_gpu_nvlink_optimal_share",
)


def synthetic_ratios(tangram: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, float | None]:
    """tangram / kube-scheduler per figure of a synthetic-nodes run; None where the baseline is 0
    or missing."""
    out = {key: _ratio(tangram.get(key), baseline.get(key)) for key in SYNTHETIC_RATIO_KEYS}
    for p in ("p50_ms", "p99_ms"):
        out[f"create_to_scheduled_{p}"] = _ratio(
            tangram["measured_create_to_scheduled"][p], baseline["measured_create_to_scheduled"][p]
        )
    return out


def synthetic_table(result: Mapping[str, Any]) -> str:
    """A synthetic-nodes run as a table: one row per figure, one column per decider (and the ratio)."""
    runs = result["runs"]
    deciders = list(runs)
    ratio = result.get("tangram_over_kube_scheduler") or {}
    rows: list[tuple[str, list[Any], Any]] = []
    for key, label in (
        ("pods_created", "pods created"),
        ("pods_scheduled", "pods scheduled"),
        ("pods_scheduled_per_s", "pods scheduled/s (measured phase)"),
        ("api_requests_per_pod", "API requests per pod"),
        ("admitted_before_first_unplaceable", "admitted before first unplaceable"),
        ("stranded_gpus", "stranded GPUs"),
        ("multi_gpu_ideal_set_share", "on an ideal NVLink set"),
        ("multi_gpu_nvlink_optimal_share", "on the best NVLink set available"),
        ("allocator_cpu_s_per_pod", "allocator CPU s per pod"),
        ("allocator_peak_rss_mb", "allocator peak RSS MB"),
    ):
        rows.append((label, [runs[d].get(key) for d in deciders], ratio.get(key)))
    for p in ("p50_ms", "p99_ms"):
        rows.append(
            (
                f"create -> scheduled {p[:3]} ms",
                [runs[d]["measured_create_to_scheduled"][p] for d in deciders],
                ratio.get(f"create_to_scheduled_{p}"),
            )
        )
    machines = ", ".join(f"{count} {machine}" for machine, count in result["machines"].items())
    title = (
        f"tangram bench kubernetes --synthetic-nodes: workload {result['workload']}, seed {result['seed']}, "
        f"{result['nodes']} nodes ({machines}), {result['gpus']} GPUs, concurrency {result['concurrency']}"
    )
    return "\n".join([title, *_grid(deciders, rows, with_ratio=bool(ratio))])
