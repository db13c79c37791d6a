"""A stand-in for NVIDIA's IMEX daemon (`nvidia-imex -c <config>`), for nodes whose GPUs are simulated.

Run as `python -m tangram.nvml.sim.imexd -c CONFIG`, in the foreground, it reads the daemon's
config file as the real one does (`KEY=VALUE` lines; `IMEX_NODE_CONFIG_FILE` names the nodes
config, one peer address or host name per line) and refuses what the real daemon cannot start
with: no nodes config, an empty one, a line that is no address or host name. Once started it
writes `imex-status.json` next to its config (its pid and the peers it serves, the answer
`nvidia-imex-ctl -N` gives on a real node) and runs until SIGTERM, when it removes that file. A
second daemon on the same config is refused while the first lives.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import sys
import threading
from pathlib import Path

STATUS_FILE = "imex-status.json"
LOCK_FILE = "nvidia-imex.lock"
NODES_KEY = "IMEX_NODE_CONFIG_FILE"
USAGE = "usage: python -m tangram.nvml.sim.imexd -c CONFIG"
_PEER = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9.:]{0,251}[A-Za-z0-9])?$")
MAX_PEERS = 1024


class ConfigError(ValueError):
    """What stops the daemon from starting; printed, and the exit status is 1."""


def read_config(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror or error}") from None
    config: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{path}:{number}: expected KEY=VALUE, got {line!r}")
        config[key.strip()] = value.strip()
    return config


def read_peers(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise ConfigError(f"cannot read nodes config {path}: {error.strerror or error}") from None
    peers = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not peers:
        raise ConfigError(f"nodes config {path} lists no node")
    if len(peers) > MAX_PEERS:
        raise ConfigError(f"nodes config {path} lists {len(peers)} nodes, more than {MAX_PEERS}")
    for peer in peers:
        if not _PEER.match(peer):
            raise ConfigError(f"nodes config {path}: {peer!r} is no address or host name")
    return peers


def run(config_path: Path) -> int:
    try:
        config = read_config(config_path)
        nodes_file = config.get(NODES_KEY)
        if not nodes_file:
            raise ConfigError(f"{config_path}: {NODES_KEY} is not set")
        peers = read_peers(Path(nodes_file))
    except ConfigError as error:
        print(f"nvidia-imex: {error}", file=sys.stderr, flush=True)
        return 1
    directory = config_path.parent
    lock = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("nvidia-imex: an IMEX daemon already runs with this config", file=sys.stderr, flush=True)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    status = directory / STATUS_FILE
    body = {"pid": os.getpid(), "nodes": peers, "state": "READY"}
    temp = status.with_suffix(".tmp")
    temp.write_text(json.dumps(body), encoding="utf-8")
    temp.replace(status)
    print(f"nvidia-imex: serving {len(peers)} nodes: {' '.join(peers)}", flush=True)
    try:
        stop.wait()
    finally:
        with contextlib.suppress(FileNotFoundError):
            status.unlink()
        os.close(lock)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "-c":
        print(USAGE, file=sys.stderr)
        return 1
    return run(Path(args[1]).absolute())


if __name__ == "__main__":
    sys.exit(main())
