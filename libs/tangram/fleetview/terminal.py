"""The fleet picture for a terminal, drawn with rich: `tangram status` prints it, the demo keeps it live."""

from __future__ import annotations

import io
from collections.abc import Sequence

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tangram.fleetview.model import FleetView, ServiceHealth, nvlink_domains
from tangram.hardware.migdiagram import render_gpu

STATE_STYLE = {"pending": "yellow", "allocated": "cyan", "ready": "green", "failed": "red", "released": "dim"}


def fleet(view: FleetView, *, recent_claims: int = 12) -> RenderableType:
    parts: list[RenderableType] = [node_panel(view, name) for name in sorted(view.nodes)]
    if not view.nodes:
        parts.append(Text("no node inventory on the bus yet", style="yellow"))
    parts.append(claims_table(view, recent_claims))
    return Group(*parts)


def node_panel(view: FleetView, name: str) -> Panel:
    node = view.nodes[name]
    hw = node.hardware
    uses = view.uses(name)
    lines: list[str] = []
    for gpu in hw.gpus:
        use = uses[gpu.index]
        holders = {start: _short(claim) for start, claim in use.instances.items()}
        holders.update({start: "warm" for start in use.warm})
        rows = render_gpu(gpu, holders if gpu.mig_enabled else None, whole=use.whole or "")
        if gpu.uuid in node.unhealthy:
            rows[0] += f"  UNHEALTHY: {node.unhealthy[gpu.uuid]}"
        lines.extend(rows)
    domains = nvlink_domains(hw)
    if domains:
        lines.append(
            "NVLink domains: "
            + "; ".join(f"{d}: GPUs {', '.join(map(str, g))}" for d, g in sorted(domains.items()))
        )
    else:
        lines.append("NVLink domains: none (PCIe only)")
    free = sum(
        1
        for g in hw.gpus
        if uses[g.index].whole is None and not g.mig_instances and not uses[g.index].instances
    )
    title = f"{name}  {len(hw.gpus)} GPUs, {free} untouched  driver {hw.driver_version}"
    return Panel(Text("\n".join(lines)), title=title, title_align="left", expand=False)


def claims_table(view: FleetView, recent: int) -> Table:
    counts = view.counts()
    title = "claims  " + "  ".join(f"{state} {count}" for state, count in counts.items())
    table = Table(title=title, title_justify="left", show_lines=False)
    for column in ("claim", "state", "node", "devices / reason"):
        table.add_column(column)
    live = [c for c in view.claims.values() if c.state != "released"]
    live.sort(key=lambda c: (c.requested_at is None, c.requested_at), reverse=True)
    for claim in live[:recent]:
        detail = ", ".join(d.device for d in claim.devices) if claim.state != "failed" else claim.reason or ""
        table.add_row(claim.key, Text(claim.state, style=STATE_STYLE[claim.state]), claim.node or "", detail)
    return table


def services_table(services: Sequence[ServiceHealth]) -> Table:
    table = Table(title="services", title_justify="left")
    table.add_column("service")
    table.add_column("health")
    table.add_column("detail")
    style = {"ok": "green", "stale": "yellow", "down": "red", "unknown": "dim"}
    for service in services:
        table.add_row(service.name, Text(service.state, style=style.get(service.state, "")), service.detail)
    return table


def to_text(renderable: RenderableType, width: int = 120) -> str:
    """Rendered without colour: for files, pipes and tests."""
    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None, force_terminal=False).print(renderable)
    return buffer.getvalue()


def _short(claim: str) -> str:
    """The claim's name without its namespace: a one-slice cell has room for eight characters."""
    return claim.rsplit("/", 1)[-1]
