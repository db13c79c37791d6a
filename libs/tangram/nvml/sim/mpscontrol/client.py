"""The user interface side: commands from stdin to the daemon, replies to stdout."""

from __future__ import annotations

import socket
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from tangram.nvml.sim.mpscontrol import CONTROL_SOCKET, NO_DAEMON
from tangram.nvml.sim.mpscontrol.wire import MAX_LINE, WireError, read_reply

TIMEOUT_S = 30.0


def run(pipe_dir: Path, commands: Iterable[str], out: TextIO) -> int:
    """Send each non-blank line to the daemon of `pipe_dir`; 1 when there is no daemon or a
    command was refused, 0 otherwise."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(TIMEOUT_S)
    with sock:
        try:
            sock.connect(str(pipe_dir / CONTROL_SOCKET))
        except OSError:  # no socket, a dead daemon's socket, a path too long: no daemon to talk to
            print(NO_DAEMON, file=out, flush=True)
            return 1
        status = 0
        pending = bytearray()
        for raw in commands:
            line = raw.strip()
            if not line:
                continue
            data = line.encode("utf-8")
            if len(data) >= MAX_LINE:
                print(f"Command longer than {MAX_LINE} bytes", file=out, flush=True)
                status = 1
                continue
            try:
                sock.sendall(data + b"\n")
                ok, text = read_reply(sock, pending)
            except (WireError, OSError) as exc:
                print(f"Lost the MPS control daemon: {exc}", file=out, flush=True)
                return 1
            if text:
                print(text, file=out, flush=True)
            if not ok:
                status = 1
            elif line.split()[0] == "quit":
                return status  # the daemon is gone: nothing after quit can be sent
        return status
