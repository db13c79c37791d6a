"""The container edits of one device share: exact content, and valid CDI once in a spec."""

from __future__ import annotations

from typing import Any

import pytest

from tangram.cdi import ResolvedDevice, minimum_version, validate_spec
from tangram.cdi.shares import share_edits
from tangram.events.catalogue import DeviceShare
from tests.kubelet.fakes import schema_validator

PIPE = "/var/lib/tangram/mps/GPU-6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26/pipe"
SHARE_ID = "8b1d3c2e-0f4a-5b6c-9d7e-1a2b3c4d5e6f"


def _device(share: DeviceShare | None, *, mig: bool = False) -> ResolvedDevice:
    return ResolvedDevice(
        request="r",
        pool="node-a",
        device="gpu-0-mig-1g18gb-4" if mig else "gpu-0",
        gpu_index=0,
        gpu_uuid="GPU-6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26",
        gpu_minor=0,
        mig_uuid="MIG-0b7c0b8e-2f5a-5c5e-8f63-2c3c3a1d9e11" if mig else "",
        profile="1g.18gb" if mig else "",
        gi_cap_minor=21 if mig else -1,
        ci_cap_minor=22 if mig else -1,
        share=share,
    )


def _in_spec(edits: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "cdiVersion": "",
        "kind": "gpu.tangram.dev/claim",
        "devices": [
            {"name": "claim-gpu-0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}], **edits}}
        ],
    }
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def test_mps_share_gets_pipe_directory_and_both_limits() -> None:
    share = DeviceShare(id=SHARE_ID, strategy="MPS", memory_bytes=10 * 1024**3, compute_percent=30)
    edits = share_edits(_device(share), PIPE)
    assert edits == {
        "env": [
            f"CUDA_MPS_PIPE_DIRECTORY={PIPE}",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",
        ],
        "mounts": [
            {"hostPath": PIPE, "containerPath": PIPE, "options": ["rw", "nosuid", "nodev", "noexec", "bind"]}
        ],
    }
    spec = _in_spec(edits)
    validate_spec(spec)
    assert list(schema_validator().iter_errors(spec)) == []


def test_mps_share_on_a_mig_device_is_device_zero_of_the_container_too() -> None:
    share = DeviceShare(id=SHARE_ID, memory_bytes=4 * 1024**3)
    edits = share_edits(_device(share, mig=True), PIPE)
    assert edits["env"] == [
        f"CUDA_MPS_PIPE_DIRECTORY={PIPE}",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M",
    ]
    validate_spec(_in_spec(edits))


def test_mps_share_without_memory_has_no_memory_limit() -> None:
    edits = share_edits(_device(DeviceShare(id=SHARE_ID, compute_percent=50)), PIPE)
    assert edits["env"] == [f"CUDA_MPS_PIPE_DIRECTORY={PIPE}", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50"]


@pytest.mark.parametrize(
    ("memory_bytes", "limit"),
    [
        (1024**2, "1M"),
        (1024**2 + 1, "1M"),
        (2 * 1024**2 - 1, "1M"),
        (int(1.5 * 1024**3), "1536M"),
        (80 * 10**9, "76293M"),
    ],
)
def test_memory_limit_is_whole_mib_never_above_the_share(memory_bytes: int, limit: str) -> None:
    edits = share_edits(_device(DeviceShare(id=SHARE_ID, memory_bytes=memory_bytes)), PIPE)
    assert edits["env"][-1] == f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={limit}"
    assert int(limit[:-1]) * 1024**2 <= memory_bytes


def test_time_slicing_share_needs_no_mps_edits() -> None:
    share = DeviceShare(id=SHARE_ID, strategy="TimeSlicing", memory_bytes=8 * 1024**3, time_slice="Short")
    edits = share_edits(_device(share), "")
    assert edits == {}
    validate_spec(_in_spec(edits))


@pytest.mark.parametrize(
    ("share", "pipe_dir", "problem"),
    [
        (None, PIPE, "not shared"),
        (DeviceShare(id=SHARE_ID, strategy="TimeSlicing"), PIPE, "no MPS pipe directory"),
        (DeviceShare(id=SHARE_ID, compute_percent=0), PIPE, "compute_percent"),
        (DeviceShare(id=SHARE_ID, compute_percent=101), PIPE, "compute_percent"),
        (DeviceShare(id=SHARE_ID, memory_bytes=-1), PIPE, "memory_bytes"),
        (DeviceShare(id=SHARE_ID, memory_bytes=1000), PIPE, "below 1 MiB"),
        (DeviceShare(id=SHARE_ID), "", "not an absolute"),
        (DeviceShare(id=SHARE_ID), "relative/pipe", "not an absolute"),
        (DeviceShare(id=SHARE_ID), "/var/lib/../../etc", "not an absolute"),
        (DeviceShare(id=SHARE_ID), "/var/lib/./mps", "not an absolute"),
        (DeviceShare(id=SHARE_ID), "/var/lib/mps/", "not an absolute"),
        (DeviceShare(id=SHARE_ID), "/var/lib/mps,ro", "not an absolute"),
        (DeviceShare(id=SHARE_ID), "/var/lib/mps\nX=1", "not an absolute"),
        (DeviceShare(id=SHARE_ID), "/var/lib/mps pipe", "not an absolute"),
        (DeviceShare(id=SHARE_ID), "/var/lib/mps\n", "not an absolute"),
    ],
)
def test_refused(share: DeviceShare | None, pipe_dir: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        share_edits(_device(share), pipe_dir)
