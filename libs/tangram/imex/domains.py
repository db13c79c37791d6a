"""The IMEX daemon of the NVLink domain a node serves, from its domain's first prepared claim on the
node to its last, and the domain's channel device node.

A node serves one domain at a time (its daemon's nodes config is one list). The daemon's config
directory is `<root>/<namespace>_<group>/`: `config.cfg` (the daemon's settings, naming the nodes
config), `nodes_config.cfg` (the domain's nodes, one a line: exactly those the allocator placed the
domain on), `nvidia-imex.pid` and `nvidia-imex.log`. The claims of a domain are the node's prepared
claims that carry its channel, so `recover` rebuilds everything from the preparer's checkpoint:
daemons of domains with a claim left run (started again when they died), every other domain's
daemon is stopped and its directory removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from tangram.cdi.atomic import atomic_write
from tangram.cdi.devices import ImexGrant
from tangram.nvml.sim.imexd import STATUS_FILE
from tangram.sharing.daemons import process_alive

log = logging.getLogger(__name__)

REAL_DAEMON_COMMAND = ("nvidia-imex",)
SIMULATED_DAEMON_COMMAND = (sys.executable, "-m", "tangram.nvml.sim.imexd")
CONFIG_FILE = "config.cfg"
NODES_FILE = "nodes_config.cfg"
PID_FILE = "nvidia-imex.pid"
LOG_FILE = "nvidia-imex.log"
IMEX_SERVER_PORT = 50000
IMEX_COMMAND_PORT = 50005
DEVICE_CLASS = "nvidia-caps-imex-channels"  # the character device's name in /proc/devices


# Starts the daemon (argv after the snippet) in a session of its own, prints its pid and exits: the
# daemon is then no child of the service, as a daemon that forks into the background is not.
_LAUNCHER = (
    "import subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=sys.stderr, "
    "stderr=sys.stderr, start_new_session=True)\n"
    "print(p.pid, flush=True)\n"
)


class ImexError(RuntimeError):
    """The domain's daemon or channel cannot be set up on this node; the message says why."""


# The domain's node names -> the addresses its daemons reach each other at, in the same order.
Addresses = Callable[[Sequence[str]], Awaitable[list[str]]]


