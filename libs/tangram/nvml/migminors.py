"""MIG capability device minors: `/proc/driver/nvidia-caps/mig-minors`.

The driver numbers them statically: `config 1`, `monitor 2`, then for each GPU minor g, each GPU
instance id i (0..14) and each compute instance id c (0..7): `gpu<g>/gi<i>/access N` followed by
`gpu<g>/gi<i>/ci<c>/access N+1+c`. The simulator writes the same content, so one parser serves both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

MIG_MINORS_FILE = Path("/proc/driver/nvidia-caps/mig-minors")
GI_PER_GPU = 15
CI_PER_GI = 8
MAX_GPUS = 32

_LINE = re.compile(r"^(config|monitor|gpu(\d+)/gi(\d+)(?:/ci(\d+))?/access)\s+(\d+)$")


class MigMinorsError(ValueError):
    pass


def render_mig_minors(max_gpus: int = MAX_GPUS) -> str:
    lines = ["config 1", "monitor 2"]
    minor = 3
    for gpu in range(max_gpus):
        for gi in range(GI_PER_GPU):
            lines.append(f"gpu{gpu}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(CI_PER_GI):
                lines.append(f"gpu{gpu}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return "\n".join(lines) + "\n"


def parse_mig_minors(text: str) -> dict[str, int]:
    """Maps "gpu0/gi1/access" (and "config", "monitor") to its minor number."""
    minors: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        match = _LINE.match(line)
        if match is None:
            raise MigMinorsError(f"mig-minors line {number}: cannot parse {line[:80]!r}")
        minors[match.group(1)] = int(match.group(5))
    return minors


def mig_capability_minors(
    gpu_minor: int, gi_id: int, ci_id: int, *, minors_file: Path = MIG_MINORS_FILE
) -> tuple[int, int]:
    """(GPU-instance access minor, compute-instance access minor) for /dev/nvidia-caps/nvidia-cap<N>."""
    try:
        text = minors_file.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise MigMinorsError(f"cannot read {minors_file}: {exc}") from None
    minors = parse_mig_minors(text)
    gi_key = f"gpu{gpu_minor}/gi{gi_id}/access"
    ci_key = f"gpu{gpu_minor}/gi{gi_id}/ci{ci_id}/access"
    for key in (gi_key, ci_key):
        if key not in minors:
            raise MigMinorsError(f"{minors_file} has no entry {key}")
    return minors[gi_key], minors[ci_key]


def load_mig_minors(minors_file: Path | None = None, *, simulated: bool = False) -> dict[str, int]:
    """The capability minors table: the given file, the driver's own, or (simulated) the static one."""
    if minors_file is None and simulated:
        return parse_mig_minors(render_mig_minors())
    path = minors_file or MIG_MINORS_FILE
    try:
        return parse_mig_minors(path.read_text(encoding="ascii"))
    except (OSError, UnicodeDecodeError) as exc:
        raise MigMinorsError(f"cannot read the MIG capability minors from {path}: {exc}") from None


def capability_minors(minors: Mapping[str, int], gpu_minor: int, gi_id: int, ci_id: int) -> tuple[int, int]:
    """(GPU-instance minor, compute-instance minor), or (-1, -1) where the table has no entry."""
    gi = minors.get(f"gpu{gpu_minor}/gi{gi_id}/access", -1)
    ci = minors.get(f"gpu{gpu_minor}/gi{gi_id}/ci{ci_id}/access", -1)
    return gi, ci
