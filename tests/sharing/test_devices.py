"""Device UUIDs that may name directories, and the directories of a device's daemon."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tangram.sharing.devices import (
    DeviceDirs,
    InvalidDeviceUuid,
    check_root,
    found_devices,
    is_whole_gpu,
    validate_device_uuid,
)

GPU = "GPU-6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26"
MIG = "MIG-0b7c0b8e-2f5a-5c5e-8f63-2c3c3a1d9e11"


@pytest.mark.parametrize(
    "uuid",
    [
        "",
        "GPU-",
        "GPU-6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f2",
        "GPU-6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26/",
        "GPU-6F1C2A4E-51B9-4D2E-9A57-7E0C3B8D1F26",
        "MIG-GPU-6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26/1/0",
        "../GPU-6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26",
        "GPU-6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26\n",
        "gpu-6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26",
        "GPU-6f1c2a4e_51b9-4d2e-9a57-7e0c3b8d1f26",
    ],
)
def test_anything_but_a_gpu_or_mig_uuid_is_refused(uuid: str) -> None:
    with pytest.raises(InvalidDeviceUuid):
        validate_device_uuid(uuid)
    with pytest.raises(InvalidDeviceUuid):
        DeviceDirs(Path("/var/lib/tangram/mps"), uuid)


def test_whole_gpu_or_mig() -> None:
    assert is_whole_gpu(GPU) and not is_whole_gpu(MIG)


def test_layout_and_modes(tmp_path: Path) -> None:
    root = tmp_path / "mps"
    dirs = DeviceDirs(root, GPU)
    assert (dirs.pipe, dirs.log) == (root / GPU / "pipe", root / GPU / "log")
    old = os.umask(0o077)
    try:
        dirs.create()
    finally:
        os.umask(old)
    modes = {path: stat.S_IMODE(path.stat().st_mode) for path in (root, dirs.device, dirs.pipe, dirs.log)}
    assert modes == {root: 0o711, dirs.device: 0o711, dirs.pipe: 0o755, dirs.log: 0o700}
    dirs.create()  # again: nothing to do
    (dirs.pipe / "control").write_text("")
    dirs.remove()
    assert not dirs.device.exists() and root.exists()
    dirs.remove()  # again: nothing to do


def test_an_existing_root_keeps_its_mode(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o750)
    DeviceDirs(tmp_path, MIG).create()
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o750


def test_a_symlink_in_place_of_a_device_directory_is_refused_and_removed_as_a_link(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("mine")
    root = tmp_path / "mps"
    root.mkdir()
    (root / GPU).symlink_to(elsewhere)
    dirs = DeviceDirs(root, GPU)
    with pytest.raises(ValueError, match="not a directory"):
        dirs.create()
    dirs.remove()
    assert not (root / GPU).exists() and (elsewhere / "keep").read_text() == "mine"


def test_root_must_leave_room_for_the_control_socket() -> None:
    assert check_root(Path("/var/lib/kubelet/plugins/gpu.tangram.dev/mps")) == Path(
        "/var/lib/kubelet/plugins/gpu.tangram.dev/mps"
    )
    with pytest.raises(ValueError, match="too long"):
        check_root(Path("/" + "x" * 60))
    with pytest.raises(ValueError, match="absolute"):
        check_root(Path("relative/mps"))


def test_found_devices_are_only_device_directories(tmp_path: Path) -> None:
    assert found_devices(tmp_path / "missing") == []
    (tmp_path / GPU).mkdir()
    (tmp_path / MIG).mkdir()
    (tmp_path / "GPU-not-a-uuid").mkdir()
    (tmp_path / "sharing-state.json").write_text("{}")
    (tmp_path / "GPU-0d4f5c1a-7b2e-4c3d-8e9f-a1b2c3d4e5f6").write_text("a file")
    assert found_devices(tmp_path) == [GPU, MIG]
