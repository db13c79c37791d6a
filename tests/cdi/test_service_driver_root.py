"""The cdi service: no start without a driver install, and /readyz that follows kubelet's word."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import uuid
from pathlib import Path

import msgspec
import pytest

from services.cdi.service import run
from services.cdi.settings import CdiSettings, parse_settings
from tangram.bus import Bus
from tangram.cdi.simroot import lay_out_driver_root
from tangram.kubelet.proto import dra_health_v1alpha1_pb2 as health_pb2
from tangram.local.natsserver import NatsServer
from tangram.service import ServiceContext
from tangram.service.runner import serve
from tests.kubelet.fakes import NODE, TestKubelet, inventory
from tests.service.readiness import until_readyz


async def test_missing_driver_root_stops_the_service_at_start(
    nats_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = CdiSettings(
        nats_urls=(nats_server.url,),
        node_name="node-a",
        kubelet_root=tmp_path / "kubelet",
        cdi_dir=tmp_path / "cdi",
        driver_root=Path("/run/nvidia/driver"),
        driver_root_mount=tmp_path / "no-driver-here",
    )
    with caplog.at_level(logging.ERROR, logger="tangram.service"):
        code = await serve("cdi", "cdi@node-a", settings, lambda ctx: run(ctx, settings))
    assert code == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and errors[0].exc_info is not None
    assert f"driver root {tmp_path / 'no-driver-here'} does not exist" in str(errors[0].exc_info[1])
    # Nothing was served or written: kubelet never learns of a plugin that cannot prepare anything.
    assert not (tmp_path / "kubelet").exists()
    assert not (tmp_path / "cdi").exists()


async def test_cdi_service_is_unready_while_kubelet_refuses_its_registration(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    kubelet_root = Path(tempfile.mkdtemp(prefix="tk-", dir="/tmp"))  # socket paths must stay short
    settings = CdiSettings(
        nats_urls=(nats_server.url,),
        node_name="node-a",
        kubelet_root=kubelet_root,
        cdi_dir=tmp_path / "cdi",
        driver_root=lay_out_driver_root(tmp_path / "driver", "580.95.05"),
    )
    kubelet = TestKubelet(kubelet_root)

    async def service(ctx: ServiceContext) -> None:
        serving = asyncio.create_task(run(ctx, settings))
        try:
            await asyncio.wait_for(ctx.ready.wait(), 20)
            assert await until_readyz(ctx.health_port, 200) == {"ready": True, "reasons": []}
            [socket] = kubelet.registration_sockets()
            await kubelet.notify(socket, registered=False, error="driver name already registered")
            refused = await until_readyz(ctx.health_port, 503)
            assert refused["reasons"] == [
                "kubelet refused the plugin registration: driver name already registered"
            ]
            await kubelet.notify(socket, registered=True)
            assert await until_readyz(ctx.health_port, 200) == {"ready": True, "reasons": []}
        finally:
            ctx.stop.set()
            await serving

    try:
        assert await serve("cdi", "cdi@node-a", settings, service) == 0
    finally:
        await kubelet.close()
        shutil.rmtree(kubelet_root, ignore_errors=True)


def test_driver_root_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["--nats-url", "nats://127.0.0.1:4222", "--node-name", "n1"]
    defaults = parse_settings(base)
    assert (defaults.driver_root, defaults.driver_root_mount, defaults.cdi_hook_path) == (
        Path("/"),
        None,
        Path("/usr/bin/nvidia-cdi-hook"),
    )
    monkeypatch.setenv("TANGRAM_DRIVER_ROOT", "/run/nvidia/driver")
    monkeypatch.setenv("TANGRAM_DRIVER_ROOT_MOUNT", "/driver-root/run/nvidia/driver")
    monkeypatch.setenv("TANGRAM_CDI_HOOK_PATH", "/usr/local/nvidia/toolkit/nvidia-cdi-hook")
    from_env = parse_settings(base)
    assert (from_env.driver_root, from_env.driver_root_mount, from_env.cdi_hook_path) == (
        Path("/run/nvidia/driver"),
        Path("/driver-root/run/nvidia/driver"),
        Path("/usr/local/nvidia/toolkit/nvidia-cdi-hook"),
    )


async def test_kubelet_sees_a_gpu_the_inventory_marks_failing_as_unhealthy(
    nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    kubelet_root = Path(tempfile.mkdtemp(prefix="tk-", dir="/tmp"))
    settings = CdiSettings(
        nats_urls=(nats_server.url,),
        node_name=NODE,
        kubelet_root=kubelet_root,
        cdi_dir=tmp_path / "cdi",
        driver_root=lay_out_driver_root(tmp_path / "driver", "580.95.05"),
    )
    kubelet = TestKubelet(kubelet_root)
    healthy = inventory()
    failing = msgspec.structs.replace(
        healthy,
        event_id=uuid.uuid4().hex,  # a new publication, not a redelivery of the first
        hardware=msgspec.structs.replace(
            healthy.hardware,
            gpus=[
                msgspec.structs.replace(g, health="unhealthy") if g.index == 1 else g
                for g in healthy.hardware.gpus
            ],
        ),
    )
    await bus.publish(healthy)

    async def service(ctx: ServiceContext) -> None:
        serving = asyncio.create_task(run(ctx, settings))
        try:
            await asyncio.wait_for(ctx.ready.wait(), 20)
            stream = kubelet.watch_health(str(kubelet_root / "plugins" / "gpu.tangram.dev" / "dra.sock"))
            try:
                first = {
                    d.device.device_name: d.health
                    for d in (await asyncio.wait_for(stream.read(), 10)).devices
                }
                assert first["gpu-1"] == health_pb2.HEALTHY
                await bus.publish(failing)  # discovery saw an ECC error on GPU 1
                second = {
                    d.device.device_name: d.health
                    for d in (await asyncio.wait_for(stream.read(), 10)).devices
                }
                assert second["gpu-1"] == health_pb2.UNHEALTHY and second["gpu-0"] == health_pb2.HEALTHY
            finally:
                stream.cancel()
        finally:
            ctx.stop.set()
            await serving

    try:
        assert await serve("cdi", f"cdi@{NODE}", settings, service) == 0
    finally:
        await kubelet.close()
        shutil.rmtree(kubelet_root, ignore_errors=True)
