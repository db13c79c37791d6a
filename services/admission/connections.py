"""The webhook's HTTPS listener, with bounds on its TCP connections.

Only kube-apiservers need to reach the webhook, but anything that can reach its Service can open
connections to it, and asyncio's TLS server (`loop.create_server(ssl=...)`) spends about 300 KB on
each from the moment of the accept: its `asyncio.sslproto.SSLProtocol` allocates and zero-fills a
256 KiB read buffer when it is made, before the client has sent a byte. That memory did not come
back after the connections closed either: once the first such buffer is freed, glibc raises its
mmap threshold above its size and serves the next ones from its heap, which it keeps while OpenSSL's
smaller allocations sit among them. 1,000 idle connections grew the webhook by ~300 MB for good,
and nothing closed them: asyncio's handshake timeout is 60 s, aiohttp's keep-alive timer 3,630 s,
and there was no limit on their number.

`BoundedSite` accepts connections itself instead of through `loop.create_server(ssl=...)`:

- a connection costs a socket and a task (a few KB) until its client sends its first bytes; only
  then, and only if they begin a TLS handshake, is the TLS layer with its buffer made, so
  connections that stay idle, or leave, or speak plain HTTP cost little and leave nothing behind;
- a connection whose TLS handshake has not completed `handshake_timeout_s` after the accept
  (whether its client sent nothing or stalled in the middle) is closed;
- at most `max_connections` are open at once, counted from the accept to the close (in the
  handshake or after it): one accepted beyond that is closed at once, so the memory and file
  descriptors the webhook spends on connections stay bounded whatever its clients do;
- after the handshake, aiohttp serves the connection; its keep-alive timer (`idle_timeout_s`),
  started at the handshake and after every answer and not extended by bytes that arrive, closes a
  connection that has not sent a complete request head in time: an idle one, and one that stalls
  in the middle of a head;
- the `AdmissionServer` bounds the time to read a request's body (`body_timeout_s`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import Counter, Gauge

log = logging.getLogger("tangram.admission")

OPEN_CONNECTIONS = Gauge(
    "tangram_admission_connections",
    "TCP connections open to the webhook's HTTPS port, those still in their TLS handshake included",
)
CLOSED_BY_BOUND = Counter(
    "tangram_admission_connections_closed_total",
    "Connections the webhook refused or closed on a bound: limit (accepted while max_connections "
    "were open, closed at once), handshake (no TLS handshake within the handshake timeout), body "
    "(a request's body not read within the body timeout); idle keep-alive connections closed by the "
    "idle timeout are routine and not counted",
    ["bound"],
)
for _bound in ("limit", "handshake", "body"):
    CLOSED_BY_BOUND.labels(_bound)  # exported as 0 before the first, so rates work from the start

_ACCEPT_RETRY_DELAY_S = 1.0


@dataclass(frozen=True)
class ConnectionBounds:
    """How long a connection may take, and how many may be open.

    The defaults leave real clients far inside every bound: a kube-apiserver completes its TLS
    handshake in milliseconds, sends its review at once (it waits at most the webhook's
    `timeoutSeconds`, 5 s in the chart, for the answer) and keeps a small pool of keep-alive
    connections per webhook replica.
    """

    # From the accept to the end of the TLS handshake: a client sends its ClientHello at once and
    # completes the handshake in a few round trips; 5 s leaves room for a slow network or a loaded
    # API server and still frees a connection that never handshakes long before asyncio's own 60 s.
    handshake_timeout_s: float = 5.0
    # From the handshake or the last answer to the next complete request head: an idle keep-alive
    # connection, or one stalled in a head, is closed after 30 s. A client that finds its idle
    # connection closed opens another for its next review at the cost of one handshake; aiohttp's
    # own default (3,630 s) would let idle connections pile up for an hour.
    idle_timeout_s: float = 30.0
    # From the request head to its whole body (at most max_body_bytes, 4 MiB by default): the API
    # server sends the body with the head and gives up on the webhook after its timeoutSeconds
    # (5 s in the chart), so a body still arriving after 10 s has no one waiting for the answer.
    body_timeout_s: float = 10.0
    # Open connections, in their handshake or after it. One that never sends costs a few KB, one
    # with its TLS layer (made when its client sends) about 300 KB: 400 of those add ~120 MB to the
    # ~115 MB the webhook's server holds at rest, inside the chart's 256 Mi limit. A few
    # kube-apiservers, each with a pool of connections to each replica, need far fewer; a client
    # that opens more only gets closed.
    max_connections: int = 400


class _Slot:
    """One counted connection; released once, however many ways it ends."""

    __slots__ = ("_released", "_site")

    def __init__(self, site: BoundedSite) -> None:
        self._site = site
        self._released = False
        site.open_connections += 1
        OPEN_CONNECTIONS.inc()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._site.open_connections -= 1
            OPEN_CONNECTIONS.dec()


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind TLS; releases the connection's slot when the
    connection is lost (asyncio reports the loss to the application's protocol only once its
    handshake completed: until then `BoundedSite._serve` releases it)."""

    def __init__(self, inner: asyncio.Protocol, slot: _Slot) -> None:
        self._inner = inner
        self._slot = slot

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self._inner.connection_lost(exc)
        finally:
            self._slot.release()


