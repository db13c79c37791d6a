"""Credential files: written atomically, readable by their owner only, and a user's NATS URL."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tangram.natsauth.permissions import NatsAuthError


def write_secret(path: Path, text: str) -> None:
    """Atomically write a file readable by its owner only (0600), even for an instant."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def user_url(server_url: str, user: str, password: str) -> str:
    shown = server_url[:200]
    try:
        parts = urlsplit(server_url)
        port_number = parts.port  # raises on a port out of range or not a number
    except ValueError as exc:
        raise NatsAuthError(f"--server-url {shown!r} is not a NATS URL: {exc}") from None
    if parts.scheme not in ("nats", "tls", "ws", "wss") or not parts.hostname:
        raise NatsAuthError(f"--server-url {shown!r} is not a NATS URL (nats://host:port)")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    port = f":{port_number}" if port_number else ""
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}{port}"))
