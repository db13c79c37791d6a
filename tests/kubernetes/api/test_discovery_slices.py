"""The discovery service with --kubernetes publishes its node's ResourceSlices to the API server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from services.discovery.service import run
from services.discovery.settings import DiscoverySettings, parse_settings
from tangram.bus import Bus
from tangram.local.natsserver import NatsServer
from tangram.service import ServiceContext
from tests.kubernetes.api.apiserver import LocalApiServer
from tests.kubernetes.api.helpers import NODE, simulated, write_kubeconfig
from tests.support.polling import until


async def run_discovery(settings: DiscoverySettings, bus: Bus, then: Callable[[], Awaitable[None]]) -> None:
    ctx = ServiceContext(name="discovery", bus=bus, stop=asyncio.Event())
    task = asyncio.create_task(run(ctx, settings))
    try:
        await asyncio.wait_for(ctx.ready.wait(), 20)
        await then()
    finally:
        ctx.stop.set()
        await task


async def test_discovery_publishes_and_updates_its_nodes_slices(
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
        k8s_version="1.36",
    )

    def device_slice() -> dict[str, Any]:
        [found] = [s for s in apiserver.slices(NODE) if s["spec"].get("devices")]
        return found

    async def slices_follow_the_hardware() -> None:
        # 1.36 keeps consumable capacity: each GPU and its share host, apart from the GPUs' counter sets
        await until("len(apiserver.slices(NODE)) == 2", lambda: len(apiserver.slices(NODE)) == 2, 20)
        first = device_slice()
        assert first["metadata"]["name"].startswith("gpu-node.example.com-gpu-tangram-dev-")
        assert [d["name"] for d in first["spec"]["devices"]] == [
            name for i in range(8) for name in (f"gpu-{i}", f"gpu-{i}-shared")
        ]
        assert first["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 2}

        simulated("l40s-8", state).sim_set_lost(2)  # another process sees GPU 2 fall off the bus
        await until(
            "the pool's generation 2",
            lambda: all(s["spec"]["pool"]["generation"] == 2 for s in apiserver.slices(NODE)),
            20,
        )

    await run_discovery(settings, bus, slices_follow_the_hardware)
    tainted = [d["name"] for d in device_slice()["spec"]["devices"] if d.get("taints")]
    assert tainted == ["gpu-2", "gpu-2-shared"]


async def test_discovery_survives_an_api_outage_and_catches_up(
    bus: Bus, nats_server: NatsServer, apiserver: LocalApiServer, tmp_path: Path
) -> None:
    settings = DiscoverySettings(
        nats_urls=(nats_server.url,),
        node_name=NODE,
        sim="l40s-8",
        state_file=tmp_path / "gpus.json",
        refresh_s=0.1,
        kubernetes=True,
        k8s_version="1.36",
        kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", apiserver.url),
    )
    apiserver.fail_next(1, status=503)

    async def catches_up() -> None:
        await until(
            "len(apiserver.slices(NODE)) == 2", lambda: len(apiserver.slices(NODE)) == 2, 20
        )  # after the 1 s backoff

    await run_discovery(settings, bus, catches_up)
    methods = [method for method, _ in apiserver.requests]
    # the refused list, then a list that succeeded, and only then the create (the drift watch
    # lists the pool too, so its list may come between them)
    first_write = methods.index("POST")
    assert first_write >= 2 and set(methods[:first_write]) == {"GET"}, methods


def test_kubernetes_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["--nats-url", "nats://127.0.0.1:4222", "--node-name", "n1", "--sim", "l40s-8"]
    settings = parse_settings(
        [*base, "--kubernetes", "--kubeconfig", "/etc/kube/config", "--k8s-version", "1.34"]
    )
    assert (settings.kubernetes, settings.kubeconfig, settings.k8s_version) == (
        True,
        Path("/etc/kube/config"),
        "1.34",
    )
    assert settings.driver == "gpu.tangram.dev"
    defaults = parse_settings(base)
    assert (defaults.kubernetes, defaults.kubeconfig, defaults.k8s_version) == (False, None, None)
    monkeypatch.setenv("TANGRAM_KUBERNETES", "1")
    assert parse_settings(base).kubernetes is True
    with pytest.raises(SystemExit):
        parse_settings([*base, "--k8s-version", "1.30"])
    assert defaults.network_block_label == "network.topology.kubernetes.io/block"
    chosen = parse_settings([*base, "--network-block-label", "cloud.google.com/gce-topology-block"])
    assert chosen.network_block_label == "cloud.google.com/gce-topology-block"
    with pytest.raises(ValueError, match="network_block_label"):
        parse_settings([*base, "--network-block-label", "not a label/key/"])
