"""Following the Workload API's PodGroups never fails the allocator: an API server that cannot be
reached (restarting, or the client closing at shutdown) is asked again until the allocator stops."""

from __future__ import annotations

import asyncio
import logging

import pytest
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
