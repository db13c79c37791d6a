"""The discovery service against a real nats-server and the simulator."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.discovery.service import run
from services.discovery.settings import DiscoverySettings
from tangram.bus import Bus
from tangram.events import INVENTORY_STREAM, NODES_STREAM, DeviceHealthChanged, NodeInventory
from tangram.local.natsserver import NatsServer
from tangram.nvml import SimNvml
from tangram.service import ServiceContext
from tests.support.polling import until


async def inventories(bus: Bus) -> list[NodeInventory]:
    return [e async for _, e in bus.replay(INVENTORY_STREAM) if isinstance(e, NodeInventory)]


@pytest.fixture
async def discovery(
    bus: Bus, nats_server: NatsServer, tmp_path: Path
) -> AsyncIterator[tuple[ServiceContext, Path]]:
    state = tmp_path / "gpus.json"
    settings = DiscoverySettings(
        nats_urls=(nats_server.url,),
        node_name="gpu-node.example.com",
        sim="hgx-h200",
        state_file=state,
        refresh_s=0.2,
    )
    ctx = ServiceContext(name="discovery", bus=bus, stop=asyncio.Event())
    task = asyncio.create_task(run(ctx, settings))
    await asyncio.wait_for(ctx.ready.wait(), 20)
    yield ctx, state
    ctx.stop.set()
    await task


async def test_publishes_the_inventory_on_the_nodes_subject(
    bus: Bus, discovery: tuple[ServiceContext, Path]
) -> None:
    [inventory] = await inventories(bus)
    assert inventory.subject == "tangram.inventory.gpu-node_example_com"
    assert inventory.hardware.node == "gpu-node.example.com"
    assert [gpu.name for gpu in inventory.hardware.gpus] == ["NVIDIA H200"] * 8
    assert inventory.producer == "discovery@gpu-node.example.com"
    # The MIG instances the machine starts with carry what their device nodes need.
    instances = [
        (m.profile, m.gi_cap_minor, m.ci_cap_minor) for m in inventory.hardware.gpus[0].mig_instances
    ]
    assert instances == [("3g.71gb", 12, 13), ("1g.18gb", 102, 103)]
    assert all(m.uuid.startswith("MIG-") for m in inventory.hardware.gpus[0].mig_instances)


async def test_republishes_when_mig_layout_changes_and_keeps_last_value_only(
    bus: Bus, discovery: tuple[ServiceContext, Path]
) -> None:
    _, state = discovery
    other_process = SimNvml.from_machine("hgx-h200", state_file=state)
    other_process.nvmlInit()
    other_process.nvmlDeviceSetMigMode(other_process.nvmlDeviceGetHandleByIndex(3), 1)

    async def mig_on() -> bool:
        found = await inventories(bus)
        return len(found) == 1 and found[0].hardware.gpus[3].mig_enabled

    await until("MIG mode on in the published inventory", mig_on, 20)
    [latest] = await inventories(bus)
    assert latest.generation == 2
    assert [gpu.index for gpu in latest.hardware.gpus if gpu.mig_enabled] == [0, 3]  # GPU 0 ships in MIG mode


async def test_critical_xid_marks_the_gpu_unhealthy(bus: Bus, discovery: tuple[ServiceContext, Path]) -> None:
    _, state = discovery
    other_process = SimNvml.from_machine("hgx-h200", state_file=state)
    other_process.sim_inject_xid(5, 79)

    async def unhealthy() -> bool:
        found = await inventories(bus)
        return bool(found) and found[0].hardware.gpus[5].health == "unhealthy"

    await until("the GPU unhealthy in the published inventory", unhealthy, 20)
    [inventory] = await inventories(bus)
    assert inventory.hardware.gpus[5].health_reason == "XID 79"
    assert [g.index for g in inventory.hardware.gpus if g.health != "healthy"] == [5]
    health = [e async for _, e in bus.replay(NODES_STREAM) if isinstance(e, DeviceHealthChanged)]
    assert [(h.gpu_uuid, h.healthy, h.xid) for h in health] == [(inventory.hardware.gpus[5].uuid, False, 79)]


@pytest.mark.timeout(300)  # a cold interpreter start and a drained stop, on a loaded machine
def test_entry_point_runs_as_a_process_and_stops_on_sigterm(nats_server: NatsServer, tmp_path: Path) -> None:
    env = dict(os.environ, TANGRAM_NATS_URL=nats_server.url, TANGRAM_NODE_NAME="n1")
    process = subprocess.Popen(
        [sys.executable, "-m", "services.discovery", "--sim", "l40s-8", "--refresh", "0.2"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    lines = []
    try:
        for line in process.stderr:
            lines.append(line)
            if "inventory published" in line:
                break
        process.send_signal(signal.SIGTERM)
        # Bounded, and with the whole log in the failure: a stop that hangs says where it hung.
        _, rest = process.communicate(timeout=90)
        lines.extend(rest.splitlines(keepends=True))
    finally:
        if process.poll() is None:
            process.kill()
            lines.extend(process.communicate()[1].splitlines(keepends=True))
            print("".join(lines))
    assert process.returncode == 0, lines
    assert any('"message": "service stopped"' in line for line in lines)
    assert any('"gpus": 8' in line for line in lines)
