"""A driver root laid out as the driver's installer leaves it, for simulated nodes and tests.

Libraries are real files named by the full driver version with their soname links, as on a
node; device nodes are plain files since only their presence is looked at.

`python -m tangram.cdi.simroot ROOT --machine NAME` lays one out for a simulated machine's driver,
where a simulated node runs in containers (docker-compose.yml), as the driver's installer would.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tangram.hardware.machines import MachineError, load_machine

LIBRARY_DIR = "usr/lib/x86_64-linux-gnu"
# (library, soname link or "" where the library's soname is its versioned name)
LIBRARIES = (
    ("libcuda.so", "libcuda.so.1"),
    ("libcudadebugger.so", "libcudadebugger.so.1"),
    ("libnvidia-ml.so", "libnvidia-ml.so.1"),
    ("libnvidia-ptxjitcompiler.so", "libnvidia-ptxjitcompiler.so.1"),
    ("libnvidia-nvvm.so", "libnvidia-nvvm.so.4"),
    ("libnvidia-opencl.so", "libnvidia-opencl.so.1"),
    ("libnvidia-cfg.so", "libnvidia-cfg.so.1"),
    ("libnvidia-allocator.so", "libnvidia-allocator.so.1"),
    ("libnvidia-gpucomp.so", ""),
)
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
DEVICE_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


def lay_out_driver_root(
    root: Path, version: str, *, gpu_minors: range = range(8), cap_minors: range = range(0)
) -> Path:
    """Write a driver install of `version` under `root` (idempotent); returns `root`."""
    libdir = root / LIBRARY_DIR
    libdir.mkdir(parents=True, exist_ok=True)
    for library, soname in LIBRARIES:
        real = libdir / f"{library}.{version}"
        real.write_bytes(b"\x7fELF")
        for link, target in ((soname, real.name), (library, soname)):
            if link and target and not (libdir / link).is_symlink():
                (libdir / link).symlink_to(target)
    bindir = root / "usr/bin"
    bindir.mkdir(parents=True, exist_ok=True)
    for binary in BINARIES:
        (bindir / binary).write_bytes(b"\x7fELF")
        (bindir / binary).chmod(0o755)
    firmware = root / "lib/firmware/nvidia" / version
    firmware.mkdir(parents=True, exist_ok=True)
    for name in FIRMWARE:
        (firmware / name).write_bytes(b"gsp")
    dev = root / "dev"
    (dev / "nvidia-caps").mkdir(parents=True, exist_ok=True)
    for node in (*DEVICE_NODES, *(f"nvidia{minor}" for minor in gpu_minors)):
        (dev / node).touch()
    for minor in cap_minors:
        (dev / "nvidia-caps" / f"nvidia-cap{minor}").touch()
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tangram.cdi.simroot", description=__doc__)
    parser.add_argument("root", type=Path, help="the folder to lay the driver install out in")
    parser.add_argument("--machine", required=True, help="a shipped machine name or a machine YAML file")
    args = parser.parse_args(argv)
    try:
        version = load_machine(args.machine).driver_version
        lay_out_driver_root(args.root, version)
    except (MachineError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"driver {version} laid out in {args.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