class ImexDomains:
    """`dev_root`: where the node's /dev is seen (the driver root mount); `simulated`: channel
    device nodes are plain files there, as the simulated driver root's other device nodes are;
    `addresses`: where each peer is reached (its Node's address in Kubernetes), else its name."""

    def __init__(
        self,
        *,
        node: str,
        root: Path,
        dev_root: Path,
        command: Sequence[str] = REAL_DAEMON_COMMAND,
        simulated: bool = False,
        timeout_s: float = 30.0,
        addresses: Addresses | None = None,
    ) -> None:
        self.node = node
        self._addresses = addresses
        self.root = root
        self.dev_root = dev_root
        self._command = tuple(command)
        self._simulated = simulated
        self._timeout_s = timeout_s
        self._claims: dict[str, ImexGrant] = {}  # claim uid -> its grant
        self._lock = asyncio.Lock()

    # --- what the preparer calls --------------------------------------------------------------------

    async def join(self, claim_uid: str, grant: ImexGrant) -> None:
        """The claim's domain served on this node: its channel made, its daemon running with the
        domain's nodes. ImexError when this node is not one of them or serves another domain."""
        if self.node not in grant.nodes:
            raise ImexError(
                f"the IMEX channel of domain {grant.domain} is for nodes {', '.join(grant.nodes)}, "
                f"not for this node ({self.node})"
            )
        async with self._lock:
            serving = self._serving()
            if serving is not None and serving.domain != grant.domain:
                raise ImexError(
                    f"this node serves the NVLink domain {serving.domain}; it cannot serve "
                    f"{grant.domain} too until that domain's claims are gone"
                )
            if serving is not None and (serving.channel, serving.nodes) != (grant.channel, grant.nodes):
                # the domain grew (a member placed again elsewhere): every claim reads the newest
                self._claims = {uid: grant for uid in self._claims}
            self._claims[claim_uid] = grant
            try:
                await asyncio.to_thread(self._make_channel, grant)
                await self._ensure_daemon(grant)
            except (OSError, ImexError) as error:
                del self._claims[claim_uid]
                if not self._claims:
                    await self._stop(grant)
                raise ImexError(f"IMEX domain {grant.domain} cannot be served: {error}") from None

    async def leave(self, claim_uid: str) -> None:
        """The claim is gone from the node: after its domain's last claim, the daemon stops and the
        domain's directory and channel device node are removed."""
        async with self._lock:
            grant = self._claims.pop(claim_uid, None)
            if grant is not None and not any(g.domain == grant.domain for g in self._claims.values()):
                await self._stop(grant)

    async def recover(self, grants: Mapping[str, ImexGrant]) -> None:
        """Daemons agree with the prepared claims (`grants`: claim uid -> grant)."""
        async with self._lock:
            self._claims = dict(grants)
            serving = self._serving()
            names = {serving.directory_name} if serving is not None else set()
            for directory in sorted(self.root.glob("*")) if self.root.is_dir() else []:
                if directory.is_dir() and directory.name not in names:
                    await self._stop_directory(directory)
            if serving is not None:
                try:
                    await asyncio.to_thread(self._make_channel, serving)
                    await self._ensure_daemon(serving)
                except (OSError, ImexError) as error:
                    log.error("IMEX domain %s could not be served again: %s", serving.domain, error)

    def serving(self) -> ImexGrant | None:
        return self._serving()

    # --- the daemon ---------------------------------------------------------------------------------

    def _serving(self) -> ImexGrant | None:
        return next(iter(self._claims.values()), None)

    def _directory(self, grant: ImexGrant) -> Path:
        return self.root / grant.directory_name

    async def _peers(self, grant: ImexGrant) -> list[str]:
        if self._addresses is None:
            return list(grant.nodes)
        try:
            return await self._addresses(grant.nodes)
        except Exception as error:  # the resolver is I/O: whatever it raises says why
            raise ImexError(f"the addresses of nodes {', '.join(grant.nodes)} are unknown: {error}") from None

    async def _ensure_daemon(self, grant: ImexGrant) -> None:
        directory = self._directory(grant)
        nodes_text = "".join(f"{peer}\n" for peer in await self._peers(grant))
        nodes_path = directory / NODES_FILE
        current = nodes_path.read_text(encoding="utf-8") if nodes_path.exists() else None
        pid = _read_pid(directory)
        if current == nodes_text and pid is not None and process_alive(pid):
            return
        if pid is not None and process_alive(pid):
            await self._terminate(pid)  # the nodes changed: the daemon reads them at start
        await asyncio.to_thread(self._write_configs, directory, nodes_text)
        await self._start(directory)

    def _write_configs(self, directory: Path, nodes_text: str) -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(directory / NODES_FILE, nodes_text.encode(), mode=0o644)
        config = "".join(
            f"{key}={value}\n"
            for key, value in (
                ("LOG_FILE_NAME", directory / LOG_FILE),
                ("LOG_LEVEL", 4),
                ("SERVER_PORT", IMEX_SERVER_PORT),
                ("IMEX_CMD_PORT", IMEX_COMMAND_PORT),
                ("IMEX_CMD_ENABLED", 1),
                ("IMEX_NODE_CONFIG_FILE", directory / NODES_FILE),
            )
        )
        atomic_write(directory / CONFIG_FILE, config.encode(), mode=0o644)

    async def _start(self, directory: Path) -> None:
        pid = await asyncio.to_thread(self._spawn, directory)
        atomic_write(directory / PID_FILE, f"{pid}\n".encode(), mode=0o644)
        await self._until_serving(directory, pid)

    def _spawn(self, directory: Path) -> int:
        """The daemon, detached as a daemon is: in its own session, not this service's child, so it
        outlives a restart of this service (which adopts it) and leaves no child to reap."""
        argv = [*self._command, "-c", str(directory / CONFIG_FILE)]
        with (directory / LOG_FILE).open("ab") as log_file:
            launched = subprocess.run(
                [sys.executable, "-c", _LAUNCHER, *argv],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log_file,
                timeout=self._timeout_s,
                check=False,
            )
        text = launched.stdout.decode("ascii", errors="replace").strip()
        if launched.returncode != 0 or not text.isdigit():
            raise ImexError(f"the IMEX daemon could not be launched: {_tail(directory / LOG_FILE)}")
        return int(text)

    async def _until_serving(self, directory: Path, pid: int) -> None:
        """The daemon up, or the reason it is not: a real daemon logs to its file, the stand-in
        writes its status; either way a daemon gone at start failed to start."""
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + self._timeout_s, 0.02
        while True:
            if not process_alive(pid):
                raise ImexError(f"the IMEX daemon exited at start: {_tail(directory / LOG_FILE)}")
            if not self._simulated or (directory / STATUS_FILE).exists():
                return
            if loop.time() > deadline:
                raise ImexError(f"the IMEX daemon did not serve within {self._timeout_s:g} s")
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)

    async def _stop(self, grant: ImexGrant) -> None:
        await self._stop_directory(self._directory(grant))
        await asyncio.to_thread(self._remove_channel, grant)

    async def _stop_directory(self, directory: Path) -> None:
        pid = _read_pid(directory)
        if pid is not None and process_alive(pid):
            await self._terminate(pid)
        await asyncio.to_thread(shutil.rmtree, directory, True)

    async def _terminate(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + self._timeout_s, 0.02
        while process_alive(pid):
            if loop.time() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)

    # --- the channel device node --------------------------------------------------------------------

    def _make_channel(self, grant: ImexGrant) -> None:
        path = self.dev_root / grant.device_path.lstrip("/")
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        if self._simulated:
            path.touch(mode=0o666)
            return
        major = _device_major(Path("/proc/devices"), DEVICE_CLASS)
        if major is None:
            raise ImexError(
                f"the driver offers no {DEVICE_CLASS} devices (/proc/devices): is IMEX supported?"
            )
        os.mknod(path, 0o666 | 0o020000, os.makedev(major, grant.channel))  # a character device

    def _remove_channel(self, grant: ImexGrant) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.dev_root / grant.device_path.lstrip("/")).unlink()


def _read_pid(directory: Path) -> int | None:
    try:
        text = (directory / PID_FILE).read_text(encoding="ascii", errors="replace").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return int(text) if text.isdigit() and 0 < int(text) < 2**22 else None


def _device_major(proc_devices: Path, name: str) -> int | None:
    """The major number /proc/devices gives the character device `name`."""
    with contextlib.suppress(OSError):
        for line in proc_devices.read_text(encoding="ascii", errors="replace").splitlines():
            number, _, device = line.strip().partition(" ")
            if device.strip() == name and number.isdigit():
                return int(number)
    return None


def _tail(path: Path, limit: int = 400) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(encoding="utf-8", errors="replace")[-limit:].strip() or "(nothing logged)"
    return "(no log)"
