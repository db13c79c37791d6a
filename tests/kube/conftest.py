"""A local API server per test, a kubernetes_asyncio client for it, and slices of simulated machines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tangram.dra import node_devices
from tangram.k8s import K8sVersion, render_slices
from tangram.kube import connect
from tangram.nvml import SimNvml
from tangram.nvml.inventory import read_node_hardware
from tests.kube.apiserver import LocalApiServer

DRIVER = "gpu.tangram.dev"


@pytest.fixture
async def apiserver() -> AsyncIterator[LocalApiServer]:
    server = LocalApiServer(k8s_version="1.36")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def kube_api(apiserver: LocalApiServer) -> AsyncIterator[Any]:
    client = await connect(host=apiserver.url)
    try:
        yield client
    finally:
        await client.close()


def simulated(machine: str, state_file: Path) -> SimNvml:
    nvml = SimNvml.from_machine(machine, state_file=state_file)
    nvml.nvmlInit()
    return nvml


def machine_slices(
    nvml: SimNvml, node: str, *, generation: int, k8s_version: K8sVersion = "1.36"
) -> list[dict[str, Any]]:
    hardware = read_node_hardware(nvml, node)
    return render_slices(
        node_devices(hardware, driver=DRIVER), k8s_version=k8s_version, generation=generation, driver=DRIVER
    )
