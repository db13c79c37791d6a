"""Following the Workload API's PodGroups never fails the allocator: an API server that cannot be
reached (restarting, or the client closing at shutdown) is asked again until the allocator stops."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

from services.allocator.podgroups import PodGroups
from tests.support.polling import until


async def test_an_unreachable_api_server_is_asked_again_until_the_allocator_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = Configuration(host="http://127.0.0.1:9")  # nothing listens on the discard port
    async with ApiClient(config) as api:
        changed: list[tuple[str, str]] = []
        groups = PodGroups(api, changed.append, request_timeout_s=2.0, watch_timeout_s=5)
        stop = asyncio.Event()
        with caplog.at_level(logging.WARNING, logger="tangram.allocator.kubernetes"):
            task = asyncio.create_task(groups.follow(stop))

            def asked_twice() -> bool:
                return (
                    sum("cannot tell whether PodGroups are served" in r.message for r in caplog.records) >= 2
                )

            await until("PodGroups asked again after a failure", asked_twice, 60)
            assert not task.done()
            stop.set()
            await asyncio.wait_for(task, 30)
        assert task.exception() is None and groups.version is None and changed == []


async def test_a_server_that_serves_no_pod_groups_leaves_the_task_waiting_for_the_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """1.34 serves no PodGroups: nothing is followed, and the task lasts until the bridge stops
    (a bridge task that ended early would wake the bridge's wait over and over)."""

    async def not_found(request: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "code": 404}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", not_found)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with ApiClient(Configuration(host=f"http://127.0.0.1:{port}")) as api:
            groups = PodGroups(api, lambda key: None, request_timeout_s=2.0, watch_timeout_s=5)
            stop = asyncio.Event()
            with caplog.at_level(logging.INFO, logger="tangram.allocator.kubernetes"):
                task = asyncio.create_task(groups.follow(stop))

                def said_none() -> bool:
                    return any("serves no PodGroups" in r.message for r in caplog.records)

                await until("the server found to serve no PodGroups", said_none, 30)
                assert not task.done() and groups.version is None
                stop.set()
                await asyncio.wait_for(task, 30)
    finally:
        await runner.cleanup()
