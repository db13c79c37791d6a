"""Shared fixtures: a real nats-server (or a 3-server JetStream cluster) per test, and a guard
against leaked asyncio tasks."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tangram.bus import Bus, BusConfig
from tangram.local.natsserver import NatsCluster, NatsServer

# the real Kubernetes control plane: `controlplane`, `kube`, `unique` and friends
pytest_plugins = ["tests.support.controlplane"]


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    """A fresh nats-server with JetStream on a free loopback port and its own store."""
    with tempfile.TemporaryDirectory(prefix="tangram-nats-") as store:
        server = NatsServer(Path(store))
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def nats_cluster() -> Iterator[NatsCluster]:
    """Three nats-servers in one JetStream cluster on loopback, each with its own ports and store."""
    with tempfile.TemporaryDirectory(prefix="tangram-nats-cluster-") as root:
        cluster = NatsCluster(Path(root))
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture
async def bus(nats_server: NatsServer) -> AsyncIterator[Bus]:
    client = await Bus.connect(
        BusConfig(servers=(nats_server.url,), name="test", producer="test", publish_retry_s=20.0), wait_s=30
    )
    await client.ensure_streams()
    try:
        yield client
    finally:
        await client.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        function = getattr(item, "function", None)
        if function is not None and asyncio.iscoroutinefunction(function):
            # First in, last out: the guard checks after every other fixture has cleaned up.
            item.fixturenames.insert(0, "no_leaked_tasks")  # type: ignore[attr-defined]


@pytest.fixture
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks running behind it."""
    before = set(asyncio.all_tasks())
    yield
    await asyncio.sleep(0)
    leaked = [
        task
        for task in asyncio.all_tasks() - before
        if not task.done() and task is not asyncio.current_task() and not _owned_by_nats(task)
    ]
    for task in leaked:
        task.cancel()
    assert not leaked, f"test leaked asyncio tasks: {leaked}"
    open_transports = _open_transports()
    assert not open_transports, f"test left connections open: {open_transports}"


def _open_transports() -> list[str]:
    """Sockets this test's event loop still serves: left to the garbage collector, each would fail
    whichever later test it is collected in."""
    loop = asyncio.get_running_loop()
    transports = getattr(loop, "_transports", {})
    return [
        f"{t!r} {t.get_extra_info('sockname')} -> {t.get_extra_info('peername')}"
        for t in list(transports.values())
        if t is not None and not t.is_closing()
    ]


def _owned_by_nats(task: asyncio.Task[object]) -> bool:
    """nats-py's own reader/flusher tasks end with the connection's close, after the fixture."""
    code = task.get_coro().__qualname__ if hasattr(task.get_coro(), "__qualname__") else ""  # type: ignore[union-attr]
    return code.startswith(("Client.", "NATS.", "Subscription."))
