"""The node's sharing manager with the MPS control stand-in as real processes and a simulated node."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pynvml
import pytest

from tangram.events.catalogue import DeviceShare
from tangram.kubernetes.objects.names import InvalidName
from tangram.nvml.sim import SimNvml
from tangram.sharing import (
    SIMULATED_CONTROL_COMMAND,
    DeviceDirs,
    Holding,
    InvalidDeviceUuid,
    MpsControl,
    MpsControlError,
    MpsDefaults,
    ShareGrant,
    SharingConflict,
    SharingManager,
    SharingState,
    StateStore,
)
from tangram.sharing.computemode import UnknownGpu
from tangram.sharing.daemons import PID_FILE, process_alive

DEFAULT = pynvml.NVML_COMPUTEMODE_DEFAULT
EXCLUSIVE_PROCESS = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
PROHIBITED = pynvml.NVML_COMPUTEMODE_PROHIBITED
A, B = "claim-a", "claim-b"
MPS = DeviceShare(id="s-a", strategy="MPS", compute_percent=40, memory_bytes=8 * 1024**3)
TS = DeviceShare(id="s-t", strategy="TimeSlicing")
CONTROL = MpsControl(argv=SIMULATED_CONTROL_COMMAND)


class Node:
    """A simulated HGX H200 (GPU 0 in MIG mode, the others whole) and a sharing root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nvml = SimNvml.from_machine("hgx-h200")
        self.nvml.nvmlInit()

    def manager(self, *, boot_id: str = "boot-1", **options: object) -> SharingManager:
        return SharingManager(
            self.nvml,
            root=self.root,
            control_command=options.pop("control_command", SIMULATED_CONTROL_COMMAND),  # type: ignore[arg-type]
            boot_id=boot_id,
            **options,  # type: ignore[arg-type]
        )

    def gpu(self, index: int) -> str:
        return self.nvml.nvmlDeviceGetUUID(self.nvml.nvmlDeviceGetHandleByIndex(index))

    def mig(self) -> str:
        return self.nvml.nvmlDeviceGetUUID(
            self.nvml.nvmlDeviceGetMigDeviceHandleByIndex(self.nvml.nvmlDeviceGetHandleByIndex(0), 0)
        )

    def mode(self, index: int) -> int:
        return self.nvml.nvmlDeviceGetComputeMode(self.nvml.nvmlDeviceGetHandleByIndex(index))

    def set_mode(self, index: int, mode: int) -> None:
        self.nvml.nvmlDeviceSetComputeMode(self.nvml.nvmlDeviceGetHandleByIndex(index), mode)

    def dirs(self, uuid: str) -> DeviceDirs:
        return DeviceDirs(self.root, uuid)

    def pid(self, uuid: str) -> int:
        return int((self.dirs(uuid).pipe / PID_FILE).read_text())

    def daemon_pids(self) -> list[int]:
        return [int(p.read_text()) for p in self.root.glob(f"*/pipe/{PID_FILE}") if p.read_text().strip()]


@pytest.fixture
def node() -> Iterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp")) / "mps"  # short: unix socket paths
    here = Node(root)
    try:
        yield here
    finally:
        for pid in here.daemon_pids():
            if process_alive(pid):
                os.kill(pid, signal.SIGTERM)
        shutil.rmtree(root.parent, ignore_errors=True)


@pytest.fixture
async def manager(node: Node) -> AsyncIterator[SharingManager]:
    manager = node.manager()
    await manager.recover([])
    yield manager


async def _answers(node: Node, uuid: str, *commands: str) -> str:
    return await CONTROL.command(node.dirs(uuid), *commands)


