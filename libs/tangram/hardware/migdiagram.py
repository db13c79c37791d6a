"""A text picture of each GPU's MIG layout, one row of memory slices per GPU."""

from __future__ import annotations

from collections.abc import Mapping

from tangram.events.inventory import GpuInfo, NodeHardware

SLICE_WIDTH = 10


def _cell(label: str, slices: int) -> str:
    inner = slices * SLICE_WIDTH - 2
    return "[" + label[:inner].center(inner) + "]"


def render_gpu(gpu: GpuInfo, holders: Mapping[int, str] | None = None, whole: str = "") -> list[str]:
    """The GPU's memory slices; with `holders` (instance start -> who holds it), a row naming them.

    `whole` names who holds the GPU whole, when someone does.
    """
    title = f"GPU {gpu.index} {gpu.product} {gpu.memory_mib} MiB"
    held = f", whole GPU held by {whole}" if whole else ""
    if not gpu.mig_capable:
        return [f"{title}: no MIG (whole GPU only){held}"]
    if not gpu.mig_enabled:
        return [f"{title}: MIG off ({gpu.memory_slices} memory slices available once enabled){held}"]
    by_start = {m.placement.start: m for m in gpu.mig_instances}
    cells: list[str] = []
    owners: list[str] = []
    slice_index = 0
    while slice_index < gpu.memory_slices:
        inst = by_start.get(slice_index)
        if inst is None:
            cells.append(_cell("free", 1))
            owners.append(_cell("", 1))
            slice_index += 1
            continue
        label = inst.profile
        if inst.compute_instance_id < 0:
            label += " no CI"
        elif inst.in_use:
            label += " *"
        cells.append(_cell(label, inst.placement.size))
        owners.append(_cell((holders or {}).get(slice_index, ""), inst.placement.size))
        slice_index += inst.placement.size
    indent = " " * 4
    ruler = indent + "".join(f"{i:<{SLICE_WIDTH}}" for i in range(gpu.memory_slices)).rstrip()
    rows = [f"{title}: MIG on{held}", ruler, indent + "".join(cells)]
    if holders is not None:
        rows.append(indent + "".join(owners))
    return rows


def render_node(hw: NodeHardware) -> str:
    lines = [f"node {hw.node}  driver {hw.driver_version}  (* = in use, numbers = memory slices)"]
    for gpu in hw.gpus:
        lines.extend(render_gpu(gpu))
    return "\n".join(lines) + "\n"
