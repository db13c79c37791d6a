"""Builds the CDI spec of one prepared claim. Pure: no file access."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import msgspec

from tangram.cdi.devices import ResolvedAllocation, ResolvedDevice
from tangram.cdi.driver import DriverFiles
from tangram.cdi.names import validate_cdi_kind, validate_claim_uid, validate_device_name
from tangram.cdi.shares import share_edits
from tangram.cdi.versions import minimum_version

HOST_ROOT = PurePosixPath("/")
# Device files every CUDA process needs besides the GPU's own.
CONTROL_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
DEFAULT_HOOK_PATH = PurePosixPath("/usr/bin/nvidia-cdi-hook")
# As the toolkit mounts driver files: read-only, and nothing in them may act as a device or setuid.
DRIVER_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")


class CdiKind(msgspec.Struct, frozen=True, kw_only=True):
    vendor: str  # the driver name, e.g. gpu.tangram.dev
    cls: str = "claim"

    def __post_init__(self) -> None:
        validate_cdi_kind(f"{self.vendor}/{self.cls}")

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{self.cls}"

    def annotation(self, name: str) -> str:
        return f"{self.vendor}/{name}"


def cdi_device_name(claim_uid: str, device: str) -> str:
    return f"{validate_claim_uid(claim_uid)}-{validate_device_name(device)}"


def cdi_device_id(kind: CdiKind, claim_uid: str, device: str) -> str:
    return f"{kind.kind}={cdi_device_name(claim_uid, device)}"


def spec_file_name(kind: CdiKind, claim_uid: str) -> str:
    """One file per claim; the kind prefix lets Tangram find its own files among other vendors'."""
    return f"{spec_file_prefix(kind)}{validate_claim_uid(claim_uid)}.json"


def spec_file_prefix(kind: CdiKind) -> str:
    return f"{kind.vendor}-{kind.cls}_"


def _device_node(container_path: str, driver_root: PurePosixPath) -> dict[str, str]:
    node = {"path": container_path}
    if driver_root != HOST_ROOT:
        # The host's /dev lives elsewhere (a driver container's root); the container still sees /dev.
        node["hostPath"] = str(driver_root / container_path.lstrip("/"))
    return node


def _device_paths(device: ResolvedDevice) -> list[str]:
    paths = [f"/dev/nvidia{device.gpu_minor}"]
    if device.is_mig:
        if device.gi_cap_minor < 0 or device.ci_cap_minor < 0:
            raise ValueError(f"MIG device {device.device} has no capability device minors")
        paths.append(f"/dev/nvidia-caps/nvidia-cap{device.gi_cap_minor}")
        paths.append(f"/dev/nvidia-caps/nvidia-cap{device.ci_cap_minor}")
    return paths


def share_pipe_dir(share_root: PurePosixPath, device_uuid: str) -> PurePosixPath:
    """Where the MPS control daemon of a shared device listens (the node's sharing manager's layout)."""
    return share_root / device_uuid / "pipe"


def _share_edits(device: ResolvedDevice, share_root: PurePosixPath | None) -> dict[str, Any]:
    if device.share is None:
        return {}
    if device.share.strategy != "MPS":
        return share_edits(device, "")
    if share_root is None:
        raise ValueError(f"device {device.device} is an MPS share, but this node has no MPS directory")
    return share_edits(device, str(share_pipe_dir(share_root, device.visible_uuid)))


def _hook(hook_path: PurePosixPath, *args: str) -> dict[str, Any]:
    return {"hookName": "createContainer", "path": str(hook_path), "args": [hook_path.name, *args]}


def driver_edits(
    driver: DriverFiles,
    *,
    driver_root: PurePosixPath = HOST_ROOT,
    hook_path: PurePosixPath = DEFAULT_HOOK_PATH,
) -> dict[str, Any]:
    """What every container of the node needs from the driver, whatever devices it gets.

    Libraries keep their path inside the container so that the ldcache hook can index them; the
    `libcuda.so` development link is made by a hook since the driver install itself may lack it.
    """
    mounts = [
        {
            "hostPath": str(driver_root / path.lstrip("/")),
            "containerPath": path,
            "options": list(DRIVER_MOUNT_OPTIONS),
        }
        for path in (*driver.libraries, *driver.binaries, *driver.firmware)
    ]
    libcuda_link = f"libcuda.so.1::{driver.library_dir}/libcuda.so"
    return {
        "deviceNodes": [_device_node(path, driver_root) for path in driver.control_nodes],
        "mounts": mounts,
        "hooks": [
            _hook(hook_path, "create-symlinks", "--link", libcuda_link),
            _hook(hook_path, "update-ldcache", "--folder", driver.library_dir),
        ],
    }