async def test_first_share_starts_the_daemon_and_the_last_release_stops_it(
    node: Node, manager: SharingManager
) -> None:
    gpu = node.gpu(1)
    grant = await manager.acquire(A, gpu, MPS)
    pipe = node.root / gpu / "pipe"
    assert grant == ShareGrant(device_uuid=gpu, strategy="MPS", pipe_dir=str(pipe))
    assert (pipe / "control").is_socket()
    pid = node.pid(gpu)
    assert process_alive(pid)
    assert await _answers(node, gpu, "get_server_list") == ""
    assert await _answers(node, gpu, "get_default_active_thread_percentage") == "100.0\n"  # the device's
    assert node.mode(1) == EXCLUSIVE_PROCESS
    assert "Starting control daemon" in (node.root / gpu / "log" / "control.log").read_text()

    assert await manager.acquire(B, gpu, msgspec.structs.replace(MPS, id="s-b")) == grant
    assert node.pid(gpu) == pid  # one daemon per device
    assert await manager.acquire(A, gpu, MPS) == grant  # again: idempotent

    assert await manager.release(A) == []
    assert process_alive(pid) and node.mode(1) == EXCLUSIVE_PROCESS
    assert await manager.release(B) == [gpu]
    assert not process_alive(pid)
    assert not (node.root / gpu).exists()
    assert node.mode(1) == DEFAULT
    assert await manager.release(B) == []  # again: idempotent
    assert StateStore(node.root / "sharing-state.json").load() == SharingState(boot_id="boot-1")


async def test_compute_mode_given_back_is_the_one_before_and_survives_a_restart(node: Node) -> None:
    node.set_mode(2, PROHIBITED)
    gpu = node.gpu(2)
    first = node.manager()
    await first.recover([])
    await first.acquire(A, gpu, MPS)
    assert node.mode(2) == EXCLUSIVE_PROCESS
    pid = node.pid(gpu)

    restarted = node.manager()  # a new process of the plugin: the daemon lives on
    report = await restarted.recover([Holding(claim_uid=A, device_uuid=gpu, share=MPS)])
    assert (report.adopted, report.started, report.stopped, report.failed) == ([gpu], [], [], {})
    assert node.pid(gpu) == pid
    assert await restarted.release(A) == [gpu]
    assert node.mode(2) == PROHIBITED
    assert not process_alive(pid)


async def test_restart_stops_the_daemon_of_a_device_with_no_share_left(
    node: Node, manager: SharingManager
) -> None:
    gpu, kept = node.gpu(3), node.gpu(4)
    await manager.acquire(A, gpu, MPS)
    await manager.acquire(B, kept, MPS)
    gone, stays = node.pid(gpu), node.pid(kept)

    report = await node.manager().recover([Holding(claim_uid=B, device_uuid=kept, share=MPS)])
    assert (report.adopted, report.stopped) == ([kept], [gpu])
    assert not process_alive(gone) and not (node.root / gpu).exists()
    assert node.mode(3) == DEFAULT and node.mode(4) == EXCLUSIVE_PROCESS
    assert process_alive(stays)


async def test_restart_starts_again_a_daemon_that_died(node: Node, manager: SharingManager) -> None:
    gpu = node.gpu(5)
    await manager.acquire(A, gpu, MPS)
    dead = node.pid(gpu)
    os.kill(dead, signal.SIGKILL)
    report = await node.manager().recover([Holding(claim_uid=A, device_uuid=gpu, share=MPS)])
    assert report.started == [gpu]
    assert node.pid(gpu) != dead and await _answers(node, gpu, "get_server_list") == ""


async def test_a_share_finds_its_dead_daemon_started_again(node: Node, manager: SharingManager) -> None:
    gpu = node.gpu(5)
    await manager.acquire(A, gpu, MPS)
    dead = node.pid(gpu)
    os.kill(dead, signal.SIGKILL)
    await manager.acquire(B, gpu, MPS)
    assert node.pid(gpu) != dead and process_alive(node.pid(gpu))


async def test_daemon_and_directories_of_an_unrecorded_device_are_cleaned_up(node: Node) -> None:
    gpu = node.gpu(6)
    stray = node.dirs(gpu)
    stray.create()
    await CONTROL.start(stray)  # a daemon the state file does not know (the file was lost)
    pid = node.pid(gpu)
    report = await node.manager().recover([])
    assert report.stopped == [gpu]
    assert not process_alive(pid) and not stray.device.exists()
    assert node.mode(6) == DEFAULT  # no mode recorded: none changed


