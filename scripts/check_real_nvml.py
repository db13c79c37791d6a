#!/usr/bin/env python3
"""Compare Tangram's real-NVML inventory with `nvidia-smi -q -x`. Read-only: it never changes MIG
mode, clocks or any other GPU setting. Exits 0 when they agree, 1 on differences, 2 without a driver.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

from tangram.events.inventory import NodeHardware
from tangram.nvml import NvmlUnavailable
from tangram.nvml.inventory import read_node_hardware
from tangram.nvml.real import RealNvml


def _smi() -> ET.Element:
    out = subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, text=True, timeout=60, check=True)
    return ET.fromstring(out.stdout)  # noqa: S314 - trusted local tool output


def _mib(text: str | None) -> int:
    return int((text or "0").split()[0]) if text and text.split()[0].isdigit() else 0


def compare(hw: NodeHardware, smi: ET.Element) -> list[str]:
    diffs: list[str] = []
    smi_gpus = smi.findall("gpu")
    if len(smi_gpus) != len(hw.gpus):
        diffs.append(f"GPU count: tangram {len(hw.gpus)}, nvidia-smi {len(smi_gpus)}")
    for gpu, node in zip(hw.gpus, smi_gpus, strict=False):
        want = {
            "name": node.findtext("product_name"),
            "uuid": node.findtext("uuid"),
            "memory MiB": _mib(node.findtext("fb_memory_usage/total")),
            "MIG mode": (node.findtext("mig_mode/current_mig") or "N/A") == "Enabled",
        }
        have = {"name": gpu.name, "uuid": gpu.uuid, "memory MiB": gpu.memory_mib, "MIG mode": gpu.mig_enabled}
        for key, value in want.items():
            if have[key] != value:
                diffs.append(f"GPU {gpu.index} {key}: tangram {have[key]!r}, nvidia-smi {value!r}")
        smi_mig = sorted(
            (int(m.findtext("gpu_instance_id") or -1), int(m.findtext("compute_instance_id") or -1))
            for m in node.findall("mig_devices/mig_device")
        )
        ours = sorted((m.gpu_instance_id, m.compute_instance_id) for m in gpu.mig_instances if m.uuid)
        if smi_mig != ours:
            diffs.append(f"GPU {gpu.index} MIG devices (GI, CI): tangram {ours}, nvidia-smi {smi_mig}")
    return diffs


def main() -> int:
    nvml = RealNvml()
    try:
        nvml.nvmlInit()
    except NvmlUnavailable as exc:
        print(f"check_real_nvml: {exc}", file=sys.stderr)
        return 2
    try:
        hw = read_node_hardware(nvml, "local")
    finally:
        nvml.nvmlShutdown()
    if shutil.which("nvidia-smi") is None:
        print("check_real_nvml: nvidia-smi not found; cannot compare", file=sys.stderr)
        return 2
    diffs = compare(hw, _smi())
    print(f"{len(hw.gpus)} GPU(s), driver {hw.driver_version}, {len(hw.links)} GPU pair(s)")
    for gpu in hw.gpus:
        mig = f"MIG {len(gpu.mig_instances)} instance(s)" if gpu.mig_enabled else "MIG off"
        print(f"  GPU {gpu.index} {gpu.name} {gpu.memory_mib} MiB {gpu.product} {mig}")
    for line in diffs:
        print(f"DIFF {line}")
    print("agree with nvidia-smi" if not diffs else f"{len(diffs)} difference(s)")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
