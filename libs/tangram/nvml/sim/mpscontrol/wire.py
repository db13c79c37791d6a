"""How the stand-in's client and daemon talk over the control socket.

A command goes as one line of text. Its reply comes back as a header line `<status> <length>`
(status 0: done, 1: refused) and `length` bytes of text. Both sides bound what they read.
"""

from __future__ import annotations

import socket

MAX_LINE = 4096
MAX_REPLY = 64 * 1024


class WireError(RuntimeError):
    """The other side broke the exchange: closed early, or sent something malformed."""


def read_line(sock: socket.socket, pending: bytearray) -> bytes | None:
    """The next line (without its newline) from `sock`; None when the peer closed first."""
    while b"\n" not in pending:
        if len(pending) > MAX_LINE:
            raise WireError(f"line longer than {MAX_LINE} bytes")
        chunk = sock.recv(4096)
        if not chunk:
            return None
        pending.extend(chunk)
    line, _, rest = bytes(pending).partition(b"\n")
    pending[:] = rest
    return line


def encode_reply(ok: bool, text: str) -> bytes:
    body = text.encode("utf-8")
    return f"{0 if ok else 1} {len(body)}\n".encode("ascii") + body


def read_reply(sock: socket.socket, pending: bytearray) -> tuple[bool, str]:
    header = read_line(sock, pending)
    if header is None:
        raise WireError("the daemon closed the connection without replying")
    try:
        status, length = (int(part) for part in header.split(b" "))
    except ValueError:
        raise WireError(f"malformed reply header {header[:40]!r}") from None
    if status not in (0, 1) or not 0 <= length <= MAX_REPLY:
        raise WireError(f"malformed reply header {header[:40]!r}")
    while len(pending) < length:
        chunk = sock.recv(length - len(pending))
        if not chunk:
            raise WireError("the daemon closed the connection in the middle of a reply")
        pending.extend(chunk)
    body = bytes(pending[:length])
    del pending[:length]
    return status == 0, body.decode("utf-8", "replace")
