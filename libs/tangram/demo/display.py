"""What the demo shows a person: one readable line per event, and the closing summary as a table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tangram.events import (
    ClaimAllocated,
    ClaimFailed,
    ClaimPrepared,
    ClaimReleased,
    ClaimRequested,
    ClaimUnprepared,
    DeadLetter,
    DeviceHealthChanged,
    Event,
    NodeInventory,
    PartitionApplied,
    PartitionFailed,
    PartitionRequested,
)


def _slices(start: int, size: int) -> str:
    return f"slices {start}-{start + size - 1}"


def describe(event: Event) -> str:
    match event:
        case NodeInventory(hardware=hw):
            products = sorted({g.name for g in hw.gpus})
            migs = sum(len(g.mig_instances) for g in hw.gpus)
            return f"{hw.node}: {len(hw.gpus)} x {', '.join(products)}, {migs} MIG instances"
        case ClaimRequested():
            return f"{event.namespace}/{event.name}"
        case ClaimAllocated():
            devices = ", ".join(d.device for d in event.devices)
            return f"{event.namespace}/{event.name} -> {event.node}: {devices}"
        case ClaimFailed():
            return f"{event.namespace}/{event.name}: {event.reason}"
        case ClaimReleased():
            return f"{event.namespace}/{event.name}"
        case PartitionRequested() | PartitionApplied():
            slices = _slices(event.placement.start, event.placement.size)
            what = f"{event.action} {event.profile} on GPU {event.gpu_index} {slices}"
            if isinstance(event, PartitionApplied):
                return f"{event.node}: {what} -> {event.mig_uuid or 'done'} ({event.duration_ms:.1f} ms)"
            return f"{event.node}: {what}"
        case PartitionFailed():
            return f"{event.node}: {event.action} {event.profile}: {event.nvml_error} {event.reason}"
        case ClaimPrepared():
            ids = ", ".join(i for d in event.devices for i in d.cdi_device_ids)
            return f"{event.node}: {event.namespace}/{event.name} ready: {ids}"
        case ClaimUnprepared():
            return f"{event.node}: {event.namespace}/{event.name}"
        case DeviceHealthChanged():
            state = "healthy" if event.healthy else "unhealthy"
            return f"{event.node}: GPU {event.gpu_uuid} {state} {event.reason}"
        case DeadLetter():
            return f"{event.consumer}: {event.reason}"
        case _:
            return event.key


Row = tuple[str, str, str]  # label, value (right-aligned), unit or note
Section = tuple[str, Sequence[Row]]


def render_table(sections: Sequence[Section]) -> str:
    """Titled sections of rows, one column width for all of them so that the values line up."""
    rows = [row for _, section_rows in sections for row in section_rows]
    label_width = max((len(label) for label, _, _ in rows), default=0)
    value_width = max((len(value) for _, value, _ in rows), default=0)
    lines: list[str] = []
    for title, section_rows in sections:
        if not section_rows:
            continue
        lines += ["", title]
        lines += [
            f"  {label:<{label_width}}  {value:>{value_width}}  {unit}".rstrip()
            for label, value, unit in section_rows
        ]
    return "\n".join(lines[1:])


def _seconds(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, int | float) else "-"


def _ms(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "-"


def render_summary(summary: Mapping[str, Any]) -> str:
    """The demo's summary (the object `--json` prints) as a table with units, for a person."""
    churn = summary.get("churn", {})
    nodes: Mapping[str, str] = summary.get("nodes", {})
    run: list[Row] = [(f"node {name}", machine, "") for name, machine in nodes.items()]
    run += [
        (
            "start-up",
            _seconds(summary.get("startup_s")),
            "s  services up, inventories in, kubelet plugins listening",
        ),
        ("claims", _seconds(summary.get("claims_s")), "s  first claim to last MIG instance destroyed"),
        ("total", _seconds(summary.get("duration_s")), "s"),
    ]
    claims: list[Row] = [
        ("submitted", str(summary.get("claims", 0)), "claims"),
        ("allocated", str(summary.get("allocated", 0)), "claims"),
        ("ready", str(summary.get("ready", 0)), "claims  prepared: CDI spec written"),
        ("failed", str(summary.get("failed", 0)), "claims  with a reason (below)"),
        ("undecided", str(summary.get("undecided", 0)), "claims  no decision in time"),
        ("prepare failed", str(summary.get("prepare_failed", 0)), "claims"),
        ("released", str(summary.get("released", 0)), "claims"),
        ("churn arrivals", str(churn.get("claims", 0)), "claims"),
        ("churn departures", str(churn.get("releases", 0)), "claims"),
    ]
    mig: list[Row] = [
        (
            "created",
            str(summary.get("mig_created", 0)),
            f"instances  {churn.get('mig_created', 0)} during churn",
        ),
        (
            "destroyed",
            str(summary.get("mig_destroyed", 0)),
            f"instances  {churn.get('mig_destroyed', 0)} during churn",
        ),
        ("destroy refused", str(summary.get("mig_destroy_refused", 0)), "instances"),
        ("destroy pending", str(summary.get("mig_destroy_pending", 0)), "instances"),
    ]
    latency: list[Row] = []
    for label, key in (
        ("claim to ready", "claim_to_ready_ms"),
        ("partition applied", "partition_command_to_applied_ms"),
    ):
        percentiles = summary.get(key, {})
        for name in ("p50", "p99"):
            note = "ms" if key == "claim_to_ready_ms" else "ms  after its partition command"
            latency.append((f"{label} {name}", _ms(percentiles.get(name)), note))
    services: list[Row] = [
        (name, f"exit {code}", "" if code == 0 else "not a clean stop")
        for name, code in summary.get("services", {}).items()
    ]
    events: list[Row] = [(name, str(count), "events") for name, count in summary.get("events", {}).items()]
    table = render_table(
        [
            ("Run", run),
            ("Claims", claims),
            ("MIG instances", mig),
            ("Latency", latency),
            ("Services", services),
            ("Events on the bus", events),
        ]
    )
    reasons = [f"  {reason}" for reason in summary.get("failure_reasons", [])]
    return "\n".join([table, "", "Why claims failed", *reasons]) if reasons else table
