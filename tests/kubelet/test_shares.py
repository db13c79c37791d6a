"""Prepared shares over the real kubelet sockets: each share's CDI edits carry its own pipe
directory and limits, the device's MPS control daemon (the simulator's stand-in, a real process)
runs while any share is prepared and stops after the last, and the answer names each share."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from tangram.dra.sharing import share_id
from tangram.events import AllocatedDevice, ClaimAllocated, DeviceShare, NodeInventory
from tangram.kubelet import build_plugin
from tangram.nvml.inventory import read_node_hardware
from tangram.nvml.sim import SimNvml
from tangram.sharing import SIMULATED_CONTROL_COMMAND, DeviceDirs, MpsControl, SharingManager
from tangram.sharing.daemons import PID_FILE, process_alive
from tests.kubelet.fakes import NODE, TestKubelet, WatchedSource, schema_validator
from tests.kubelet.harness import PluginHarness
from tests.support.driver import DRIVER

GIB = 2**30
UIDS = [f"5a4e0000-0000-4000-8000-00000000000{i}" for i in range(1, 6)]


@pytest.fixture
def mps_root() -> Iterator[Path]:
    # the control socket's path must fit a unix socket address
    root = Path(tempfile.mkdtemp(prefix="tm-", dir="/tmp"))
    try:
        yield root
    finally:
        for pid_file in root.glob(f"*/pipe/{PID_FILE}"):
            pid = int(pid_file.read_text() or 0)
            if pid and process_alive(pid):
                os.kill(pid, signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def sharing_node(
    no_leaked_tasks: None, make_config: Any, kubelet_root: Path, mps_root: Path
) -> AsyncIterator[tuple[PluginHarness, SimNvml, SharingManager]]:
    nvml = SimNvml.from_machine("l40s-8")
    nvml.nvmlInit()
    source = WatchedSource(NODE)
    source.observe(NodeInventory(key=NODE, hardware=read_node_hardware(nvml, NODE)))
    sharing = SharingManager(nvml, root=mps_root, control_command=SIMULATED_CONTROL_COMMAND, boot_id="boot-1")
    kubelet = TestKubelet(kubelet_root)
    harness = PluginHarness(config=make_config(), source=source, kubelet=kubelet)
    harness.plugin = await build_plugin(harness.config, source, on_event=harness.record, sharing=sharing)
    await harness.plugin.start()
    try:
        yield harness, nvml, sharing
    finally:
        await kubelet.close()
        await harness.stop()


def shared(
    uid: str, gpu_uuid: str, *, memory_gib: int, compute: int = 100, strategy: str = "MPS"
) -> ClaimAllocated:
    return ClaimAllocated(
        key=uid,
        namespace="ml",
        name=f"embedder-{uid[-1]}",
        uid=uid,
        node=NODE,
        devices=[
            AllocatedDevice(
                request="share",
                driver=DRIVER,
                pool=NODE,
                device="gpu-0-shared",
                gpu_index=0,
                gpu_uuid=gpu_uuid,
                share=DeviceShare(
                    id=share_id(uid, "gpu-0-shared"),
                    strategy=strategy,  # type: ignore[arg-type]
                    memory_bytes=memory_gib * GIB,
                    compute_percent=compute,
                ),
            )
        ],
    )


async def test_four_mps_shares_of_one_gpu_each_get_their_limits_and_the_daemon_lives_while_any_is_prepared(
    sharing_node: tuple[PluginHarness, SimNvml, SharingManager], mps_root: Path
) -> None:
    harness, nvml, _ = sharing_node
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    gpu_uuid = nvml.nvmlDeviceGetUUID(gpu)
    pipe = mps_root / gpu_uuid / "pipe"
    for i, uid in enumerate(UIDS[:4]):
        harness.source.observe(shared(uid, gpu_uuid, memory_gib=10, compute=25 if i else 100))
    answers = await harness.kubelet.prepare(
        harness.endpoint, [("ml", f"embedder-{u[-1]}", u) for u in UIDS[:4]]
    )
    assert all(a.error == "" for a in answers.values()), answers
    assert [answers[u].share_ids for u in UIDS[:4]] == [[share_id(u, "gpu-0-shared")] for u in UIDS[:4]]
    assert nvml.nvmlDeviceGetComputeMode(gpu) == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    control = MpsControl(argv=SIMULATED_CONTROL_COMMAND)
    pid = int((pipe / PID_FILE).read_text())
    assert process_alive(pid)
    for i, uid in enumerate(UIDS[:4]):
        spec = json.loads(harness.spec_path(uid).read_text())
        assert list(schema_validator().iter_errors(spec)) == []
        [device] = spec["devices"]
        assert device["name"] == f"{uid}-gpu-0-shared"  # CDI names unique per share
        edits = device["containerEdits"]
        assert sorted(edits["env"]) == sorted(
            [
                f"CUDA_MPS_PIPE_DIRECTORY={pipe}",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",
                f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={25 if i else 100}",
            ]
        )
        assert [m["containerPath"] for m in edits["mounts"]] == [str(pipe)]
        assert [m["hostPath"] for m in edits["mounts"]] == [str(pipe)]

    # the daemon answers, and stays while any share is prepared
    answer = await control.command(DeviceDirs(mps_root, gpu_uuid), "get_default_active_thread_percentage")
    assert answer.strip() == "100.0"
    await harness.kubelet.unprepare(harness.endpoint, [("ml", f"embedder-{u[-1]}", u) for u in UIDS[:3]])
    assert process_alive(pid)
    await harness.kubelet.unprepare(harness.endpoint, [("ml", "embedder-4", UIDS[3])])
    assert not process_alive(pid)
    assert not (pipe / "control").exists()
    assert nvml.nvmlDeviceGetComputeMode(gpu) == pynvml.NVML_COMPUTEMODE_DEFAULT


async def test_a_time_sliced_share_gets_no_mps_edits_and_mps_cannot_join_it(
    sharing_node: tuple[PluginHarness, SimNvml, SharingManager], mps_root: Path
) -> None:
    harness, nvml, _ = sharing_node
    gpu_uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(0))
    harness.source.observe(shared(UIDS[0], gpu_uuid, memory_gib=8, strategy="TimeSlicing"))
    harness.source.observe(shared(UIDS[1], gpu_uuid, memory_gib=8))
    first = await harness.kubelet.prepare(harness.endpoint, [("ml", "embedder-1", UIDS[0])])
    assert first[UIDS[0]].error == ""
    [device] = json.loads(harness.spec_path(UIDS[0]).read_text())["devices"]
    assert device["containerEdits"] == {"deviceNodes": [{"path": "/dev/nvidia0"}]}
    assert not (mps_root / gpu_uuid / "pipe" / "control").exists()
    refused = await harness.kubelet.prepare(harness.endpoint, [("ml", "embedder-2", UIDS[1])])
    assert "cannot be prepared" in refused[UIDS[1]].error
    assert "TimeSlicing" in refused[UIDS[1]].error
    assert not harness.spec_path(UIDS[1]).exists()