ALLOCATION_ANNOTATION = "allocation"
CLAIM_UID_ANNOTATION = "claim-uid"
CLAIM_ANNOTATION = "claim"


def build_spec(
    allocation: ResolvedAllocation,
    *,
    kind: CdiKind,
    driver_root: PurePosixPath = HOST_ROOT,
    driver: DriverFiles | None = None,
    hook_path: PurePosixPath = DEFAULT_HOOK_PATH,
    share_root: PurePosixPath | None = None,
) -> dict[str, Any]:
    """The CDI spec of one claim: one CDI device per allocated device, common edits at spec level.

    A share of a device also gets its share's edits (share_edits): under MPS the pipe directory of
    the device's control daemon, `<share_root>/<device UUID>/pipe`, and the share's limits. A claim
    of an NVLink domain gets the domain's IMEX channel device node at spec level.

    The claim's device list is set at spec level because CDI applies an env edit per injected
    device and the last one would win; a list per device cannot express a set. With `driver` the
    spec carries the driver itself, so NVIDIA_VISIBLE_DEVICES is "void" as in the toolkit's specs:
    a node whose default runtime is the legacy nvidia one then injects nothing on top (CUDA images
    set it to "all"), and the list goes to TANGRAM_VISIBLE_DEVICES. Without `driver` the spec
    carries device nodes only and NVIDIA_VISIBLE_DEVICES names the claim's devices for a runtime
    that injects the driver itself.
    The resolved allocation is kept as an annotation so the spec alone suffices to rebuild state.
    """
    uid = validate_claim_uid(allocation.claim.uid)
    if not allocation.devices:
        raise ValueError(f"claim {uid} has no devices to prepare")
    devices = [
        {
            "name": cdi_device_name(uid, device.device),
            "containerEdits": {
                "deviceNodes": [_device_node(path, driver_root) for path in _device_paths(device)],
                **_share_edits(device, share_root),
            },
        }
        for device in allocation.devices
    ]
    visible = ",".join(dict.fromkeys(device.visible_uuid for device in allocation.devices))
    spec: dict[str, Any] = {
        "cdiVersion": "",
        "kind": kind.kind,
        "annotations": {
            kind.annotation(CLAIM_UID_ANNOTATION): uid,
            kind.annotation(CLAIM_ANNOTATION): f"{allocation.claim.namespace}/{allocation.claim.name}",
            kind.annotation(ALLOCATION_ANNOTATION): msgspec.json.encode(allocation).decode(),
        },
        "devices": devices,
        "containerEdits": {
            "env": (
                [f"NVIDIA_VISIBLE_DEVICES={visible}"]
                if driver is None
                else ["NVIDIA_VISIBLE_DEVICES=void", f"TANGRAM_VISIBLE_DEVICES={visible}"]
            ),
            "deviceNodes": [_device_node(path, driver_root) for path in CONTROL_DEVICE_NODES],
        },
    }
    if driver is not None:
        spec["containerEdits"].update(driver_edits(driver, driver_root=driver_root, hook_path=hook_path))
    if allocation.imex is not None:
        spec["containerEdits"]["deviceNodes"].append(_device_node(allocation.imex.device_path, driver_root))
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def allocation_from_spec(spec: dict[str, Any], *, kind: CdiKind) -> ResolvedAllocation:
    """Inverse of `build_spec` for recovery; raises ValueError on a spec Tangram did not write."""
    if spec.get("kind") != kind.kind:
        raise ValueError(f"spec kind {spec.get('kind')!r} is not {kind.kind!r}")
    raw = (spec.get("annotations") or {}).get(kind.annotation(ALLOCATION_ANNOTATION))
    if not isinstance(raw, str):
        raise ValueError("spec has no allocation annotation")
    try:
        return msgspec.json.decode(raw, type=ResolvedAllocation)
    except msgspec.DecodeError as error:
        raise ValueError(f"allocation annotation is unreadable: {error}") from error
