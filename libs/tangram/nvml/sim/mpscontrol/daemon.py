"""The control daemon: one pipe directory, one socket, one user interface connection at a time.

The pid file doubles as the instance lock: the daemon holds an exclusive flock on it for its whole
life, so a second daemon on the same pipe directory is refused while the first lives, and a
daemon killed without cleaning up leaves nothing that stops the next one (the kernel drops the
lock with the process; the stale socket is replaced).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TextIO

from tangram.nvml.sim.mpscontrol import ALREADY_RUNNING, CONTROL_SOCKET, LOG_FILE, PID_FILE
from tangram.nvml.sim.mpscontrol.commands import DaemonSettings, execute
from tangram.nvml.sim.mpscontrol.wire import WireError, encode_reply, read_line

SESSION_IDLE_S = 30.0  # a user interface that sends nothing for this long is dropped


class ControlLog:
    """control.log, in the real daemon's line format: `[date time.ms Control pid] message`."""

    def __init__(self, path: Path, echo: TextIO | None) -> None:
        self._file = path.open("a", encoding="utf-8")
        self._echo = echo

    def write(self, message: str) -> None:
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
        line = f"[{stamp} Control {os.getpid():>5}] {message}\n"
        self._file.write(line)
        self._file.flush()
        if self._echo is not None:
            self._echo.write(line)
            self._echo.flush()

    def close(self) -> None:
        self._file.close()


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _write_pid(lock: int, pid: int) -> None:
    os.ftruncate(lock, 0)
    os.pwrite(lock, f"{pid}\n".encode("ascii"), 0)


def _detach(lock: int) -> bool:
    """Double fork into a new session with stdio on /dev/null. True in the daemon, False in the
    caller, which gets control back once the daemon is on its own and its pid is in the pid file."""
    child = os.fork()
    if child > 0:
        os.waitpid(child, 0)
        return False
    os.setsid()
    daemon = os.fork()
    if daemon > 0:
        _write_pid(lock, daemon)
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    os.chdir("/")
    return True


def _listen(path: Path) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a dead daemon's socket: the lock says no daemon lives
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        listener.listen(16)
    except OSError:
        listener.close()
        raise
    return listener


def _session(conn: socket.socket, log: ControlLog, settings: DaemonSettings) -> bool:
    """Answer one user interface's commands until it closes; True when it asked the daemon to quit."""
    pending = bytearray()
    while True:
        raw = read_line(conn, pending)
        if raw is None:
            return False
        command = raw.decode("utf-8", "replace").strip()
        log.write(f"Cmd:{command[:200]}")
        reply = execute(settings, command)
        if reply.quit:
            return True
        conn.sendall(encode_reply(reply.ok, reply.text))


def _serve(listener: socket.socket, log: ControlLog, cleanup: list[Path]) -> None:
    settings = DaemonSettings()
    while True:
        conn, _ = listener.accept()
        with conn:
            log.write("Accepting connection...")
            log.write("NEW UI")
            conn.settimeout(SESSION_IDLE_S)
            try:
                quitting = _session(conn, log, settings)
            except (WireError, OSError) as exc:
                log.write(f"UI dropped: {exc}")
                continue
            if quitting:
                # Gone before the reply: whoever sent quit finds no socket once it has its answer.
                for path in cleanup:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                with contextlib.suppress(OSError):
                    conn.sendall(encode_reply(True, ""))
                log.write("UI closed")
                log.write("Exit")
                return
            log.write("UI closed")


def _refuse(message: str) -> int:
    print(message, file=sys.stderr, flush=True)
    return 1


def start(pipe_dir: Path, log_dir: Path, *, foreground: bool) -> int:
    """`-d` (background) or `-f` (foreground); the exit status of this process. Whatever can fail
    is tried before the daemon detaches, so that `-d` reports it."""
    pid_path, socket_path = pipe_dir / PID_FILE, pipe_dir / CONTROL_SOCKET
    try:
        pipe_dir.mkdir(parents=True, exist_ok=True)
        log_dir.mkdir(parents=True, exist_ok=True)
        lock = os.open(pid_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        return _refuse(f"Cannot use {exc.filename or pipe_dir}: {exc.strerror or exc}")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        print(ALREADY_RUNNING, flush=True)
        return 1
    try:
        log = ControlLog(log_dir / LOG_FILE, sys.stdout if foreground else None)
    except OSError as exc:
        os.close(lock)
        return _refuse(f"Cannot open {log_dir / LOG_FILE}: {exc.strerror or exc}")
    try:
        listener = _listen(socket_path)
    except OSError as exc:
        log.close()
        os.close(lock)
        return _refuse(f"Cannot listen on {socket_path}: {exc.strerror or exc}")
    if foreground:
        _write_pid(lock, os.getpid())
    elif not _detach(lock):
        return 0
    signal.signal(signal.SIGTERM, _stop)
    try:
        log.write(f"Starting control daemon using socket {socket_path}")
        log.write(f"To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={pipe_dir}")
        _serve(listener, log, [socket_path, pid_path])
    finally:
        listener.close()
        for path in (socket_path, pid_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        log.close()
        os.close(lock)
    return 0