async def test_unusable_state_file_is_moved_aside_and_the_disk_decides(node: Node) -> None:
    gpu = node.gpu(1)
    first = node.manager()
    await first.recover([])
    await first.acquire(A, gpu, MPS)
    pid = node.pid(gpu)
    (node.root / "sharing-state.json").write_bytes(b"{ torn")
    report = await node.manager().recover([Holding(claim_uid=A, device_uuid=gpu, share=MPS)])
    assert report.state_reset and report.adopted == [gpu] and node.pid(gpu) == pid
    assert list(node.root.glob("sharing-state.json.corrupt-*"))
    assert node.mode(1) == EXCLUSIVE_PROCESS
    # The mode before was lost with the file: the one a GPU boots with is given back.
    restarted = node.manager()
    await restarted.recover([Holding(claim_uid=A, device_uuid=gpu, share=MPS)])
    await restarted.release(A)
    assert node.mode(1) == DEFAULT


async def test_a_mode_recorded_before_a_reboot_is_not_given_back(node: Node) -> None:
    node.set_mode(2, PROHIBITED)
    gpu = node.gpu(2)
    before = node.manager(boot_id="boot-1")
    await before.recover([])
    await before.acquire(A, gpu, MPS)
    os.kill(node.pid(gpu), signal.SIGKILL)  # the reboot: no daemon, the GPU in its boot mode
    node.set_mode(2, DEFAULT)
    report = await node.manager(boot_id="boot-2").recover([])
    assert report.failed == {}
    assert node.mode(2) == DEFAULT  # not PROHIBITED: that belonged to the boot before


async def test_mixed_strategies_on_one_device_are_refused(node: Node, manager: SharingManager) -> None:
    sliced, mps = node.gpu(3), node.gpu(4)
    assert await manager.acquire(A, sliced, TS) == ShareGrant(device_uuid=sliced, strategy="TimeSlicing")
    assert not (node.root / sliced).exists() and node.mode(3) == DEFAULT  # no daemon, no mode
    with pytest.raises(SharingConflict, match=f"device {sliced} is shared by TimeSlicing"):
        await manager.acquire(B, sliced, MPS)
    assert not (node.root / sliced).exists()

    await manager.acquire(A, mps, MPS)
    with pytest.raises(SharingConflict, match=f"device {mps} is shared by MPS"):
        await manager.acquire(B, mps, TS)
    assert manager.state.devices[mps].shares == {A: "s-a"}
    assert await manager.release(A) == [mps, sliced]
    assert await manager.acquire(B, sliced, MPS) != ShareGrant(device_uuid=sliced, strategy="TimeSlicing")


async def test_mps_on_a_mig_device_leaves_the_compute_mode_alone(node: Node, manager: SharingManager) -> None:
    mig = node.mig()
    grant = await manager.acquire(A, mig, MPS)
    assert grant.pipe_dir == str(node.root / mig / "pipe")
    assert await _answers(node, mig, "get_server_list") == ""
    assert node.mode(0) == DEFAULT
    assert manager.state.devices[mig].restore_compute_mode is None
    pid = node.pid(mig)
    assert await manager.release(A) == [mig]
    assert not process_alive(pid)


async def test_configured_defaults_reach_the_daemon(node: Node) -> None:
    manager = node.manager(defaults=MpsDefaults(active_thread_percentage=80, pinned_mem_limit_mib=2048))
    await manager.recover([])
    gpu = node.gpu(7)
    await manager.acquire(A, gpu, MPS)
    answers = await _answers(
        node, gpu, "get_default_active_thread_percentage", "get_default_device_pinned_mem_limit 0"
    )
    assert answers == "80.0\n2G\n"
    await manager.release(A)


