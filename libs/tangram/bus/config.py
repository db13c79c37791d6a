"""The connection's settings (servers, credentials, token files, TLS), and which failures of a
request are worth waiting out."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import nats
import nats.errors
import nats.js.errors

from tangram.bus.errors import BusError

log = logging.getLogger("tangram.bus")

# Failures worth waiting out: the server is restarting, a reply was lost on the way, or (in a
# cluster) the stream has no leader for a moment while its replicas elect one.
TRANSIENT: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
    asyncio.TimeoutError,
)


# JetStream API errors worth waiting out: "no suitable peers for placement" while the servers of
# a cluster that just started (or restarted) have not all reported to the metadata leader yet.
TRANSIENT_API_CODES = frozenset({10005})


def transient_error(error: BaseException | None) -> bool:
    """What _api retries: timeouts and the cluster's temporary unavailability."""
    if isinstance(error, nats.js.errors.APIError) and not isinstance(error, TRANSIENT):
        return error.err_code in TRANSIENT_API_CODES
    return isinstance(error, TRANSIENT)


def is_transient(error: BusError) -> bool:
    """The request failed for a while only (a timeout, a cluster electing leaders): try again."""
    return transient_error(error.__cause__)


@dataclass(frozen=True)
class BusConfig:
    servers: tuple[str, ...]
    name: str  # connection name, visible in the server's monitoring
    producer: str  # written in every event's envelope
    credentials_file: str | None = None  # NATS .creds (JWT + nkey); never logged
    # A file holding the token sent at every (re)connection, read afresh each time so that a
    # rotated projected service-account token is picked up; never logged.
    token_file: str | None = None
    # The NATS user this connection becomes when its URL names none (the auth callout names it).
    user: str | None = None
    # With a token file: reconnect this long before the token the connection was made with
    # expires. The user the auth callout issued for it expires with it, and nats-server then
    # closes the connection in a way nats-py does not reconnect from.
    token_renew_margin_s: float = 60.0
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    connect_timeout_s: float = 5.0
    reconnect_forever: bool = True
    publish_retry_s: float = 60.0  # how long a publish keeps retrying through a server outage
    # Copies of each stream and bucket Tangram creates: 1 on a single server, 3 on a 3-server
    # JetStream cluster (a stream then survives the loss of any one server, acked messages included).
    stream_replicas: int = 1


def redact_url(url: str) -> str:
    """A NATS URL without its user:password, fit for a log line or an error message."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"***@{parts.hostname}{port}"))


def connection_user(config: BusConfig) -> str:
    """Who this connection speaks as: the NATS user of its URL, else its connection name.

    It prefixes the names of the consumers it creates and its reply inbox, so that the server's
    permissions can tell one user's consumers and replies from another's.
    """
    user = config.user or (urlsplit(config.servers[0]).username if config.servers else None)
    token = re.sub(r"[^a-z0-9_-]+", "-", (user or config.name).lower()).strip("-_")
    return token[:64] or "tangram"


def token_expiry(token: str) -> int | None:
    """`exp` of a JWT, read without verifying it (the server's side verifies; this only schedules)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    expires = claims.get("exp") if isinstance(claims, dict) else None
    return expires if isinstance(expires, int) else None


class TokenFile:
    """The token sent at each connection, read afresh each time: nats-py asks at every connection
    and reconnection, and the kubelet rewrites a projected token before it expires. An unreadable
    file sends an empty token, which the server refuses, and the client retries. `sent` is the
    token the current connection was made with."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sent = ""

    def read(self) -> str:
        try:
            with open(self.path, encoding="utf-8") as handle:
                return handle.read().strip()
        except OSError as exc:
            log.warning("NATS token file unreadable", extra={"path": self.path, "error": exc.strerror})
            return ""

    def __call__(self) -> str:
        self.sent = self.read()
        return self.sent


def inbox_prefix(config: BusConfig) -> str:
    """Replies to this connection arrive under `_INBOX_<user>`: no other user may subscribe there."""
    return f"_INBOX_{connection_user(config)}"


def tls_context(config: BusConfig) -> ssl.SSLContext | None:
    if config.tls_ca_file is None and config.tls_cert_file is None:
        return None
    context = ssl.create_default_context(cafile=config.tls_ca_file)
    if config.tls_cert_file is not None:
        context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    return context
