"""The cdi service refuses to start without a driver install instead of writing partial specs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from services.cdi.service import run
from services.cdi.settings import CdiSettings
from tangram.natsserver import NatsServer
from tangram.service.runner import serve


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
