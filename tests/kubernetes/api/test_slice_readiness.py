"""Discovery with --kubernetes is not ready while its ResourceSlices stay out of sync, and says why."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.discovery.service import run
from services.discovery.settings import DiscoverySettings
from tangram.bus import Bus
from tangram.local.natsserver import NatsServer
from tangram.service import ServiceContext
from tests.kubernetes.api.apiserver import LocalApiServer
from tests.kubernetes.api.helpers import NODE, write_kubeconfig
from tests.support.polling import until


def problems(ctx: ServiceContext) -> list[str]:
    return [reason for check in ctx.readiness if (reason := check())]


async def test_an_api_outage_longer_than_the_stale_window_makes_discovery_unready(
    bus: Bus, nats_server: NatsServer, apiserver: LocalApiServer, tmp_path: Path
) -> None:
    settings = DiscoverySettings(
        nats_urls=(nats_server.url,),
        node_name=NODE,
        sim="l40s-8",
        state_file=tmp_path / "gpus.json",
        refresh_s=0.1,
        kubernetes=True,
        kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", apiserver.url),
        k8s_version="1.36",  # the small API server serves 1.36 and answers no layout probe
        slice_stale_s=0.3,
    )
    await apiserver.stop()  # the API server is down when discovery first publishes
    ctx = ServiceContext(name="discovery", bus=bus, stop=asyncio.Event())
    task = asyncio.create_task(run(ctx, settings))
    try:
        await asyncio.wait_for(ctx.ready.wait(), 20)
        await until("bool(problems(ctx))", lambda: bool(problems(ctx)), 20)
        [reason] = problems(ctx)
        assert reason.startswith("ResourceSlices not synced for ")
        assert reason.partition(" s: ")[2].strip() != ""  # the API error itself is named
        assert apiserver.slices(NODE) == []
        await apiserver.start()  # the same port: the pending retry reaches it
        await until("the pool published", lambda: len(apiserver.slices(NODE)) == 2, 20)  # devices, counters
        await until("not problems(ctx)", lambda: not problems(ctx), 20)
    finally:
        ctx.stop.set()
        await task


async def test_synced_slices_keep_discovery_ready(
    bus: Bus, nats_server: NatsServer, apiserver: LocalApiServer, tmp_path: Path
) -> None:
    settings = DiscoverySettings(
        nats_urls=(nats_server.url,),
        node_name=NODE,
        sim="l40s-8",
        state_file=tmp_path / "gpus.json",
        refresh_s=0.1,
        kubernetes=True,
        kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", apiserver.url),
        k8s_version="1.36",  # the small API server serves 1.36 and answers no layout probe
        slice_stale_s=0.3,
    )
    ctx = ServiceContext(name="discovery", bus=bus, stop=asyncio.Event())
    task = asyncio.create_task(run(ctx, settings))
    try:
        await asyncio.wait_for(ctx.ready.wait(), 20)
        await until("the pool published", lambda: len(apiserver.slices(NODE)) == 2, 20)  # devices, counters
        assert len(ctx.readiness) == 1  # the slice check is registered
        assert problems(ctx) == []
    finally:
        ctx.stop.set()
        await task
