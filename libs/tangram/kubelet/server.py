"""The plugin's two unix-socket gRPC servers, and re-registration when kubelet restarts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from types import TracebackType

import grpc

from tangram.kubelet.config import PluginConfig
from tangram.kubelet.devicemetrics import CLAIM_DEVICES
from tangram.kubelet.health import HealthBoard
from tangram.kubelet.preparer import ClaimPreparer
from tangram.kubelet.proto import (
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2_grpc,
)
from tangram.kubelet.servicers import (
    DraHealthServicer,
    RegistrationServicer,
    RegistrationState,
    dra_servicers,
)

log = logging.getLogger(__name__)

SOCKET_MODE = 0o600
PRIVATE_DIR_MODE = 0o700
STOP_GRACE_S = 1.0


def _ensure_private_dir(directory: Path) -> None:
    """Create a missing directory readable by its owner only; an existing one is kubelet's to manage."""
    if not directory.exists():
        directory.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        os.chmod(directory, PRIVATE_DIR_MODE)


def _remove_stale(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class KubeletPlugin:
    """Serves the DRA service and the registration service until stopped.

    Kubelet deletes the registration sockets in plugins_registry when it restarts and then watches
    the directory for new ones; the plugin notices its socket is gone and serves a fresh one.
    """

    def __init__(
        self, config: PluginConfig, preparer: ClaimPreparer, health: HealthBoard | None = None
    ) -> None:
        self.config = config
        self.preparer = preparer
        # What the node's inventory says of each device, streamed to kubelet when it asks.
        self.health = (
            health if health is not None else HealthBoard(config.node_name, driver=config.driver_name)
        )
        self.registration = RegistrationState()
        self.registrations_served = 0
        self._dra_server: grpc.aio.Server | None = None
        self._registration_server: grpc.aio.Server | None = None
        self._registration_inode: int | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._status_task: asyncio.Task[None] | None = None
        self._served = asyncio.Condition()

    async def __aenter__(self) -> KubeletPlugin:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        _ensure_private_dir(self.config.plugin_dir)
        _ensure_private_dir(self.config.registry_dir)
        self._dra_server = await self._serve_dra()
        await self._serve_registration()
        self._watch_task = asyncio.create_task(self._watch_registration(), name="kubelet-registration-watch")
        CLAIM_DEVICES.watch(self, self.config.node_name, lambda: self.preparer.prepared_claims)
        if self.preparer.reports_status:
            self._status_task = asyncio.create_task(self._report_health(), name="kubelet-claim-status")

    async def stop(self) -> None:
        CLAIM_DEVICES.forget(self)
        for task in (self._watch_task, self._status_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._watch_task = self._status_task = None
        for server in (self._registration_server, self._dra_server):
            if server is not None:
                await server.stop(STOP_GRACE_S)
        self._registration_server = self._dra_server = None
        # Kubelet deregisters a plugin whose registration socket disappears.
        _remove_stale(self.config.registration_socket)
        _remove_stale(self.config.dra_socket)

    async def _bind(self, server: grpc.aio.Server, path: Path) -> None:
        _remove_stale(path)
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        os.chmod(path, SOCKET_MODE)

    async def _serve_dra(self) -> grpc.aio.Server:
        server = grpc.aio.server()
        servicers = dra_servicers(self.preparer)
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(servicers["v1"], server)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(servicers["v1beta1"], server)
        dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            DraHealthServicer(self.health), server
        )
        await self._bind(server, self.config.dra_socket)
        return server

    async def _serve_registration(self) -> None:
        if self._registration_server is not None:
            await self._registration_server.stop(0)
        server = grpc.aio.server()
        servicer = RegistrationServicer(
            driver_name=self.config.driver_name,
            endpoint=str(self.config.dra_socket),
            state=self.registration,
        )
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(servicer, server)
        await self._bind(server, self.config.registration_socket)
        self._registration_server = server
        self._registration_inode = os.stat(self.config.registration_socket).st_ino
        self.registrations_served += 1
        async with self._served:
            self._served.notify_all()
        log.info("serving registration socket %s", self.config.registration_socket)

    async def wait_for_registrations(self, count: int) -> None:
        """Return once the registration socket has been served `count` times since start."""
        async with self._served:
            await self._served.wait_for(lambda: self.registrations_served >= count)

    def registration_problem(self) -> str | None:
        """Why kubelet cannot reach this plugin now (a readiness check), or None.

        No word from kubelet yet is not a problem: kubelet may be slow, or absent in local mode.
        """
        if self._registration_server is None:
            return "kubelet plugin is not serving"
        if not self._registration_socket_intact():
            return (
                f"kubelet registration socket {self.config.registration_socket} is gone (registering again)"
            )
        if self.registration.notifications and not self.registration.registered:
            return f"kubelet refused the plugin registration: {self.registration.error or 'no reason given'}"
        return None

    def _registration_socket_intact(self) -> bool:
        try:
            return os.stat(self.config.registration_socket).st_ino == self._registration_inode
        except FileNotFoundError:
            return False

    async def _report_health(self) -> None:
        """Prepared claims reported again at start (a restarted plugin holds claims prepared
        before) and whenever a device's health changes: what a claim says of its GPU stays true."""
        async for _ in self.health.watch():
            await self.preparer.refresh_status()

    async def _watch_registration(self) -> None:
        while True:
            await asyncio.sleep(self.config.registration_check_interval_s)
            if self._registration_socket_intact():
                continue
            log.warning("registration socket %s is gone; registering again", self.config.registration_socket)
            try:
                _ensure_private_dir(self.config.registry_dir)
                await self._serve_registration()
            except (OSError, RuntimeError):
                log.exception("could not serve the registration socket; will retry")
