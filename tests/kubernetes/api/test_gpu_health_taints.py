"""A GPU that reports an uncorrectable ECC error (XID 48) is published unhealthy and tainted in its slice."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import REGISTRY

from services.discovery.service import run
from services.discovery.settings import DiscoverySettings
from tangram.bus import Bus
from tangram.local.natsserver import NatsServer
from tangram.service import ServiceContext
from tests.kubernetes.api.apiserver import LocalApiServer
from tests.kubernetes.api.helpers import NODE, simulated, write_kubeconfig
from tests.support.polling import until

DOUBLE_BIT_ECC_XID = 48
APPLICATION_XID = 13  # graphics engine exception raised by the program: not the GPU's fault


def xids_seen(xid: int) -> float:
    return REGISTRY.get_sample_value("tangram_discovery_xid_events_total", {"xid": str(xid)}) or 0.0


def tainted(apiserver: LocalApiServer) -> dict[str, list[str]]:
    return {
        device["name"]: [taint["key"] for taint in device["taints"]]
        for piece in apiserver.slices(NODE)
        for device in piece["spec"].get("devices", [])
        if device.get("taints")
    }


async def test_ecc_xid_taints_the_gpu_and_an_application_xid_does_not(
    bus: Bus, nats_server: NatsServer, apiserver: LocalApiServer, tmp_path: Path
) -> None:
    state = tmp_path / "gpus.json"
    settings = DiscoverySettings(
        nats_urls=(nats_server.url,),
        node_name=NODE,
        sim="l40s-8",
        state_file=state,
        refresh_s=0.1,
        kubernetes=True,
        kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", apiserver.url),
        k8s_version="1.36",  # the small API server serves 1.36 and answers no layout probe
    )
    ctx = ServiceContext(name="discovery", bus=bus, stop=asyncio.Event())
    task = asyncio.create_task(run(ctx, settings))
    try:
        await asyncio.wait_for(ctx.ready.wait(), 20)
        await until("the pool published", lambda: len(apiserver.slices(NODE)) == 2, 20)  # devices, counters
        assert tainted(apiserver) == {}
        nvml = simulated("l40s-8", state)
        before = xids_seen(APPLICATION_XID)
        nvml.sim_inject_xid(5, APPLICATION_XID)
        await until(
            "xids_seen(APPLICATION_XID) > before", lambda: xids_seen(APPLICATION_XID) > before, 20
        )  # handled before the ECC error comes
        nvml.sim_inject_xid(3, DOUBLE_BIT_ECC_XID)
        await until("bool(tainted(apiserver))", lambda: bool(tainted(apiserver)), 20)
        # the GPU and its share host
        assert tainted(apiserver) == {
            "gpu-3": ["gpu.tangram.dev/unhealthy"],
            "gpu-3-shared": ["gpu.tangram.dev/unhealthy"],
        }
    finally:
        ctx.stop.set()
        await task