async def test_a_failed_start_is_undone(node: Node) -> None:
    failing = node.manager(
        control_command=(sys.executable, "-c", "import sys; print('no MPS here'); sys.exit(3)")
    )
    await failing.recover([])
    gpu = node.gpu(1)
    with pytest.raises(MpsControlError, match="no MPS here"):
        await failing.acquire(A, gpu, MPS)
    assert node.mode(1) == DEFAULT
    assert failing.state.devices == {}
    assert not (node.root / gpu).exists()


async def test_missing_control_program_is_a_clear_error(node: Node) -> None:
    missing = node.manager(control_command=("/nonexistent/nvidia-cuda-mps-control",))
    await missing.recover([])
    with pytest.raises(MpsControlError, match="cannot run /nonexistent/nvidia-cuda-mps-control"):
        await missing.acquire(A, node.gpu(1), MPS)
    assert node.mode(1) == DEFAULT


async def test_names_are_checked_before_anything_is_made(node: Node, manager: SharingManager) -> None:
    with pytest.raises(InvalidDeviceUuid):
        await manager.acquire(A, "GPU-../../../etc", MPS)
    with pytest.raises(InvalidName):
        await manager.acquire("../x", node.gpu(1), MPS)
    with pytest.raises(ValueError, match="compute_percent"):
        await manager.acquire(A, node.gpu(1), DeviceShare(id="s", compute_percent=0))
    assert not node.root.exists() or list(node.root.iterdir()) == [node.root / "sharing-state.json"]


def test_a_root_too_long_for_a_socket_is_refused(node: Node) -> None:
    with pytest.raises(ValueError, match="too long"):
        SharingManager(
            node.nvml, root=Path("/tmp/" + "x" * 80), control_command=SIMULATED_CONTROL_COMMAND, boot_id="b"
        )


async def test_a_gpu_not_on_this_node_is_refused_before_anything_changes(
    node: Node, manager: SharingManager
) -> None:
    with pytest.raises(UnknownGpu, match="no GPU GPU-0d4f5c1a-7b2e-4c3d-8e9f-a1b2c3d4e5f6 on this node"):
        await manager.acquire(A, "GPU-0d4f5c1a-7b2e-4c3d-8e9f-a1b2c3d4e5f6", MPS)
    assert manager.state.devices == {}
    assert not (node.root / "GPU-0d4f5c1a-7b2e-4c3d-8e9f-a1b2c3d4e5f6").exists()


async def test_concurrent_calls_are_taken_one_at_a_time(node: Node, manager: SharingManager) -> None:
    gpus = [node.gpu(index) for index in (3, 4, 5)]
    grants = await asyncio.gather(
        manager.acquire(A, gpus[0], MPS), manager.acquire(B, gpus[1], MPS), manager.acquire(A, gpus[2], TS)
    )
    assert [grant.strategy for grant in grants] == ["MPS", "MPS", "TimeSlicing"]
    recorded = StateStore(node.root / "sharing-state.json").load()
    assert recorded is not None and set(recorded.devices) == set(gpus)
    assert all(process_alive(node.pid(gpu)) for gpu in gpus[:2])
    released = await asyncio.gather(manager.release(A), manager.release(B))
    assert sorted(uuid for batch in released for uuid in batch) == sorted(gpus)
    assert node.daemon_pids() == [] and [node.mode(i) for i in (3, 4, 5)] == [DEFAULT] * 3


async def test_recovery_goes_on_past_a_device_it_cannot_recover(node: Node, manager: SharingManager) -> None:
    gpu = node.gpu(4)
    await manager.acquire(A, gpu, MPS)
    node.nvml.sim_set_lost(3)  # GPU 3 fell off the bus
    gone = node.gpu(3)
    report = await node.manager().recover(
        [Holding(claim_uid=A, device_uuid=gpu, share=MPS), Holding(claim_uid=B, device_uuid=gone, share=MPS)]
    )
    assert report.adopted == [gpu]
    assert list(report.failed) == [gone] and report.failed[gone] == "GPU is lost"
    assert not (node.root / gone).exists()