class BoundedSite(web.BaseSite):
    """An aiohttp site serving HTTPS on `host`:`port` within `bounds` (see the module's doc)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        tls: ssl.SSLContext,
        bounds: ConnectionBounds,
        *,
        # connections the kernel completes before this accepts them: with aiohttp's 128, a burst
        # (API servers reconnecting, or a flood) that outpaces the accepts by more has its TCP
        # handshakes dropped and retried a second later; those beyond max_connections are closed
        # as soon as accepted anyway. The kernel caps it at net.core.somaxconn.
        backlog: int = 1024,
    ) -> None:
        super().__init__(runner, ssl_context=tls, backlog=backlog)
        self._host = host
        self._port = port
        self._tls = tls
        self._bounds = bounds
        self._listeners: list[socket.socket] = []
        self._accepting: list[asyncio.Task[None]] = []
        self._handshakes: set[asyncio.Task[None]] = set()
        self.open_connections = 0

    @property
    def name(self) -> str:
        return f"https://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        """The port listened on (the one picked when asked for 0)."""
        return int(self._listeners[0].getsockname()[1]) if self._listeners else self._port

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(
            self._host, self._port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        try:
            for family, _, _, _, address in dict.fromkeys(infos):
                listener = socket.create_server(address, family=family, backlog=self._backlog)
                self._listeners.append(listener)
                listener.setblocking(False)
        except OSError:
            for listener in self._listeners:
                listener.close()
            self._listeners.clear()
            raise
        self._accepting = [asyncio.create_task(self._accept(listener)) for listener in self._listeners]

    async def stop(self) -> None:
        for task in self._accepting:
            task.cancel()
        await asyncio.gather(*self._accepting, return_exceptions=True)
        self._accepting = []
        for listener in self._listeners:
            listener.close()
        # connections still in their handshake have no request to finish: closed now; the runner
        # then lets the served ones finish their requests
        for task in self._handshakes:
            task.cancel()
        await asyncio.gather(*self._handshakes, return_exceptions=True)
        await super().stop()

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                connection, _ = await loop.sock_accept(listener)
            except ConnectionAbortedError:
                continue  # the client gave up before the accept
            except OSError as error:
                # out of file descriptors or memory, most likely: retried after a pause, not in a
                # tight loop (asyncio's own server pauses the same way)
                log.error("cannot accept connections, retrying", extra={"why": str(error)})
                await asyncio.sleep(_ACCEPT_RETRY_DELAY_S)
                continue
            if self.open_connections >= self._bounds.max_connections:
                CLOSED_BY_BOUND.labels("limit").inc()
                connection.close()
                continue
            slot = _Slot(self)
            task = asyncio.create_task(self._serve(connection, slot))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _serve(self, connection: socket.socket, slot: _Slot) -> None:
        """Waits for the client's first bytes, then hands the connection to TLS and aiohttp; the
        connection is closed, and its slot released, unless its handshake completes in time."""
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None  # a BaseSite is made after the runner's setup
        handed_over = False

        def protocol() -> asyncio.Protocol:
            nonlocal handed_over
            # from here the transport asyncio makes owns the socket and closes it
            handed_over = True
            return _Counted(server(), slot)

        try:
            async with asyncio.timeout(self._bounds.handshake_timeout_s):
                await _readable(loop, connection)
                if not _starts_tls(connection):
                    # the client left (or sent something other than a TLS handshake) without a TLS
                    # layer made for it: a thousand clients that connect and leave cost nothing
                    self._failed(connection, slot, handed_over)
                    return
                await loop.connect_accepted_socket(
                    protocol,
                    connection,
                    ssl=self._tls,
                    ssl_handshake_timeout=self._bounds.handshake_timeout_s,
                )
        except TimeoutError:
            CLOSED_BY_BOUND.labels("handshake").inc()
            self._failed(connection, slot, handed_over)
        except OSError:
            # the client left, or its TLS was refused (ssl.SSLError): nothing to log, as asyncio's
            # own server does not log these either
            self._failed(connection, slot, handed_over)
        except BaseException:
            self._failed(connection, slot, handed_over)
            raise

    @staticmethod
    def _failed(connection: socket.socket, slot: _Slot, handed_over: bool) -> None:
        if not handed_over:
            connection.close()
        slot.release()


_TLS_HANDSHAKE_RECORD = 0x16  # the content type of the record that carries a ClientHello


def _starts_tls(connection: socket.socket) -> bool:
    """Whether the bytes waiting on `connection` begin a TLS handshake; they stay to be read."""
    try:
        first = connection.recv(1, socket.MSG_PEEK)
    except (BlockingIOError, InterruptedError):
        return True  # readable but nothing to peek after all: TLS decides, within the timeout
    except OSError:
        return False
    return first == bytes([_TLS_HANDSHAKE_RECORD])


async def _readable(loop: asyncio.AbstractEventLoop, connection: socket.socket) -> None:
    """Until `connection` has bytes (or an end of file) to read; reads nothing."""
    ready: asyncio.Future[None] = loop.create_future()
    fd = connection.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(fd)
