"""What the node's NVIDIA driver install offers a container: found by looking, never assumed.

The layout follows what the NVIDIA container toolkit discovers for its CDI specs: every
`*.so.<driver version>` library in the directory that holds `libcuda.so.<driver version>`, the
driver's utilities, the GSP firmware of that version and the control device nodes that exist.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

import msgspec

# Where distributions and the driver's .run installer put the user-space libraries, most specific first.
LIBRARY_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib64",
    "usr/lib",
    "lib",
)
BINARY_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin")
FIRMWARE_DIRS = ("lib/firmware/nvidia", "usr/lib/firmware/nvidia")
# The utilities the toolkit injects for compute workloads.
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
REQUIRED_CONTROL_NODE = "/dev/nvidiactl"
OPTIONAL_CONTROL_NODES = ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
_LIBCUDA = re.compile(r"^libcuda\.so\.(\d+(?:\.\d+)+)$")


class DriverRootError(ValueError):
    """The driver root does not hold a usable driver install; the message says what is missing."""


class DriverFiles(msgspec.Struct, frozen=True, kw_only=True):
    """Paths as the driver root has them (absolute, relative to that root), in a stable order."""

    version: str  # as the file names spell it, e.g. "580.95.05"
    library_dir: str
    libraries: tuple[str, ...]
    binaries: tuple[str, ...]
    firmware: tuple[str, ...]
    control_nodes: tuple[str, ...]


def version_key(version: str) -> tuple[int, ...]:
    """NVML says "580.95.05", inventories carry semver "580.95.5": compare the numbers."""
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError as error:
        raise DriverRootError(f"driver version {version!r} is not dotted numbers") from error


def _rooted(root: Path, path: Path) -> str:
    return str(PurePosixPath("/") / path.relative_to(root))


def _libcuda_versions(directory: Path) -> dict[tuple[int, ...], Path]:
    found: dict[tuple[int, ...], Path] = {}
    for candidate in sorted(directory.glob("libcuda.so.*")):
        match = _LIBCUDA.match(candidate.name)
        if match and candidate.is_file() and not candidate.is_symlink():
            found[version_key(match.group(1))] = candidate
    return found


def _find_libcuda(root: Path, expected_version: str | None) -> Path:
    seen: dict[tuple[int, ...], Path] = {}
    for relative in LIBRARY_DIRS:
        directory = root / relative
        if not directory.is_dir() or directory.is_symlink():
            continue  # lib64 -> usr/lib64 and friends: the real directory is searched itself
        versions = _libcuda_versions(directory)
        if expected_version is not None and version_key(expected_version) in versions:
            return versions[version_key(expected_version)]
        for key, path in versions.items():
            seen.setdefault(key, path)
    if expected_version is not None:
        present = ", ".join(p.name for p in seen.values()) or "none"
        raise DriverRootError(
            f"driver root {root} has no libcuda.so.{expected_version} for the driver NVML reports "
            f"(libcuda found: {present})"
        )
    if not seen:
        raise DriverRootError(
            f"driver root {root} has no libcuda.so.<version> in {', '.join(LIBRARY_DIRS)}: "
            "is it the root of a driver install?"
        )
    if len(seen) > 1:
        raise DriverRootError(
            f"driver root {root} holds several driver versions ({', '.join(p.name for p in seen.values())}); "
            "name the one NVML reports"
        )
    return next(iter(seen.values()))


def discover_driver(
    root: Path, *, expected_version: str | None = None, dev_root: Path | None = None
) -> DriverFiles:
    """The driver files under `root`; DriverRootError rather than a partial answer.

    `dev_root` is where the device nodes are looked for (the host's `/` even when the driver
    lives in a driver container); it defaults to `root`.
    """
    if not root.is_dir():
        raise DriverRootError(f"driver root {root} does not exist or is not a directory")
    libcuda = _find_libcuda(root, expected_version)
    version = libcuda.name.removeprefix("libcuda.so.")
    library_dir = libcuda.parent
    libraries = tuple(
        _rooted(root, path)
        for path in sorted(library_dir.glob(f"*.so.{version}"))
        if path.is_file() and not path.is_symlink()
    )
    binaries: list[str] = []
    for name in BINARIES:
        for relative in BINARY_DIRS:
            path = root / relative / name
            if path.is_file() and not (root / relative).is_symlink():
                binaries.append(_rooted(root, path))
                break
    firmware: list[str] = []
    for relative in FIRMWARE_DIRS:
        directory = root / relative / version
        if directory.is_dir() and not (root / relative).is_symlink():
            firmware = [_rooted(root, path) for path in sorted(directory.glob("gsp*.bin")) if path.is_file()]
            break
    devices = root if dev_root is None else dev_root
    if not (devices / REQUIRED_CONTROL_NODE.lstrip("/")).exists():
        raise DriverRootError(
            f"{devices / REQUIRED_CONTROL_NODE.lstrip('/')} is missing: is the driver loaded?"
        )
    control = [REQUIRED_CONTROL_NODE] + [
        node for node in OPTIONAL_CONTROL_NODES if (devices / node.lstrip("/")).exists()
    ]
    return DriverFiles(
        version=version,
        library_dir=_rooted(root, library_dir),
        libraries=libraries,
        binaries=tuple(binaries),
        firmware=tuple(firmware),
        control_nodes=tuple(control),
    )
