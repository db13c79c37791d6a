"""The connection to NATS: making it, keeping its token fresh, and the one path every JetStream
request takes (transient failures waited out, every other failure a BusError)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, ConsumerInfo

from tangram.bus.config import (
    TRANSIENT,
    TRANSIENT_API_CODES,
    BusConfig,
    TokenFile,
    inbox_prefix,
    redact_url,
    tls_context,
    token_expiry,
)
from tangram.bus.errors import BusError

log = logging.getLogger("tangram.bus")

T = TypeVar("T")

SHORT_LIVED_CREATE_WAIT_S = 3.0  # one attempt; a healthy create answers in milliseconds
SHORT_LIVED_CREATE_RETRY_S = 30.0  # all attempts: longer than a cluster takes to mark a server gone


@dataclass(frozen=True)
class Link:
    """An open connection, its one JetStream context, its settings and the user it speaks as:
    what declaring, publishing, replaying and consuming all work through."""

    nc: NatsClient
    js: JetStreamContext
    config: BusConfig
    user: str

    async def request(self, call: Callable[[], Awaitable[T]], what: str, *, retry_s: float = 0.0) -> T:
        """Every JetStream API request goes through here: transient errors retried, others -> BusError."""
        deadline = time.monotonic() + retry_s
        delay = 0.05
        while True:
            try:
                return await call()
            except TRANSIENT as exc:
                if time.monotonic() >= deadline or self.nc.is_closed:
                    raise BusError(f"{what}: {type(exc).__name__}: {exc}") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            except nats.js.errors.APIError as exc:
                if exc.err_code not in TRANSIENT_API_CODES or time.monotonic() >= deadline:
                    raise BusError(f"{what}: {exc}") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            except (nats.js.errors.Error, nats.errors.Error) as exc:
                raise BusError(f"{what}: {exc}") from exc

    def consumer_name(self) -> str:
        """A fresh name for a short-lived consumer: `<user>-<random>`.

        Named, never anonymous, so that it is created through the filtered create API
        (`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`), whose subject lets the server's
        permissions pin which filter a user may read.
        """
        return f"{self.user}-{uuid.uuid4().hex[:16]}"

    async def short_lived_consumer(self, stream: str, config: ConsumerConfig, what: str) -> ConsumerInfo:
        """Create a replay's or a follow's consumer (`config` less its name); its info, with its name.

        For seconds after a server dies, the metadata leader may still place a new consumer on it,
        and the create is never answered; retried under the same name it stays placed there (a
        create that way was refused for 40 s, 3 servers, one killed). So each attempt has a fresh
        name and a short wait. An attempt that was not answered in time may yet exist: it is
        deleted, and readers keep only deliveries of the consumer returned.
        """
        tried: list[str] = []

        def attempt() -> Awaitable[ConsumerInfo]:
            tried.append(self.consumer_name())
            return self.js.add_consumer(
                stream, config.evolve(name=tried[-1]), timeout=SHORT_LIVED_CREATE_WAIT_S
            )

        info = await self.request(attempt, what, retry_s=SHORT_LIVED_CREATE_RETRY_S)
        for stale in tried[:-1]:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.js.delete_consumer(stream, stale), SHORT_LIVED_CREATE_WAIT_S)
        return info


async def dial(
    config: BusConfig,
    *,
    token: TokenFile | None,
    on_closed: Callable[[], Awaitable[None]],
    wait_s: float | None,
) -> NatsClient:
    """Connect, retrying the first connection for `wait_s` (None: forever when reconnect_forever)."""
    options: dict[str, Any] = {
        "servers": list(config.servers),
        "name": config.name,
        "connect_timeout": config.connect_timeout_s,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1 if config.reconnect_forever else 60,
        "reconnect_time_wait": 0.25,
        "error_cb": _log_error,
        "disconnected_cb": _log_disconnected,
        "reconnected_cb": _log_reconnected,
        "closed_cb": on_closed,
        "inbox_prefix": inbox_prefix(config),
    }
    if config.credentials_file is not None:
        options["user_credentials"] = config.credentials_file
    if token is not None:
        options["token"] = token
    tls = tls_context(config)
    if tls is not None:
        options["tls"] = tls
    deadline = None if wait_s is None and config.reconnect_forever else time.monotonic() + (wait_s or 0)
    delay = 0.1
    while True:
        try:
            return await nats.connect(**options)
        except (nats.errors.NoServersError, OSError, nats.errors.TimeoutError) as exc:
            servers = [redact_url(url) for url in config.servers]
            if deadline is not None and time.monotonic() > deadline:
                raise BusError(f"cannot connect to NATS at {', '.join(servers)}: {exc}") from exc
            log.warning("nats not reachable, retrying", extra={"servers": servers, "error": str(exc)})
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def renew_before_expiry(nc: NatsClient, token: TokenFile, margin_s: float) -> None:
    """Reconnect with the current token `margin_s` before the one in use expires. A file that still
    holds the same token (the kubelet has not rotated it yet) is checked again shortly."""
    while True:
        expires = token_expiry(token.sent)
        if expires is None:
            return  # a token without expiry: its user does not expire either
        remaining = expires - time.time()
        await asyncio.sleep(max(0.0, remaining - margin_s))
        newer = token_expiry(token.read())
        if newer is None or newer <= expires:
            log.warning(
                "NATS token not rotated yet", extra={"path": token.path, "expires_in_s": round(remaining)}
            )
            await asyncio.sleep(min(5.0, max(0.5, expires - time.time())))
            continue
        if nc.is_connected:
            log.info("reconnecting with the rotated NATS token")
            await nc.force_reconnect()
        await asyncio.sleep(1.0)  # the reconnection sends the rotated token; then look again


async def _log_error(exc: Exception) -> None:
    log.warning("nats error", extra={"error": str(exc)})


async def _log_disconnected() -> None:
    log.info("nats disconnected")


async def _log_reconnected() -> None:
    log.info("nats reconnected")


def setup_retry_s(link: Link) -> float:
    """Declaring streams at start waits out an outage as long as a publish would: a service
    starting while a cluster elects its leaders must not exit."""
    return max(10.0, link.config.publish_retry_s)
