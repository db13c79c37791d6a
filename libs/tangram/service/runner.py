"""Runs a service: logs, health and metrics, the bus connection, SIGTERM as a graceful stop.

A service is an async function of a ServiceContext. It returns when `ctx.stop` is set. An
exception escaping it is fatal: the process exits non-zero instead of staying half alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from tangram.bus import Bus, BusConfig, redact_url
from tangram.natsauth.permissions import node_user
from tangram.service.health import HealthServer, ReadinessCheck
from tangram.service.logs import configure_logging
from tangram.service.settings import NodeSettings, ServiceSettings

log = logging.getLogger("tangram.service")

_T = TypeVar("_T")


@dataclass
class ServiceContext:
    name: str
    bus: Bus
    stop: asyncio.Event
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    # Conditions /readyz also requires; a service appends what it depends on (kubelet, the API server).
    readiness: list[ReadinessCheck] = field(default_factory=list)
    health_port: int = 0  # where /healthz, /readyz and /metrics answer
    health: HealthServer | None = None


ServiceMain = Callable[[ServiceContext], Awaitable[None]]


def bus_config(settings: ServiceSettings, *, name: str, producer: str) -> BusConfig:
    token_file = settings.nats_token_file
    if token_file is not None and not isinstance(settings, NodeSettings):
        raise ValueError("a NATS token file identifies a node: only node services take one")
    return BusConfig(
        servers=settings.nats_urls,
        name=name,
        producer=producer,
        credentials_file=str(settings.nats_credentials) if settings.nats_credentials else None,
        token_file=str(token_file) if token_file is not None else None,
        # the auth callout names the user after the node the token is bound to
        user=node_user(settings.node_name)
        if token_file is not None and isinstance(settings, NodeSettings)
        else None,
        tls_ca_file=str(settings.nats_tls_ca) if settings.nats_tls_ca else None,
        tls_cert_file=str(settings.nats_tls_cert) if settings.nats_tls_cert else None,
        tls_key_file=str(settings.nats_tls_key) if settings.nats_tls_key else None,
        stream_replicas=settings.nats_stream_replicas,
    )


async def serve(name: str, producer: str, settings: ServiceSettings, main: ServiceMain) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    ready = asyncio.Event()
    readiness: list[ReadinessCheck] = []
    health = HealthServer(settings.health_host, settings.health_port, ready.is_set, readiness)
    await health.start()
    log.info(
        "service starting",
        extra={"health_port": health.port, "nats": [redact_url(u) for u in settings.nats_urls]},
    )
    bus: Bus | None = None
    watch: asyncio.Task[None] | None = None
    try:
        # A SIGTERM while NATS is still being reached stops the start, not only a running service.
        bus = await _unless_stopped(Bus.connect(bus_config(settings, name=name, producer=producer)), stop)
        if bus is None:
            log.info("stopped while starting")
            return 0
        connected = bus
        readiness.append(
            lambda: None if connected.nats.is_connected else "NATS is unreachable (reconnecting)"
        )

        async def stop_when_lost() -> None:
            # A connection the server ended for good (an expired user whose token was not rotated
            # in time, revoked credentials) never comes back: exit, so that a restart connects afresh.
            await connected.lost.wait()
            stop.set()

        watch = asyncio.create_task(stop_when_lost(), name="nats-lost")
        if not await _unless_stopped(_true(bus.ensure_streams()), stop):
            if bus.lost.is_set():
                log.error("NATS connection lost for good while starting, exiting")
                return 1
            log.info("stopped while starting")
            return 0
        await main(
            ServiceContext(
                name=name,
                bus=bus,
                stop=stop,
                ready=ready,
                readiness=readiness,
                health_port=health.port,
                health=health,
            )
        )
        if bus.lost.is_set():
            log.error("NATS connection lost for good, exiting")
            return 1
        log.info("service stopped")
        return 0
    except Exception:
        log.exception("fatal error, exiting")
        return 1
    finally:
        if watch is not None:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        if bus is not None:
            with contextlib.suppress(Exception):
                await bus.close()
        await health.stop()


async def _true(step: Awaitable[None]) -> bool:
    await step
    return True


async def _unless_stopped(step: Awaitable[_T], stop: asyncio.Event) -> _T | None:
    """The step's result, or None (the step cancelled) once `stop` is set first."""
    work = asyncio.ensure_future(step)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if work.done():
        return work.result()
    # nats-py's first connect swallows a cancellation that lands in its close path and goes on
    # trying: cancel again until the step has really stopped.
    while not work.done():
        work.cancel()
        await asyncio.wait({work}, timeout=0.5)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        work.result()
    return None


def run_service(name: str, producer: str, settings: ServiceSettings, main: ServiceMain) -> int:
    configure_logging(name, settings.log_level)
    return asyncio.run(serve(name, producer, settings, main))
