"""List, then watch from the list's resourceVersion; list again whenever the watch ends.

The one way Tangram follows a kind of object in the API server (the allocator's claim bridge, the
admission webhook's gate keeper, discovery's ResourceSlice publisher): a watch that expires, breaks
or is refused ("too old resource version") costs a new listing after a growing delay, never the
follower.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio.watch import Watch

from tangram.kubernetes.api.client import WATCH_ERRORS, relist_delay

log = logging.getLogger("tangram.kubernetes.api")

OnChange = Callable[[str, dict[str, Any]], Awaitable[None]]


async def list_then_watch(
    what: str,
    relist: Callable[[], Awaitable[str]],
    watch_call: Callable[..., Any],
    on_change: OnChange,
    stop: asyncio.Event,
    *,
    watch_timeout_s: int,
    request_timeout_s: float,
) -> None:
    """`relist` lists the kind and returns the list's resourceVersion; `watch_call` is the same
    list call, which the watch streams; `on_change(type, object)` gets every change with an object
    (ADDED, MODIFIED, DELETED), in order."""
    failures = 0
    while not stop.is_set():
        try:
            version = await relist()
            failures = 0
            async with AbandoningWatch(return_type="object") as stream:
                async for change in stream.stream(
                    watch_call,
                    resource_version=version,
                    allow_watch_bookmarks=False,
                    timeout_seconds=watch_timeout_s,
                    _request_timeout=watch_timeout_s + request_timeout_s,
                ):
                    obj = change["raw_object"]
                    if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict):
                        await on_change(str(change["type"]), obj)
        except WATCH_ERRORS as error:
            failures += 1
            delay = relist_delay(failures)
            log.warning(
                f"{what} watch ended; listing again",
                extra={"error": f"{type(error).__name__}: {error}", "retry_in_s": delay},
            )
            await asyncio.sleep(delay)


class AbandoningWatch(Watch):  # type: ignore[misc]  # kubernetes_asyncio is untyped
    """A watch whose stream, left while the API server still streams it (cancelled, or broken), is
    dropped at once. Closed politely, TLS would wait for the server's close_notify, which a server
    busy streaming may not send for up to asyncio's 30 s shutdown timeout: the socket would stay
    open past its client's close and be left to the garbage collector."""

    def unmarshal_event(self, data: str | bytes, response_type: str | None) -> Any:
        # Asked for plain objects, the parsed JSON is the object: the base class would serialize it
        # and parse it once more, per event, which a bridge following thousands of pods pays for.
        return super().unmarshal_event(data, None if response_type == "object" else response_type)

    async def close(self) -> None:
        response = self.resp
        if response is not None and not response.content.at_eof():
            connection = response.connection
            transport = connection.transport if connection is not None else None
            if transport is not None:
                transport.abort()
        await super().close()
