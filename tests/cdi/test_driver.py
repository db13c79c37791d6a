"""Complete CDI specs from a driver root laid out as a real driver install, asserted entry by entry."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import pytest

from tangram.cdi import CdiKind, CdiSpecWriter, ClaimRef, ResolvedAllocation, ResolvedDevice, validate_spec
from tangram.cdi.driver import DriverRootError, discover_driver
from tangram.cdi.simroot import lay_out_driver_root
from tests.kubelet.fakes import schema_validator

KIND = CdiKind(vendor="gpu.tangram.dev", cls="claim")
UID = "2d8b8e77-5b2a-4e6a-9c7b-4f5b4e3b9c03"
VERSION = "580.95.05"
LIB = "/usr/lib/x86_64-linux-gnu"
RO = ["ro", "nosuid", "nodev", "bind"]
HOOK = "/usr/bin/nvidia-cdi-hook"

LIBRARIES = [
    f"{LIB}/libcuda.so.{VERSION}",
    f"{LIB}/libcudadebugger.so.{VERSION}",
    f"{LIB}/libnvidia-allocator.so.{VERSION}",
    f"{LIB}/libnvidia-cfg.so.{VERSION}",
    f"{LIB}/libnvidia-gpucomp.so.{VERSION}",
    f"{LIB}/libnvidia-ml.so.{VERSION}",
    f"{LIB}/libnvidia-nvvm.so.{VERSION}",
    f"{LIB}/libnvidia-opencl.so.{VERSION}",
    f"{LIB}/libnvidia-ptxjitcompiler.so.{VERSION}",
]
BINARIES = [
    "/usr/bin/nvidia-smi",
    "/usr/bin/nvidia-debugdump",
    "/usr/bin/nvidia-persistenced",
    "/usr/bin/nvidia-cuda-mps-control",
    "/usr/bin/nvidia-cuda-mps-server",
]
FIRMWARE = [f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin", f"/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin"]


def whole_gpu() -> ResolvedAllocation:
    return ResolvedAllocation(
        claim=ClaimRef(namespace="ml", name="train", uid=UID),
        devices=[
            ResolvedDevice(
                request="gpu", pool="n", device="gpu-3", gpu_index=3, gpu_uuid="GPU-d", gpu_minor=3
            )
        ],
    )


def mig_instance() -> ResolvedAllocation:
    return ResolvedAllocation(
        claim=ClaimRef(namespace="ml", name="embed", uid=UID),
        devices=[
            ResolvedDevice(
                request="mig",
                pool="n",
                device="gpu-1-mig-1g10gb-2",
                gpu_index=1,
                gpu_uuid="GPU-b",
                gpu_minor=1,
                mig_uuid="MIG-e",
                profile="1g.10gb",
                gi_cap_minor=75,
                ci_cap_minor=76,
            )
        ],
    )


@pytest.fixture
def driver_root(tmp_path: Path) -> Path:
    root = lay_out_driver_root(tmp_path / "driver", VERSION, cap_minors=range(75, 77))
    # A leftover of an earlier driver must not be mounted next to the running one.
    (root / LIB.lstrip("/") / "libnvidia-ml.so.550.54.15").write_bytes(b"\x7fELF")
    return root


def mounts(root: str, paths: list[str]) -> list[dict[str, object]]:
    return [{"hostPath": f"{root}{path}", "containerPath": path, "options": RO} for path in paths]


def write_and_read(
    tmp_path: Path, allocation: ResolvedAllocation, driver_root: Path, host_root: str
) -> dict[str, object]:
    driver = discover_driver(driver_root, expected_version="580.95.5")
    writer = CdiSpecWriter(tmp_path / "cdi", kind=KIND, driver_root=PurePosixPath(host_root), driver=driver)
    spec: dict[str, object] = json.loads(writer.write(allocation).read_bytes())
    validate_spec(spec)
    assert list(schema_validator().iter_errors(spec)) == []
    return spec


def test_discovery_finds_the_running_drivers_files_only(driver_root: Path) -> None:
    driver = discover_driver(driver_root, expected_version="580.95.5")
    assert driver.version == VERSION
    assert driver.library_dir == LIB
    assert list(driver.libraries) == LIBRARIES
    assert list(driver.binaries) == BINARIES
    assert list(driver.firmware) == FIRMWARE
    assert list(driver.control_nodes) == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def test_whole_gpu_spec_file_by_file(tmp_path: Path, driver_root: Path) -> None:
    spec = write_and_read(tmp_path, whole_gpu(), driver_root, "/")
    assert spec["devices"] == [
        {"name": f"{UID}-gpu-3", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia3"}]}}
    ]
    assert spec["containerEdits"] == {
        "env": ["NVIDIA_VISIBLE_DEVICES=void", "TANGRAM_VISIBLE_DEVICES=GPU-d"],
        "deviceNodes": [
            {"path": "/dev/nvidiactl"},
            {"path": "/dev/nvidia-uvm"},
            {"path": "/dev/nvidia-uvm-tools"},
        ],
        "mounts": mounts("", LIBRARIES + BINARIES + FIRMWARE),
        "hooks": [
            {
                "hookName": "createContainer",
                "path": HOOK,
                "args": ["nvidia-cdi-hook", "create-symlinks", "--link", f"libcuda.so.1::{LIB}/libcuda.so"],
            },
            {
                "hookName": "createContainer",
                "path": HOOK,
                "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", LIB],
            },
        ],
    }


def test_mig_instance_spec_from_a_driver_container_root(tmp_path: Path, driver_root: Path) -> None:
    host = "/run/nvidia/driver"
    spec = write_and_read(tmp_path, mig_instance(), driver_root, host)
    assert spec["devices"] == [
        {
            "name": f"{UID}-gpu-1-mig-1g10gb-2",
            "containerEdits": {
                "deviceNodes": [
                    {"path": "/dev/nvidia1", "hostPath": f"{host}/dev/nvidia1"},
                    {
                        "path": "/dev/nvidia-caps/nvidia-cap75",
                        "hostPath": f"{host}/dev/nvidia-caps/nvidia-cap75",
                    },
                    {
                        "path": "/dev/nvidia-caps/nvidia-cap76",
                        "hostPath": f"{host}/dev/nvidia-caps/nvidia-cap76",
                    },
                ]
            },
        }
    ]
    edits = spec["containerEdits"]
    assert isinstance(edits, dict)
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void", "TANGRAM_VISIBLE_DEVICES=MIG-e"]
    assert edits["deviceNodes"] == [
        {"path": node, "hostPath": f"{host}{node}"}
        for node in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
    ]
    assert edits["mounts"] == mounts(host, LIBRARIES + BINARIES + FIRMWARE)
    assert [hook["args"][1] for hook in edits["hooks"]] == ["create-symlinks", "update-ldcache"]


def test_custom_hook_path(tmp_path: Path, driver_root: Path) -> None:
    driver = discover_driver(driver_root)
    hook = PurePosixPath("/usr/local/nvidia/toolkit/nvidia-cdi-hook")
    writer = CdiSpecWriter(tmp_path / "cdi", kind=KIND, driver=driver, hook_path=hook)
    spec = writer.render(whole_gpu())
    assert {h["path"] for h in spec["containerEdits"]["hooks"]} == {str(hook)}


def test_what_is_absent_is_not_mounted(tmp_path: Path) -> None:
    root = lay_out_driver_root(tmp_path / "driver", VERSION)
    for name in ("nvidia-debugdump", "nvidia-cuda-mps-server"):
        (root / "usr/bin" / name).unlink()
    (root / "dev/nvidia-uvm-tools").unlink()
    for firmware in (root / "lib/firmware/nvidia" / VERSION).iterdir():
        firmware.unlink()
    driver = discover_driver(root)
    assert list(driver.binaries) == [
        "/usr/bin/nvidia-smi",
        "/usr/bin/nvidia-persistenced",
        "/usr/bin/nvidia-cuda-mps-control",
    ]
    assert driver.firmware == ()
    assert list(driver.control_nodes) == ["/dev/nvidiactl", "/dev/nvidia-uvm"]


def test_missing_driver_root_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DriverRootError, match=r"driver root .*/nowhere does not exist"):
        discover_driver(tmp_path / "nowhere")


def test_empty_driver_root_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DriverRootError, match=r"no libcuda\.so\.<version>"):
        discover_driver(tmp_path)


def test_version_nvml_reports_must_be_installed(driver_root: Path) -> None:
    with pytest.raises(DriverRootError, match=r"no libcuda\.so\.570\.1\.2 .*libcuda\.so\.580\.95\.05"):
        discover_driver(driver_root, expected_version="570.1.2")


def test_two_installed_versions_need_the_one_nvml_reports(tmp_path: Path) -> None:
    root = lay_out_driver_root(tmp_path / "driver", VERSION)
    lay_out_driver_root(root, "570.86.15")
    with pytest.raises(DriverRootError, match="several driver versions"):
        discover_driver(root)
    driver = discover_driver(root, expected_version="570.86.15")
    assert f"{LIB}/libcuda.so.570.86.15" in driver.libraries
    assert not any(path.endswith(VERSION) for path in driver.libraries)


def test_driver_not_loaded_is_a_clear_error(tmp_path: Path) -> None:
    root = lay_out_driver_root(tmp_path / "driver", VERSION)
    (root / "dev/nvidiactl").unlink()
    with pytest.raises(DriverRootError, match=r"dev/nvidiactl is missing"):
        discover_driver(root)
