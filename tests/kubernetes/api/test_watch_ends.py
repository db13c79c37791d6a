"""A watch the follower leaves while the API server still streams it is dropped at once: closed
politely over TLS, its socket would stay open until the server's close_notify came back (up to
30 s), past its client's close, and be left to the garbage collector."""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any

import pytest
from kubernetes_asyncio.client import CoreV1Api

from tangram.kubernetes.api import call
from tangram.kubernetes.api.watching import AbandoningWatch, list_then_watch
from tangram.local.controlplane import ControlPlane
from tests.support.polling import until


def open_to(port: int) -> list[str]:
    """This loop's sockets to `port` that are not closed or closing."""
    transports = getattr(asyncio.get_running_loop(), "_transports", {})
    return [
        repr(t)
        for t in list(transports.values())
        if t is not None and not t.is_closing() and (t.get_extra_info("peername") or ("", 0))[1] == port
    ]


@pytest.mark.controlplane
async def test_a_cancelled_watch_leaves_no_socket_open(controlplane: ControlPlane, unique: str) -> None:
    port = urllib.parse.urlsplit(controlplane.server).port
    assert port is not None
    api = await controlplane.client()  # its own client: the watch's connection is its only one
    try:
        core = CoreV1Api(api)
        seen: list[str] = []
        watching = asyncio.Event()

        async def relist() -> str:
            listed = await call("list namespaces", core.list_namespace())
            watching.set()  # the watch starts from this listing: what comes after, it streams
            return str(listed.metadata.resource_version)

        async def on_change(kind: str, obj: dict[str, Any]) -> None:
            seen.append(obj["metadata"]["name"])

        stop = asyncio.Event()
        watch = asyncio.create_task(
            list_then_watch(
                "namespaces",
                relist,
                core.list_namespace,
                on_change,
                stop,
                watch_timeout_s=300,
                request_timeout_s=10,
            )
        )
        other = await controlplane.client()
        try:
            await asyncio.wait_for(watching.wait(), 60)
            await call("create namespace", CoreV1Api(other).create_namespace({"metadata": {"name": unique}}))

            async def streaming() -> bool:
                return unique in seen

            await until("the watch streaming", streaming, 30)
            assert len(open_to(port)) >= 1  # the watch's own connection, and the other client's
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
            await other.close()
            assert open_to(port) == []
        finally:
            await other.close()
            await call("delete namespace", CoreV1Api(api).delete_namespace(unique))
    finally:
        await api.close()


class _Transport:
    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


class _Response:
    """What AbandoningWatch reads of aiohttp's response: its body's end, and its connection."""

    def __init__(self, at_eof: bool) -> None:
        self.transport = _Transport()
        self.connection = self
        self.content = self
        self._eof = at_eof
        self.released = False

    def at_eof(self) -> bool:
        return self._eof

    def release(self) -> None:
        self.released = True


@pytest.mark.parametrize(("streaming", "aborted"), [(True, True), (False, False)])
async def test_only_a_stream_left_unfinished_is_aborted(streaming: bool, aborted: bool) -> None:
    stream = AbandoningWatch(return_type="object")
    response = _Response(at_eof=not streaming)
    stream.resp = response
    await stream.close()
    # a stream read to its end goes back to the pool politely; one left mid-stream is cut
    assert (response.transport.aborted, response.released) == (aborted, True)


async def test_an_event_asked_for_as_a_plain_object_is_parsed_once() -> None:
    """The object is the parsed JSON itself (not serialized and parsed again), and the watch still
    follows the resourceVersion it carries."""
    watch = AbandoningWatch(return_type="object")
    client = watch._api_client

    class NoSecondPass:
        def deserialize(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the event's object was deserialized a second time")

    watch._api_client = NoSecondPass()
    line = (
        '{"type": "MODIFIED", "object": {"kind": "Pod", "metadata": {"name": "p", "resourceVersion": "42"}}}'
    )
    event = watch.unmarshal_event(line, "object")
    assert event["type"] == "MODIFIED"
    assert event["object"] == {"kind": "Pod", "metadata": {"name": "p", "resourceVersion": "42"}}
    assert event["raw_object"] is event["object"]
    assert watch.resource_version == "42"
    await client.close()
